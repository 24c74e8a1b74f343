"""One evaluation budget, one number per model: the core scorecard cache, the relative-perplexity helper, and the
base's general loss being the same on every page's code path at the app's budget."""
from __future__ import annotations

import math

import pytest

from forgetlab.core.errors import ParameterError
from forgetlab.core.evaluate import Scorecard, forgetting_text, perplexity_change, perplexity_text
from forgetlab.core.scorecards import Budget, cached_scorecards, forget_scorecards, pool_scorecard, remember


def test_perplexity_change_is_exp_of_the_loss_change_minus_one():
    # hand-computed: perplexity = exp(loss), so exp(L + Δ) / exp(L) − 1 = exp(Δ) − 1
    assert perplexity_change(math.log(2)) == pytest.approx(1.0)          # Δ = ln 2: perplexity doubles
    assert perplexity_change(-math.log(2)) == pytest.approx(-0.5)        # halves
    assert perplexity_change(0.0) == 0.0
    assert perplexity_change(0.049) == pytest.approx(0.0502204, abs=1e-6)
    assert perplexity_change(1e-9) == pytest.approx(1e-9, rel=1e-6)     # expm1: no cancellation for tiny Δ
    assert math.isnan(perplexity_change(float("nan")))
    assert perplexity_change(1000.0) == math.inf                         # no OverflowError
    assert perplexity_text(0.049) == "perplexity +5.0 %"
    assert perplexity_text(-0.1) == "perplexity -9.5 %"                  # exp(−0.1) − 1 = −0.0952
    assert forgetting_text(0.049) == "+0.049 nats (perplexity +5.0 %)"
    assert forgetting_text(0.0713, 4) == "+0.0713 nats (perplexity +7.4 %)"
    a = Scorecard("a", 5.1, math.exp(5.1), 10)
    b = Scorecard("base", 5.0, math.exp(5.0), 10)
    assert a.perplexity_change(b) == pytest.approx(a.perplexity / b.perplexity - 1)   # the same, another way


def test_tables_show_the_perplexity_change_beside_every_loss_delta():
    import pandas as pd

    from forgetlab.ui.tables import styled

    frame = pd.DataFrame({"label": ["a", "b"], "forgetting": [0.049, -0.1], "d_general_loss": [math.log(2), 0.0]})
    style = styled(frame)
    shown = style.data
    cols = list(shown.columns)
    assert cols == ["label", "forgetting (nats) ↓", "perplexity change", "Δ general loss (nats)", "Δ perplexity"]
    assert shown["perplexity change"].tolist() == pytest.approx([math.exp(0.049) - 1, math.exp(-0.1) - 1])
    assert shown["Δ perplexity"].tolist() == pytest.approx([1.0, 0.0])
    html = style.to_html()
    assert "+5.0%" in html and "-9.5%" in html and "+100.0%" in html


def test_budget_checks_and_describes_itself():
    assert Budget(32, 50).describe() == "32 held-out blocks, 50 eval pairs per task"
    assert Budget(None, None).describe() == "all held-out blocks, all eval pairs"
    with pytest.raises(ParameterError, match="max_general"):
        Budget(0, 50)
    assert Budget(32, 50) == Budget(32, 50) and Budget(32, 50) != Budget(32, 51)


def test_a_scorecard_is_computed_once_per_model_and_budget(pool, monkeypatch):
    from forgetlab.core import scorecards

    forget_scorecards(pool)
    calls = []
    real = scorecards.evaluate

    def counting(*a, **k):
        calls.append((k["name"], k["max_general"], k["max_task"]))
        return real(*a, **k)

    monkeypatch.setattr(scorecards, "evaluate", counting)
    small, big = Budget(2, 3), Budget(4, 3)
    assert cached_scorecards(pool, ["base", "ft0"], small) == []
    first = pool_scorecard(pool, "base", small)
    again = pool_scorecard(pool, "base", small)
    other = pool_scorecard(pool, "base", big)
    assert calls == [("base", 2, 3), ("base", 4, 3)]                      # once per (model, budget)
    assert first.general_loss == again.general_loss != other.general_loss
    again.model = "renamed"                                               # a copy: the cache is untouched
    assert [c.model for c in cached_scorecards(pool, ["ft0", "base"], small)] == ["base"]
    from forgetlab.core.evaluate import evaluate

    direct = evaluate(pool.load("base"), pool.tokenizer, pool.probes, name="base", max_general=2, max_task=3)
    assert first.general_loss == direct.general_loss and first.tasks["math"].answer_loss == direct.tasks["math"].answer_loss
    stored = Scorecard("ft1", 1.0, math.e, 3)
    remember(pool, [stored], small)
    assert pool_scorecard(pool, "ft1", small).general_loss == 1.0         # a remembered card is used as it is
    assert len(calls) == 2
    forget_scorecards(pool)
    assert cached_scorecards(pool, ["base", "ft1"], small) == []


