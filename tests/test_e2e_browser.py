"""End to end, in a real browser: `streamlit run app.py` on the tiny pico zoo, every page, one action each.

Needs Debian's Chromium (tools/install_browser.sh) and the Python `playwright` package; skipped otherwise.
Screenshots go to docs/screenshots/. All waits are bounded (pytest-timeout caps the whole test too).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.e2e.actions import action_for
from tests.e2e.harness import CHROMIUM, EXCEPTION, PLOT, ROOT, chromium, click_nav, count, exceptions, goto, \
    screenshot, streamlit_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

if not os.path.exists(CHROMIUM):
    pytest.skip("Chromium is not installed: run tools/install_browser.sh", allow_module_level=True)
pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def app_home(request, tmp_path_factory) -> Path:
    """A fresh workspace whose zoo/ is the session's pico zoo (runs and merges land here, not there)."""
    import forgetlab.zoo

    if not hasattr(forgetlab.zoo, "build"):
        pytest.skip("forgetlab.zoo.build is not available yet")
    pico_zoo = request.getfixturevalue("pico_zoo")
    home = tmp_path_factory.mktemp("e2e-home")
    zoo_root = Path(pico_zoo.pool_yaml).parent.parent
    (home / "zoo").symlink_to(zoo_root, target_is_directory=True)
    return home


def test_every_page_renders_runs_its_action_and_shows_charts(app_home, tmp_path):
    from forgetlab.ui.navigation import existing_pages

    pages = existing_pages(ROOT / "pages")
    stems = [p.stem for p in pages]
    assert stems[-1] == "runs"
    log = tmp_path / "streamlit.log"
    report = []
    with streamlit_server(ROOT / "app.py", env={"FORGETLAB_HOME": str(app_home)}, log=log) as url, \
            chromium() as page:
        goto(page, url)
        assert page.locator('[data-testid="stSidebarNav"] a').count() == len(stems)
        for spec in pages:
            stem = spec.stem
            t_load = click_nav(page, spec.title)
            assert page.locator("h1").first.is_visible(), f"{stem}: no title"
            assert not exceptions(page), f"{stem} raised on load: {exceptions(page)}"
            t0 = time.monotonic()
            needed = action_for(stem)(page)
            t_action = time.monotonic() - t0
            found = count(page, PLOT)
            errors = exceptions(page)
            screenshot(page, stem)
            report.append(f"{stem}: load {t_load:.1f} s, action {t_action:.1f} s, {found} chart(s)")
            assert not errors, f"{stem} raised after its action: {errors}\n{log.read_text()[-3000:]}"
            assert found >= needed, f"{stem}: {found} chart(s), expected at least {needed}"
        # a page switch keeps the session's results: back to the first page, its charts are still there
        click_nav(page, pages[0].title)
        assert count(page, PLOT) >= 1 and page.locator(EXCEPTION).count() == 0
    print("\n".join(report))
