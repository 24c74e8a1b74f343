"""Every paper study's default action in Chromium, on the app as the README starts it: for each page with studies,
pick each study under **Paper studies**, press **Run the study** with its defaults, wait for its figure and check
the takeaway holds the claim and the saved measurement (tests/e2e/studies.py, the e2e test's own steps).

    FORGETLAB_HOME=… python bench/studies_walk.py [--home DIR] [--study NAME[,NAME…]]

The workspace must hold the pico demo zoo (zoo/pico, built by the README's first command). Prints each study's
seconds from the click to its drawn figure, its measurement, and the load average at the start and the end.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.harness import chromium, click_nav, goto, streamlit_server, wait_jobs  # noqa: E402
from tests.e2e.studies import PAGE_TITLES, run_study  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=os.environ.get("FORGETLAB_HOME"), help="the workspace (with zoo/pico)")
    ap.add_argument("--study", default=None, help="only these studies (comma-separated)")
    args = ap.parse_args()
    from forgetlab.analysis.study import studies

    home = Path(args.home).resolve()
    wanted = set(args.study.split(",")) if args.study else None
    log = home / "studies_walk.log"
    print(f"load at the start: {os.getloadavg()[0]:.2f}", flush=True)
    with streamlit_server(ROOT / "app.py", env={"FORGETLAB_HOME": str(home)}, log=log) as url, chromium() as page:
        goto(page, url)
        wait_jobs(page, 900)
        for stem, title in PAGE_TITLES.items():
            found = [a for a in studies(stem) if wanted is None or a.study.name in wanted]
            if not found:
                continue
            click_nav(page, title)
            for analysis in found:
                t0 = time.monotonic()
                try:
                    seconds, text, shot = run_study(page, home, analysis, 900.0, log)
                    print(f"{analysis.study.name}: {seconds:.1f} s · {shot}\n    {text}", flush=True)
                except AssertionError as exc:
                    print(f"{analysis.study.name}: FAILED after {time.monotonic() - t0:.1f} s: {exc}", flush=True)
    print(f"load at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
