"""End to end, in a real browser (issue 43, item 2): every page opens with its question in plain words (the
formulas folded under "How this is computed"), every page's main button, pressed with its defaults, ends with a
takeaway box whose number is the result's, and the Runs page reopens the newest run with its takeaway.

One `streamlit run app.py` on the tiny pico zoo serves every page. After each action the test reads what the
action saved — the run under the workspace's runs/ (results.csv / results.json), or the merges' scorecards —,
computes the largest effect there by itself (not through the takeaway functions), formats it as the sentence
does, and finds it in the box `.st-key-<page>_takeaway`.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.e2e.harness import CHROMIUM, ROOT, chromium, click_nav, count, exceptions, goto, screenshot, \
    streamlit_server, wait_for, wait_idle, wait_jobs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

if not os.path.exists(CHROMIUM):
    pytest.skip("Chromium is not installed: run tools/install_browser.sh", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

FORMULA = ("θ", "τ", "d(α)", "NLS")       # what a page's opening question must not need
JOB = 420.0                               # s: a page's default action on the tiny zoo, on a busy 2-core box


@pytest.fixture(scope="module")
def home(request, tmp_path_factory) -> Path:
    """A fresh workspace whose zoo/ is the session's tiny pico zoo (runs and merges land here, not there)."""
    pico_zoo = request.getfixturevalue("pico_zoo")
    home = tmp_path_factory.mktemp("takeaway-home")
    (home / "zoo").symlink_to(Path(pico_zoo.pool_yaml).parent.parent, target_is_directory=True)
    return home


# ------------------------------------------------------------------------------------------ what was saved

def saved_runs(home: Path) -> set[str]:
    runs = home / "runs"
    return {p.name for p in runs.iterdir()} if runs.is_dir() else set()


def new_run(home: Path, before: set[str], kind: str) -> Path:
    """The run of `kind` the action saved (the newest one not there before)."""
    found = sorted(p for p in (home / "runs").iterdir() if p.name not in before
                   and json.loads((p / "recipe.json").read_text()).get("kind") == kind)
    assert found, f"the action saved no {kind} run; runs: {sorted(saved_runs(home))}"
    return found[-1]


def table(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "results.csv")


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


# ------------------------------------------------------------------------------------------ the largest effects
# each returns the texts the takeaway must contain, computed from what the action saved

def expect_scorecards(run: Path) -> list[str]:
    cards = {c["model"]: c for c in results(run)["cards"]}
    lost = {m: c["general_loss"] - cards["base"]["general_loss"] for m, c in cards.items() if m != "base"}
    most = max(lost, key=lost.get)
    return [f"{most} forgets most: its general loss is {lost[most]:+.3f} nats"]


def expect_taskvec(run: Path) -> list[str]:
    t = table(run)
    top = t.loc[t["relative"].idxmax()]
    return [f"changed {top['model']} most", f"by {100 * top['relative']:.3g} % of the weights' size"]


def expect_linearity(run: Path) -> list[str]:
    t = table(run)
    parts = t[(t["level"] != "model") & t["nls_mean"].notna()]
    return [f"least linear part (non-linearity score, NLS, {parts['nls_mean'].max():.3f})",
            f"the most linear ({parts['nls_mean'].min():.3f})"]


def expect_sweep(run: Path) -> list[str]:
    t = table(run)
    higher = t["measure"].iloc[0] == "exact_match"
    if higher and t["speciality"].nunique() == 1:      # exact match never moves: the sentence speaks answer loss
        t, higher = t.assign(speciality=t["answer_loss"]), False
    t = t[t["speciality"].notna() & t["general_loss"].notna()].reset_index(drop=True)
    s = list(t["speciality"] if higher else -t["speciality"])
    g = list(t["general_loss"])
    front = [i for i in range(len(t)) if not any(s[j] >= s[i] and g[j] <= g[i] and (s[j] > s[i] or g[j] < g[i])
                                                for j in range(len(t)))]

    def rescaled(v, i):
        return (v[i] - min(v)) / (max(v) - min(v)) if max(v) > min(v) else 0.0

    knee = max(front, key=lambda i: (rescaled(s, i) - rescaled(g, i), -i))
    least = min(range(len(t)), key=lambda i: (g[i], i))
    said = [f"{t['series'][knee]} at α {t['x'][knee]:g}",
            f"{'exact match' if higher else 'answer loss'} {t['speciality'][knee]:.{2 if higher else 3}f}"]
    if knee != least:
        said.append(f"for {g[knee] - g[least]:+.3f} nats")
    return said


