"""Every page's main action in Chromium on tiny pools of other decoder families (tests/architectures.py), as a user
who brings their own model meets the app: a workspace whose zoo/ holds one tiny pool per family (base + two
fine-tunes, made by tests/conftest.make_tiny_pool), the app started as the README starts it with that pool chosen
(FORGETLAB_POOL), each page opened from the sidebar and its main button pressed with the end-to-end test's
settings (tests/e2e/actions.py). Prints, per family and page, the seconds and the charts drawn, and fails on any
exception shown in the page.

    python bench/architectures_walk.py [--families phi3,mixtral,…] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import make_tiny_pool  # noqa: E402
from tests.e2e.actions import action_for  # noqa: E402
from tests.e2e.harness import PLOT, chromium, click_nav, count, exceptions, goto, screenshot, streamlit_server  # noqa: E402,E501


def walk(family: str, out: Path) -> list[str]:
    """Open every page on a tiny `family` pool and press its main button; the report lines."""
    from forgetlab.ui.navigation import existing_pages

    home = out / family
    pool = make_tiny_pool(home / "zoo" / f"{family}-tiny", family)
    lines = []
    log = home / "streamlit.log"
    env = {"FORGETLAB_HOME": str(home), "FORGETLAB_POOL": str(pool.pool_yaml)}
    with streamlit_server(ROOT / "app.py", env=env, log=log) as url, chromium() as page:
        goto(page, url)
        for spec in existing_pages(ROOT / "pages"):
            click_nav(page, spec.title)
            t0 = time.monotonic()
            error = ""
            try:
                needed = action_for(spec.stem)(page)
            except Exception as exc:     # a timeout: report it with what the page shows
                needed, error = -1, f"{type(exc).__name__}: {str(exc)[:300]}"
            found = count(page, PLOT)
            raised = exceptions(page)
            screenshot(page, f"{family}-{spec.stem}", out / "shots")
            ok = not raised and not error and found >= needed
            lines.append(f"{family:12s} {spec.stem:12s} {time.monotonic() - t0:6.1f} s  {found} chart(s)  "
                         f"{'ok' if ok else 'FAILED ' + (error or str(raised)[:300])}")
            print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="phi3,gpt_neox,gemma2,mixtral")
    ap.add_argument("--out", default="/tmp/forgetlab-architectures-walk")
    args = ap.parse_args()
    out = Path(args.out)
    print(f"load at the start: {os.getloadavg()[0]:.2f}", flush=True)
    lines = [line for fam in args.families.split(",") for line in walk(fam, out)]
    print(f"load at the end: {os.getloadavg()[0]:.2f}")
    sys.exit(1 if any("FAILED" in line for line in lines) else 0)


if __name__ == "__main__":
    main()
