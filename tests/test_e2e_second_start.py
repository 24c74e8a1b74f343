"""The second start, in a real browser: `streamlit run app.py` as the README says, on a workspace whose demo zoo
is already built — what every user does after the first day.

On the first start the app builds the zoo itself, and that build's first training step initialises process-wide
state (the thread governor's one-time probe) with gradients on. On every later start nothing builds, so the
first job the user runs initialises it: the Linearity button once crashed there ("element 0 of tensors does not
require grad") while the first-start walk stayed green. So here each page's main button, with its defaults, is
the first job of a freshly started server, opened by the page's own address as a bookmark would open it.

Needs Debian's Chromium (tools/install_browser.sh) and the Python `playwright` package; skipped otherwise.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.e2e.actions import CHART_TIMEOUT
from tests.e2e.harness import CHROMIUM, PLOT, ROOT, alerts, chromium, count, exceptions, goto, screenshot, \
    streamlit_server, wait_for, wait_idle, wait_jobs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

if not os.path.exists(CHROMIUM):
    pytest.skip("Chromium is not installed: run tools/install_browser.sh", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

JOB_TIMEOUT = 300.0
# every page whose main button starts a job (Runs and Glossary start none)
JOB_PAGES = ("models", "linearity", "forgetting", "attribution", "text", "features", "merge", "finetune", "sequence")


@pytest.fixture(scope="module")
def built_workspace(request, tmp_path_factory) -> Path:
    """A workspace whose zoo/ is the session's (already built) tiny pico zoo, as on a user's second start."""
    pico_zoo = request.getfixturevalue("pico_zoo")
    home = tmp_path_factory.mktemp("second-start-home")
    (home / "zoo").symlink_to(Path(pico_zoo.pool_yaml).parent.parent, target_is_directory=True)
    return home


@pytest.mark.parametrize("stem", JOB_PAGES)
def test_each_pages_main_button_as_the_first_job_of_a_second_start(built_workspace, tmp_path, stem):
    env = {"FORGETLAB_HOME": str(built_workspace), "FORGETLAB_AUTO_ZOO": "1"}   # as users have it: no build is due
    log = tmp_path / "streamlit.log"
    with streamlit_server(ROOT / "app.py", env=env, log=log) as url, chromium() as page:
        goto(page, f"{url}/{stem}")
        assert not exceptions(page), f"{stem} raised on load: {exceptions(page)}"
        button = page.locator('[data-testid="stMain"] [data-testid="stBaseButton-primary"]').first
        label = button.inner_text().strip()
        t0 = time.monotonic()
        button.click()
        page.wait_for_timeout(300)
        wait_idle(page, JOB_TIMEOUT)
        wait_jobs(page, JOB_TIMEOUT)
        took = time.monotonic() - t0
        screenshot(page, f"second-start-{stem}")
        failures = [a for a in alerts(page) if "Unexpected error" in a] + exceptions(page)
        assert not failures, f"{stem}: '{label}' failed on a second start: {failures}\n{log.read_text()[-3000:]}"
        try:   # plotly draws in the browser after the page's last rerun: a reused result can end the job first
            wait_for(page, lambda: count(page, PLOT) >= 1, CHART_TIMEOUT, "a chart")
        except TimeoutError:
            pytest.fail(f"{stem}: '{label}' drew no chart in {took:.0f} s (+{CHART_TIMEOUT:.0f} s for plotly); "
                        f"messages: {alerts(page)}")