def expect_attribution(run: Path) -> list[str]:
    t = table(run)
    t = t[(t["map"] == "only_this") & (t["alpha"] == t[t["map"] == "only_this"]["alpha"].max())
          & ~t["zero_tau"].astype(bool)]
    said = [f"the most general-text loss, {t['d_general_loss'].max():+.3f} nats"]
    if t["d_speciality"].max() > 0:
        return said + [f"buys {t['d_speciality'].max():+.2f} exact match"]
    return said + ["the largest drop of its answer loss comes from", f": {t['d_answer_loss'].min():+.3f} nats"]


def expect_text(run: Path) -> list[str]:
    return [f"rises by {results(run)['summary']['mean_rise']:+.4f} nats per token"]


def expect_features(run: Path) -> list[str]:
    t = table(run)
    top = t.loc[t["mean_distance_pca"].idxmax()]
    return [f"furthest apart in the {top['model']} model: {top['mean_distance_pca']:.3g} on average"]


def expect_finetune(run: Path) -> list[str]:
    said = []
    for r in results(run)["runs"]:
        lost = r["final"]["general_loss"] - r["start_card"]["general_loss"]
        said.append(f"{r['config']['label']} {lost:+.3f} nats")
    return said


def expect_merges(home: Path, text: str) -> list[str]:
    """The merge that keeps most of its parents' own-task gains (in the measure the sentence names), with its
    mean retention in % and its forgetting in nats, from the merges' scorecards.json."""
    measure = "exact_match" if "in exact match" in text else "answer_loss"

    def s(card, task):
        t = card["tasks"][task]
        return t["exact_match"] if measure == "exact_match" else -t["answer_loss"]

    kept = {}
    for path in (home / "merges").glob("*/scorecards.json"):
        saved = json.loads(path.read_text())
        cards = {c["model"]: c for c in saved["cards"]}
        merged = next(n for n in cards if n != "base" and n not in saved["parents"])
        shares = []
        for parent in saved["parents"]:
            task = parent.removeprefix("lora-")        # the zoo's models are named like their task
            gain = s(cards[parent], task) - s(cards["base"], task)
            if gain > 0:
                shares.append((s(cards[merged], task) - s(cards["base"], task)) / gain)
        if shares:
            kept[merged] = (sum(shares) / len(shares), cards[merged]["general_loss"] - cards["base"]["general_loss"])
    assert kept, "no merge with a parent that gained on its own task"
    share, lost = max(kept.values())
    return [f"keeps the most: {100 * share:.0f} %", f"for {lost:+.3f} nats"]


def expect_sequence(run: Path) -> list[str]:
    """Each chain's share of the first task's gain left after the last stage, from R in the saved run: in exact
    match, or in answer loss when no chain gained any exact match in its first stage."""
    saved = results(run)
    first = saved["order"][0]

    def shares(score: str, sign: float) -> dict[str, float | None]:
        base = saved["base"][score][first]
        out = {}
        for chain in saved["chains"]:
            own, last = chain["stages"][0][score][first], chain["stages"][-1][score][first]
            gain = sign * (own - base)
            out[chain["method"]] = sign * (last - base) / gain if gain > 0 else None
        return out

    kept = shares("exact_match", 1.0)
    if all(v is None for v in kept.values()):
        kept = shares("answer_loss", -1.0)
    return [f"{m} {v:.0%}" if v is not None else f"{m} (no gain)" for m, v in kept.items()]


