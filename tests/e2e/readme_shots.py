"""README screenshots: every page of the app after one real action on a workspace's zoo (the default pico zoo
for the README), in headless Chromium at 1400 × 1000 px, the server started as the README starts it.

    FORGETLAB_HOME=/tmp/shots .venv/bin/forgetlab zoo build --preset pico
    .venv/bin/python -m tests.e2e.readme_shots /tmp/shots docs/screenshots [models,forgetting,...]

Runs and merges made by the actions land in that workspace.
"""
import sys
import time
from pathlib import Path
from tests.e2e import harness
from tests.e2e.harness import (streamlit_server, chromium, goto, click_nav, wait_idle, count, PLOT, exceptions,
                               screenshot)
from tests.e2e.actions import _fill_all, _click, _charts_at_least
from forgetlab.ui.navigation import existing_pages

harness.VIEWPORT = {"width": 1400, "height": 1000}


def models(page):
    from tests.e2e.harness import wait_jobs
    wait_jobs(page, 600)                                # the task vectors, read in the background
    # absolute ‖τ‖ instead of relative (the radio's option, not a chart's "norm" axis title)
    page.locator('[data-testid="stRadio"] label').filter(has_text="norm").filter(
        has_not_text="relative").first.click()
    wait_idle(page)
    return _charts_at_least(page, 3), 0


def linearity(page):
    _fill_all(page, {"samples": "16"})
    _click(page, "Compute scores")
    return _charts_at_least(page, 1), 0


def forgetting(page):
    page.get_by_text("FAPM pruning curve (+ ablations)", exact=True).click(); wait_idle(page)
    _fill_all(page, {"pruning ratios": "0, 0.5, 0.8, 0.9, 0.95, 1"})
    _click(page, "Run sweep")
    return _charts_at_least(page, 2), 0


def features(page):
    _fill_all(page, {"samples per task": "20", "perplexity": "10"})
    _click(page, "Map features")
    return _charts_at_least(page, 1), 0


def merge(page):
    _click(page, "Merge and compare")               # the page's default: the three fine-tunes, three methods
    return _charts_at_least(page, 1), 0


def finetune(page):
    page.get_by_text("comparison", exact=True).click(); wait_idle(page)
    _click(page, "Fine-tune")                       # the default comparison (five runs, about half a minute)
    return _charts_at_least(page, 1), 0


def runs(page):
    return _charts_at_least(page, 1), 0


ACTIONS = dict(models=models, linearity=linearity, forgetting=forgetting, features=features, merge=merge,
               finetune=finetune, runs=runs)


def main(home: str, out: Path, only: list[str] | None = None) -> None:
    """Screenshot every page (or those in `only`) of the app on workspace `home` into `out`/<page>.png."""
    out.mkdir(parents=True, exist_ok=True)
    pages = existing_pages(harness.ROOT / "pages")
    with streamlit_server(harness.ROOT / "app.py", env={"FORGETLAB_HOME": home}, log=Path(home) / "server.log") as url, \
            chromium() as page:
        goto(page, url, timeout=300)
        for spec in pages:
            if (only and spec.stem not in only) or spec.stem not in ACTIONS:
                continue
            click_nav(page, spec.title, timeout=300)
            t = time.monotonic()
            try:
                ACTIONS[spec.stem](page)
            except Exception as exc:
                print(spec.stem, "action failed:", str(exc)[:300])
            if count(page, PLOT):
                page.locator(PLOT).first.evaluate("e => e.scrollIntoView({block: 'center'})")
            page.wait_for_timeout(1500)
            screenshot(page, spec.stem, out)
            print(spec.stem, f"{time.monotonic() - t:.1f}s", count(page, PLOT), "charts", exceptions(page)[:1], flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3].split(",") if len(sys.argv) > 3 else None)