def test_the_cache_knows_when_each_card_was_computed_and_says_so(pool, monkeypatch):
    """What the Models page's Evaluate says when nothing is left to compute: the cards' computation times."""
    import time

    from forgetlab.core import scorecards
    from forgetlab.core.scorecards import scorecard_times, up_to_date_text

    forget_scorecards(pool)
    small = Budget(2, 3)
    today = time.localtime()[:3]
    stamps = [time.mktime((*today, 9, 20, 0, 0, 0, -1)), time.mktime((*today, 9, 24, 0, 0, 0, -1))]
    clock = iter(stamps)
    monkeypatch.setattr(scorecards.time, "time", lambda: next(clock))
    pool_scorecard(pool, "base", small)
    remember(pool, [Scorecard("ft1", 1.0, math.e, 3)], small)
    times = scorecard_times(pool, ["base", "ft0", "ft1"], small)
    assert list(times) == ["base", "ft1"]                                   # ft0 has no card: left out
    assert scorecard_times(pool, ["base"], Budget(4, 3)) == {}              # another budget: none
    monkeypatch.undo()
    saved = "nothing to recompute: the set is saved to Runs as it stands."
    assert up_to_date_text(times.values()) == f"All 2 scorecards are up to date (computed 09:20–09:24); {saved}"
    assert up_to_date_text([times["base"]]) == f"The scorecard is up to date (computed 09:20); {saved}"
    yesterday = stamps[0] - 86400                                            # another day: with its date
    assert f"(computed {time.strftime('%Y-%m-%d', time.localtime(yesterday))} 09:20)" in up_to_date_text([yesterday])
    forget_scorecards(pool)
    assert scorecard_times(pool, ["base", "ft1"], small) == {}


def test_the_base_general_loss_is_the_same_on_every_pages_code_path(tiny_llama, tmp_path, monkeypatch):
    """At one budget the base's held-out loss is one number, whichever page computes it: the Models page's
    scorecards, the Merge page's evaluation beside a merge, a Forgetting sweep's α = 0 point, an Attribution map's
    base, a merge search's base — and it differs at another budget (so the budget is what matters)."""
    from forgetlab.analysis import attribution, sweeps
    from forgetlab.analysis.search import search
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.workflow import merge_and_evaluate, pool_recipe

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    budget = Budget(3, 4)
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    kw = budget.to_dict()
    models = pool_scorecard(pool, "base", budget).general_loss
    _, cards = merge_and_evaluate(pool_recipe(pool, "linear", ["ft0", "ft1"]), tmp_path / "m", pool, **kw)
    sweep = sweeps.alpha_curve(ModelPool.from_yaml(tiny_llama.pool_yaml), "ft0", alphas=[0.0, 1.0], **kw)
    attr = attribution.attribute(ModelPool.from_yaml(tiny_llama.pool_yaml), "ft0", task="math", level="layer", **kw)
    found = search(pool_recipe(pool, "ties", ["ft0", "ft1"]), ModelPool.from_yaml(tiny_llama.pool_yaml), budget=1,
                   **kw)
    values = {"models": models, "merge": cards[0].general_loss, "forgetting": sweep.points[0].scorecard.general_loss,
              "attribution": attr.scores("base")["general_loss"], "search": found.base_general_loss}
    assert cards[0].model == "base" and sweep.points[0].x == 0.0
    for page, value in values.items():
        assert value == pytest.approx(models, abs=1e-5), (page, values)
    other = pool_scorecard(pool, "base", Budget(1, 4)).general_loss
    assert abs(other - models) > 1e-3                                    # another budget: another number


@pytest.mark.parametrize("page", ["models", "merge", "forgetting", "attribution", "finetune", "text"])
def test_every_page_evaluates_at_the_sidebars_one_budget(page, tiny_llama, tmp_path, monkeypatch):
    """No page but Fine-tune has budget inputs of its own; each says which budget its numbers come from, and
    Fine-tune says that its in-training records use another."""
    from tests.jobs_helper import finish_jobs, open_page

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page(page, tiny_llama.pool_yaml)
    at.session_state["app_max_general"], at.session_state["app_max_task"] = 5, 6
    at.run()
    assert not at.exception, at.exception
    captions = [c.value for c in at.caption]
    assert any("Evaluation budget: 5 held-out blocks, 6 eval pairs per task (sidebar" in c for c in captions), captions
    own = [n.key for n in at.number_input if n.key and ("max_general" in n.key or "max_task" in n.key)]
    if page == "finetune":
        assert sorted(own) == ["finetune_max_general", "finetune_max_task"]
        assert any("their general loss differs from the other pages'" in c for c in captions)
    else:
        assert own == []
    finish_jobs(at, page)


def test_the_default_budget_is_the_one_the_zoo_measured_its_claims_with(tiny_llama, tmp_path):
    import json
    import shutil

    from forgetlab.core.scorecards import DEFAULT_BUDGET
    from forgetlab.ui.settings import default_budget

    assert default_budget(tiny_llama.pool_yaml) == DEFAULT_BUDGET                 # a user's pool: the default
    root = tmp_path / "zoo"
    shutil.copytree(tiny_llama.root, root)
    claims = {"claims": [{"key": "k", "claim": "c", "source": "s", "holds": True, "numbers": "n"}],
              "settings": {"max_general": 7, "max_task": 9}}
    (root / "manifest.json").write_text(json.dumps({"claims": claims}))
    assert default_budget(root / "pool.yaml") == Budget(7, 9)