# page title → (main button, takeaway key, saved kind, expected texts)
ACTIONS = {
    "Models": ("Evaluate", "models_takeaway", "scorecards", expect_scorecards),
    "Task vectors": ("Measure the task vectors", "taskvec_takeaway", "taskvec", expect_taskvec),
    "Linearity": ("Compute scores", "linearity_takeaway", "linearity", expect_linearity),
    "Forgetting": ("Run sweep", "forgetting_takeaway", "sweep-alpha", expect_sweep),
    "Attribution": ("Compute the maps", "attribution_takeaway", "attribution", expect_attribution),
    "Text": ("Score the text", "text_takeaway", "textdiff", expect_text),
    "Features": ("Map features", "features_takeaway", "features", expect_features),
    "Merge": ("Merge and compare", "merge_takeaway", None, None),
    "Fine-tune": ("Fine-tune", "finetune_takeaway", "finetune", expect_finetune),
    "Sequence": ("Run the sequence", "sequence_takeaway", "sequence", expect_sequence),
}
# the charts a page's default action must draw (their titles' beginnings)
CHARTS = {"Sequence": ("Every task's exact match", "Each task over the stages",
                       "Overall performance against backward transfer", "General held-out loss after each stage")}


def opening(page) -> str:
    """The page's opening question: the caption right under its title."""
    return page.locator('[data-testid="stMain"] [data-testid="stCaptionContainer"]').first.inner_text()


def test_every_page_asks_in_plain_words_and_its_default_action_ends_with_its_takeaway(home, tmp_path):
    from forgetlab.ui.navigation import existing_pages

    pages = existing_pages(ROOT / "pages")
    assert {p.title for p in pages} >= set(ACTIONS), "a page of this test is gone"
    log = tmp_path / "streamlit.log"
    report = []
    with streamlit_server(ROOT / "app.py", env={"FORGETLAB_HOME": str(home)}, log=log) as url, chromium() as page:
        goto(page, url)
        wait_jobs(page, JOB)                       # the Models page scores the zoo on its first visit
        for spec in pages:
            click_nav(page, spec.title)
            question = opening(page)
            assert question and not [f for f in FORMULA if f in question], f"{spec.title} opens with {question!r}"
            if spec.stem not in ("runs", "glossary"):         # the two pages without a formula
                assert page.get_by_text("How this is computed", exact=True).count() == 1, spec.title
            if spec.stem == "runs":                 # the newest run opens with the sentence its action ended with
                newest = max((home / "runs").iterdir(), key=lambda p: p.name)
                kind = json.loads((newest / "recipe.json").read_text())["kind"]
                expect = next(e for _, _, k, e in ACTIONS.values() if k == kind)
                wait_for(page, lambda: count(page, ".st-key-runs_takeaway") > 0, 60, "the reopened run's takeaway")
                text = page.locator(".st-key-runs_takeaway").first.inner_text()
                assert not [s for s in expect(newest) if s not in text], f"Runs: {text!r}"
            if spec.title not in ACTIONS:
                continue
            button, key, kind, expect = ACTIONS[spec.title]
            before = saved_runs(home)
            t0 = time.monotonic()
            page.locator('[data-testid="stMain"]').get_by_role("button", name=button, exact=True).first.click()
            page.wait_for_timeout(300)
            wait_idle(page, JOB)
            wait_jobs(page, JOB)
            box = f".st-key-{key}"
            try:
                wait_for(page, lambda: count(page, box) > 0, 30, f"the takeaway of {spec.title}")
            finally:
                screenshot(page, f"takeaway-{spec.stem}")
            assert not exceptions(page), f"{spec.title}: {exceptions(page)}\n{log.read_text()[-3000:]}"
            text = page.locator(box).first.inner_text()
            said = expect_merges(home, text) if kind is None else expect(new_run(home, before, kind))
            missing = [s for s in said if s not in text]
            assert not missing, f"{spec.title}: the takeaway {text!r} lacks {missing}"
            titles = " | ".join(page.locator('[data-testid="stMain"] .gtitle').all_text_contents())
            lacking = [c for c in CHARTS.get(spec.title, ()) if c not in titles]
            assert not lacking, f"{spec.title} does not draw {lacking}; its charts: {titles}"
            report.append(f"{spec.title}: {time.monotonic() - t0:.1f} s · {text}")
    print("\n".join(report))
