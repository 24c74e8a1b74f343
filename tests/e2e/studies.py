"""Run a paper study from its page in the browser (forgetlab.ui.studies), as tests/test_e2e_studies.py and
bench/studies_walk.py do: pick it under **Paper studies**, press **Run the study** with its defaults, wait for its
figure, and read the takeaway beside the verdict its saved run holds."""
from __future__ import annotations

import json
import time
from pathlib import Path

from tests.e2e.harness import count, exceptions, screenshot, wait_for, wait_idle, wait_jobs

PAGE_TITLES = {"finetune": "Fine-tune", "merge": "Merge", "linearity": "Linearity", "forgetting": "Forgetting"}


def pick(page, key: str, option: str) -> None:
    """Choose `option` (the start of its label) in the select box `key` (its list opens from the keyboard)."""
    page.locator(f".st-key-{key} input[role='combobox']").first.click()
    page.keyboard.press("ArrowDown")
    page.locator("[role='option']").filter(has_text=option).first.click()
    wait_idle(page, 60)


def newest_study_run(home: Path, name: str) -> dict:
    """results.json of the newest saved run of the study `name` in the workspace `home`."""
    runs = sorted(p for p in (home / "runs").iterdir()
                  if json.loads((p / "recipe.json").read_text()).get("kind") == f"study-{name}")
    assert runs, f"the study {name} saved no run"
    return json.loads((runs[-1] / "results.json").read_text())


def run_study(page, home: Path, analysis, job_timeout: float, log: Path | None = None) -> tuple[float, str, str]:
    """Run one study from its page (the page already open) with its defaults; checks that its figure is drawn,
    that nothing raised, and that the takeaway holds the claim and the saved run's measurement. Returns (seconds,
    the takeaway's text, the screenshot's path)."""
    name = analysis.study.name
    key = f"study_{name.replace('-', '_')}"
    pick(page, f"{analysis.study.page}_study_pick", name)
    t0 = time.monotonic()
    page.locator(f".st-key-{key}_run").get_by_role("button").first.click()
    page.wait_for_timeout(300)
    wait_idle(page, job_timeout)
    wait_jobs(page, job_timeout)
    try:
        wait_for(page, lambda: count(page, f".st-key-{key}_figure_0 .js-plotly-plot") > 0, 60,
                 f"the figure of {name}")
    finally:
        shot = screenshot(page, f"study-{name}")
    seconds = time.monotonic() - t0
    assert not exceptions(page), f"{name}: {exceptions(page)}\n{log.read_text()[-3000:] if log else ''}"
    text = page.locator(f".st-key-{key}_takeaway").first.inner_text()
    verdict = newest_study_run(home, name)["verdict"]
    assert analysis.study.claim[:60] in text, f"{name}: the claim is not beside the measurement: {text!r}"
    assert verdict["measured"][:60] in text, f"{name}: {text!r} lacks the saved measurement"
    return seconds, text, str(shot)
