"""End to end, in a real browser (issue 45): paper studies, picked under **Paper studies** on their page of the app
served by the README's command and run with their defaults, draw their figure and say the paper's claim beside the
measurement — the measurement their saved run holds (results.json's verdict), not a fixed text.

One `streamlit run app.py` on the tiny pico zoo. To keep the suite's time, this runs one study of each page (every
page's panel, its pick, its widgets and its drawing: the one with the fewest runs); bench/studies_walk.py runs every
study the same way on the pico demo zoo (docs/studies.md).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.harness import CHROMIUM, ROOT, chromium, click_nav, goto, streamlit_server, wait_jobs
from tests.e2e.studies import PAGE_TITLES, run_study

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

if not os.path.exists(CHROMIUM):
    pytest.skip("Chromium is not installed: run tools/install_browser.sh", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

JOB = 600.0                               # s: a study's default on the tiny zoo, on a busy 2-core box
ONE_PER_PAGE = {"finetune": "mofo-partitions", "merge": "pcb-self", "linearity": "nls-draws",
                "forgetting": "fapm-relative"}


@pytest.fixture(scope="module")
def home(request, tmp_path_factory) -> Path:
    """A fresh workspace whose zoo/ is the session's tiny pico zoo (runs land here, not there)."""
    pico_zoo = request.getfixturevalue("pico_zoo")
    home = tmp_path_factory.mktemp("studies-home")
    (home / "zoo").symlink_to(Path(pico_zoo.pool_yaml).parent.parent, target_is_directory=True)
    return home


def test_a_study_of_each_page_draws_its_figure_with_the_claim_beside_the_measurement(home, tmp_path):
    from forgetlab.analysis.study import studies

    log = tmp_path / "streamlit.log"
    report = []
    with streamlit_server(ROOT / "app.py", env={"FORGETLAB_HOME": str(home)}, log=log) as url, chromium() as page:
        goto(page, url)
        wait_jobs(page, JOB)                       # the Models page scores the zoo on its first visit
        for stem, title in PAGE_TITLES.items():
            [analysis] = [a for a in studies(stem) if a.study.name == ONE_PER_PAGE[stem]]
            click_nav(page, title)
            seconds, text, _ = run_study(page, home, analysis, JOB, log)
            report.append(f"{analysis.study.name}: {seconds:.1f} s · {text}")
    print("\n".join(report))
