"""End to end, in a real browser: `streamlit run app.py` on the tiny pico zoo, every page, one action each.

The server is started exactly as the README says (`.venv/bin/streamlit run app.py` in the checkout, whose
`.venv` is inside it: no flags, only a free port through STREAMLIT_SERVER_PORT), so the file watcher and the
menu are the ones users get; with a page open and nothing to do, the server must stay below 10% of a core.

Needs Debian's Chromium (tools/install_browser.sh) and the Python `playwright` package; skipped otherwise.
Screenshots go to $FORGETLAB_SCREENSHOTS (set it to docs/screenshots to refresh the README's), else a temp folder. All waits are bounded (pytest-timeout caps the whole test too).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.e2e.actions import action_for
from tests.e2e.harness import CHROMIUM, EXCEPTION, NAV_LINK, PLOT, ROOT, chromium, click_nav, count, exceptions, \
    goto, idle_cpu, record_outside_requests, screenshot, streamlit_server, wait_idle, wait_jobs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# every sidebar menu entry that appears while the first page loads (a cold server: the case that flashed):
# Streamlit's automatic list of pages/ (stSidebarNavLink) and the app's own menu (st.page_link)
NAV_SEEN = """window.__navSeen = new Set();
new MutationObserver(() => document.querySelectorAll(
    '[data-testid="stSidebarNavLink"], [data-testid="stSidebar"] [data-testid="stPageLink-NavLink"]').forEach(
    a => window.__navSeen.add(a.innerText.trim()))).observe(document, {subtree: true, childList: true,
                                                                      characterData: true});"""
IDLE_SECONDS = 20.0
IDLE_LIMIT = 0.10        # share of one core the idle server may use with a page open

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
    assert "runs" in stems
    log = tmp_path / "streamlit.log"
    report = []
    with streamlit_server(ROOT / "app.py", env={"FORGETLAB_HOME": str(app_home)}, log=log) as url, \
            chromium() as page:
        page.add_init_script(NAV_SEEN)
        outside = record_outside_requests(page, url)
        # the first request of the fresh server opens a page by its own URL: until st.navigation has run once,
        # Streamlit would serve pages/ the old way (that page alone: no sidebar, no menu); require_app() reruns
        # it through app.py
        goto(page, f"{url}/{pages[-1].stem}")
        assert page.locator("h1").first.inner_text().strip() == pages[-1].title
        assert page.locator(NAV_LINK).count() == len(stems)
        assert page.locator('[data-testid="stSidebarNav"]').count() == 0     # Streamlit's own menu is off
        seen = page.evaluate("[...window.__navSeen]")
        titles = [p.title for p in pages]
        assert seen and all(any(text.endswith(t) for t in titles) for text in seen), \
            f"the sidebar listed other pages on the first load: {seen}"     # no flash of Streamlit's own menu
        idle = idle_cpu(url.pid, IDLE_SECONDS)
        report.append(f"idle server with a page open: {idle:.1%} of a core over {IDLE_SECONDS:.0f} s "
                      f"(load average {os.getloadavg()[0]:.1f})")
        assert idle < IDLE_LIMIT, (f"the idle server used {idle:.0%} of a core over {IDLE_SECONDS:.0f} s (limit "
                                   f"{IDLE_LIMIT:.0%}); its log:\n{log.read_text()[-2000:]}")
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
            if found:                       # show the result, not only the form
                page.locator(PLOT).first.evaluate("e => e.scrollIntoView({block: 'center'})")
                page.wait_for_timeout(300)
            screenshot(page, stem)
            report.append(f"{stem}: load {t_load:.1f} s, action {t_action:.1f} s, {found} chart(s)")
            assert not errors, f"{stem} raised after its action: {errors}\n{log.read_text()[-3000:]}"
            assert found >= needed, f"{stem}: {found} chart(s), expected at least {needed}"
        # a page switch keeps the session's results: back to the first page, its charts are still there
        click_nav(page, pages[0].title)
        assert count(page, PLOT) >= 1 and page.locator(EXCEPTION).count() == 0
        # reloading in the middle of a job: the page comes back usable and no saved run is lost
        saved = sorted(p.name for p in (app_home / "runs").iterdir()) if (app_home / "runs").exists() else []
        busy = next((p for p in pages if p.stem == "forgetting"), None)
        if busy is not None:
            click_nav(page, busy.title)
            page.get_by_role("button", name="Run sweep", exact=True).first.click()
            page.wait_for_timeout(700)
            page.reload(wait_until="domcontentloaded")
            wait_idle(page, 120)
            assert page.locator("h1").first.inner_text().strip() == busy.title
            assert not exceptions(page), exceptions(page)
        time.sleep(1)
        after = sorted(p.name for p in (app_home / "runs").iterdir()) if saved else []
        assert set(saved) <= set(after), "a saved run disappeared"
        # after every page and job, the server goes quiet again (no job or fragment left polling)
        wait_jobs(page, 180)
        idle = idle_cpu(url.pid, IDLE_SECONDS)
        report.append(f"idle server after every page and job: {idle:.1%} of a core over {IDLE_SECONDS:.0f} s")
        assert idle < IDLE_LIMIT, f"after the actions, the idle server used {idle:.0%} of a core"
        assert not outside, f"the app made the browser load things from other hosts: {outside}"
    print("\n".join(report))


# ------------------------------------------------------------------------------------------------ the demo script

FINETUNE_BUDGET = 120.0   # s for the Fine-tune page's default comparison (5 runs) on the tiny zoo, on a loaded CI box


@pytest.fixture
def demo_home(app_home, tmp_path) -> Path:
    """A workspace of its own (no runs yet, as on a first demo) over the same tiny pico zoo."""
    home = tmp_path / "demo-home"
    home.mkdir()
    (home / "zoo").symlink_to((app_home / "zoo").resolve(), target_is_directory=True)
    return home


def _progress_texts(page) -> list[str]:
    return page.locator('[data-testid="stProgress"]').all_inner_texts()


def test_demo_script_walk(demo_home, tmp_path):
    """Issue 29's ten-minute demo, every page with its defaults, as a presenter clicks through it: the
    trade-off carries its α labels, the Fine-tune comparison says which run it is on and ends within its
    budget, nothing is loaded from another host."""
    import re

    log = tmp_path / "streamlit.log"
    report = []
    with streamlit_server(ROOT / "app.py", env={"FORGETLAB_HOME": str(demo_home)}, log=log) as url, \
            chromium() as page:
        outside = record_outside_requests(page, url)
        goto(page, url)                                  # the first page: Models
        assert page.locator("h1").first.inner_text().strip() == "Models"

        # Forgetting: the default sweep (WiSE-FT α curve of math) shows the trade-off with an α on each point
        click_nav(page, "Forgetting")
        t0 = time.monotonic()
        page.get_by_role("button", name="Run sweep", exact=True).click()
        page.wait_for_timeout(300)
        wait_jobs(page, 300)
        report.append(f"forgetting: default sweep {time.monotonic() - t0:.1f} s")
        assert not exceptions(page), exceptions(page)
        labels = set(page.locator(f"{PLOT} .textpoint").all_text_contents())     # SVG: no innerText
        assert {"α 0", "α 0.5", "α 1"} <= labels, f"trade-off point labels: {sorted(labels)}"
        screenshot(page, "demo-forgetting")

        # Fine-tune: the default comparison, its progress naming the run, within its budget
        click_nav(page, "Fine-tune")
        assert page.get_by_role("button", name="Fine-tune", exact=True).is_visible()
        seen: set[str] = set()
        t0 = time.monotonic()
        page.get_by_role("button", name="Fine-tune", exact=True).click()
        page.wait_for_timeout(300)
        while time.monotonic() - t0 < FINETUNE_BUDGET + 60:
            texts = _progress_texts(page)
            seen.update(texts)
            if not texts and page.get_attribute('[data-testid="stApp"]', "data-test-script-state") == "notRunning":
                break
            page.wait_for_timeout(250)
        wait_jobs(page, 30)
        took = time.monotonic() - t0
        report.append(f"fine-tune: default comparison {took:.1f} s (budget {FINETUNE_BUDGET:.0f} s)")
        assert not exceptions(page), exceptions(page)
        runs = {m.group(0) for t in seen for m in [re.search(r"run (\d) of 5 · [\w.-]+", t)] if m}
        # the tiny zoo's runs last a second each: the 250 ms polls catch some of them, each naming itself
        labels = {"adamw", "mofo-0.2", "sfa-p0.25", "l2-1", "l1-0.001"}
        assert runs and all(r.split(" · ")[1] in labels for r in runs), sorted(seen)[:10]
        assert not [t for t in seen if "step " in t and "run " not in t], "a step count without its run"
        assert count(page, PLOT) >= 3, "the comparison's charts"
        assert took <= FINETUNE_BUDGET, f"the default comparison took {took:.0f} s (budget {FINETUNE_BUDGET:.0f} s)"
        screenshot(page, "demo-finetune")

        # Glossary: every term the tooltips use, found by its search (the entries are grouped in folded sections)
        click_nav(page, "Glossary")
        find = page.get_by_label("find a term")
        for term in ("NLS", "D(θ, θ0)", "FAPM", "HMA", "MoFO", "SFA", "Pareto front", "speciality", "generality"):
            find.fill(term)
            find.press("Enter")
            wait_idle(page)
            assert term in page.locator('[data-testid="stMain"]').inner_text(), term
        assert not outside, f"the app made the browser load things from other hosts: {outside}"
    print("\n".join(report))


# every element inside the claims container that scrolls or clips its content (the table shown whole has none)
CLIPPED = """(root) => [...root.querySelectorAll('*')].filter(e => {
    const s = getComputedStyle(e);
    const clips = v => v === 'auto' || v === 'scroll' || v === 'hidden';
    return (clips(s.overflowY) && e.scrollHeight > e.clientHeight + 1) ||
           (clips(s.overflowX) && e.scrollWidth > e.clientWidth + 1);
}).length"""


def test_demo_script_models_merge_and_one_general_loss(demo_home, tmp_path):
    """The rest of issue 29's demo walk: the Models page's claims table of merges, opened, whole (no inner scroll,
    no cut column), the Merge page's default ("Merge and compare": the full fine-tunes three ways) giving at least
    one merge that keeps the parents' own-task skills better than the worst parent (mean answer loss over the
    parents' tasks, from the merges' scorecards.json), and the base's general loss one number: the same in every merge's scorecards
    and equal to forgetlab.core.scorecards at the app's default budget, as the Models page shows it."""
    import json

    from forgetlab.core.pool import ModelPool
    from forgetlab.core.scorecards import pool_scorecard
    from forgetlab.ui.settings import default_budget

    pool_yaml = demo_home / "zoo" / "pico-tiny" / "pool.yaml"
    with streamlit_server(ROOT / "app.py", env={"FORGETLAB_HOME": str(demo_home)},
                          log=tmp_path / "streamlit.log") as url, chromium() as page:
        goto(page, url)
        page.get_by_text("What this zoo shows", exact=True).first.wait_for(timeout=60_000)
        wait_jobs(page, 600)                                    # the first visit's scoring, and its rerun
        merges = page.locator('[data-testid="stExpander"]', has_text="Merges:").first     # folded: open it
        merges.locator("summary").click()
        table = merges.locator('[data-testid="stTable"]').first
        table.wait_for(timeout=60_000)
        assert "measured" in table.inner_text() and table.evaluate(CLIPPED) == 0, "the claims table scrolls or is cut"
        wait_jobs(page, 300)                              # the Models page scores the zoo at the app's budget
        click_nav(page, "Merge")
        page.get_by_role("button", name="Merge and compare", exact=True).click()
        page.wait_for_timeout(300)
        wait_jobs(page, 300)
        assert not exceptions(page), exceptions(page)
        screenshot(page, "demo-merge")
    saved = [json.loads(p.read_text()) for p in sorted((demo_home / "merges").glob("*/scorecards.json"))]
    assert len(saved) == 3, "the default merges the full fine-tunes three ways"
    base_losses = set()
    kept_better = []
    for s in saved:
        cards = {c["model"]: c for c in s["cards"]}
        parents = s["parents"]
        merged = next(n for n in cards if n != "base" and n not in parents)
        base_losses.add(cards["base"]["general_loss"])

        def own(name):
            return sum(cards[name]["tasks"][t]["answer_loss"] for t in parents) / len(parents)

        kept_better.append(own(merged) < max(own(p) for p in parents))
    assert any(kept_better), "no default merge keeps the skills better than its worst parent"
    pool = ModelPool.from_yaml(pool_yaml)
    expected = pool_scorecard(pool, "base", default_budget(str(pool_yaml))).general_loss
    assert len(base_losses) == 1 and next(iter(base_losses)) == pytest.approx(expected, rel=1e-6), base_losses
