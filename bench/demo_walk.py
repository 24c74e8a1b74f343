"""Time issue 29's stakeholder demo as a newcomer meets it: the app started as the README says on an empty
workspace (it builds the pico zoo by itself), then every page's main action with its defaults in Chromium.

    python bench/demo_walk.py [--home DIR] [--shots DIR] [--pages Fine-tune,Merge]

Prints, in seconds from the server's start: the first page drawn, the base model ready (pool.yaml written),
the zoo complete, then each page's main action, and the load average at the start and the end. Run it from a
fresh clone after `pip install` (what the README's first command does) to time the whole walk; the clone and
install times are the shell's (`time git clone …`, `time pip install …`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.harness import (chromium, click_nav, exceptions, goto, screenshot, streamlit_server,  # noqa: E402
                               wait_idle, wait_jobs)


PAGES = ("Models", "Task vectors", "Linearity", "Forgetting", "Attribution", "Text", "Features", "Merge", "Fine-tune",
         "Sequence", "Runs", "Glossary")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", help="Workspace (default: a new empty folder).")
    ap.add_argument("--shots", help="Folder for a screenshot per page.")
    ap.add_argument("--pages", default=",".join(PAGES),
                    help="Comma-separated page titles to walk, in order (default: every page).")
    args = ap.parse_args()
    home = Path(args.home or tempfile.mkdtemp(prefix="demo-walk-"))
    home.mkdir(parents=True, exist_ok=True)
    manifest = home / "zoo" / "pico" / "manifest.json"
    env = {"FORGETLAB_HOME": str(home), "FORGETLAB_AUTO_ZOO": "1"}
    print(f"workspace {home}; load average {os.getloadavg()[0]:.1f}", flush=True)
    t0 = time.monotonic()
    with streamlit_server(ROOT / "app.py", env=env, log=home / "streamlit.log") as url, chromium() as page:
        goto(page, url)
        print(f"{time.monotonic() - t0:7.1f} s  first page drawn", flush=True)
        base_at = learning_at = None
        shots_at = [60.0, 150.0]          # the build panel, while the base pre-trains
        while True:
            m = json.loads(manifest.read_text()) if manifest.is_file() else {}
            now = time.monotonic() - t0
            if learning_at is None and page.get_by_text("the base model is learning").count():
                learning_at = now
                print(f"{learning_at:7.1f} s  the base learning shown (build panel)", flush=True)
            if args.shots and base_at is None and shots_at and now >= shots_at[0]:
                screenshot(page, f"walk-building-{int(shots_at.pop(0))}s", Path(args.shots))
            if base_at is None and (home / "zoo" / "pico" / "pool.yaml").is_file():
                base_at = time.monotonic() - t0
                print(f"{base_at:7.1f} s  base model ready (pool.yaml written)", flush=True)
            if m.get("complete"):
                print(f"{time.monotonic() - t0:7.1f} s  zoo complete (build {m.get('build_seconds')} s)", flush=True)
                break
            time.sleep(2)
        page.reload()
        page.wait_for_timeout(2000)
        for title in [t.strip() for t in args.pages.split(",") if t.strip()]:
            t = time.monotonic()
            click_nav(page, title)
            stem = {"Fine-tune": "finetune", "Task vectors": "taskvec"}.get(title, title.lower())
            primary = page.locator('[data-testid="stMain"] [data-testid="stBaseButton-primary"]')
            if title not in ("Runs", "Glossary") and primary.count():   # the page's main action, its defaults
                primary.first.click()
                page.wait_for_timeout(300)
            wait_idle(page, 600)
            wait_jobs(page, 900)
            bad = exceptions(page)
            print(f"{time.monotonic() - t0:7.1f} s  {title}: main action {time.monotonic() - t:.1f} s"
                  + (f" — EXCEPTION {bad}" if bad else ""), flush=True)
            if args.shots:
                screenshot(page, f"walk-{stem}", Path(args.shots))
    print(f"walk done in {time.monotonic() - t0:.1f} s from the server's start; load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
