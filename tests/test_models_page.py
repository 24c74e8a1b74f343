"""The Models page renders a pool of tiny models: table, scorecards (stored ones at once), task-vector
heatmap, cosine matrix; the speciality measure is one choice for the whole session."""
from __future__ import annotations

import json
import shutil

import pytest

from forgetlab.core.evaluate import Scorecard, TaskScore
from tests.jobs_helper import finish_cleanly, finish_jobs, open_page


def _scores(at):
    """The scorecards table (the one with a general-loss column)."""
    return next(d.value for d in at.dataframe if "general loss ↓" in d.value.columns)


def test_models_page_renders_and_evaluates(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    at = open_page("models", tiny_llama.pool_yaml, timeout=120)
    at.run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Models"
    table = at.dataframe[0].value
    assert list(table["model"]) == ["base", "ft0", "ft1"]
    from forgetlab.ui.jobs import REGISTRY

    # the task vectors are read by a background job (the page is usable meanwhile), once per pool
    assert [j.label for j in REGISTRY.jobs() if j.key.startswith("models-anatomy")] == ["Reading the task vectors"]
    assert any("No scorecards yet" in i.value for i in at.info)
    finish_jobs(at, "models-anatomy")
    assert not at.exception, at.exception
    assert len(at.get("plotly_chart")) == 2  # no manifest: norms heatmap + cosine matrix, no scorecard yet
    at.multiselect(key="models_chosen").set_value(["base", "ft0"])
    at.session_state["app_max_task"] = 4                                      # the app's budget (sidebar)
    at.button(key="models_eval").click().run()
    finish_cleanly(at, "models")
    scores = _scores(at)
    assert list(scores["model"]) == ["base", "ft0"]
    shown, hidden = {"exact_match": ("exact match ↑", "answer loss ↓"),
                     "answer_loss": ("answer loss ↓", "exact match ↑")}[at.radio(key="models_measure").value]
    assert {"general loss ↓", f"math {shown}", f"copy {shown}"} <= set(scores.columns)   # friendly
    assert not [c for c in scores.columns if hidden in c]      # the chart's measure only: the table fits the page
    assert len(at.get("plotly_chart")) == 3
    runs = list((tmp_path / "home" / "runs").iterdir())                     # the evaluation is a saved run
    assert len(runs) == 1 and "scorecards" in runs[0].name
    saved = json.loads((runs[0] / "results.json").read_text())
    assert [c["model"] for c in saved["cards"]] == ["base", "ft0"]
    at.selectbox(key="models_tv_model").set_value("ft1").run()
    assert not at.exception


def _with_manifest(tiny_llama, tmp_path, exact_match: dict[str, float]):
    root = tmp_path / "pool"
    shutil.copytree(tiny_llama.root, root)
    pool_yaml = root / tiny_llama.pool_yaml.name
    cards = {name: Scorecard(name, 3.0 + i, 20.0, 100, {t: TaskScore(t, em, 1.5 - i / 10, 8) for t in ("math", "copy")})
             for i, (name, em) in enumerate(exact_match.items())}
    (root / "manifest.json").write_text(json.dumps({"scorecards": {n: c.to_dict() for n, c in cards.items()}}))
    return pool_yaml


def test_a_zoo_is_scored_at_the_app_budget_and_the_measure_defaults_to_what_moves(tiny_llama, tmp_path):
    """A zoo's page scores its models by itself at the app's budget (not the cards its build stored at its own):
    the numbers are the core cache's, the ones every page shows."""
    from forgetlab.core.pool import ModelPool
    from forgetlab.core.scorecards import Budget, pool_scorecard

    flat = _with_manifest(tiny_llama, tmp_path / "a", {"base": 0.0, "ft0": 0.11, "ft1": 0.0})    # the pico zoo's spread
    at = open_page("models", flat, timeout=120)
    at.session_state["app_max_general"], at.session_state["app_max_task"] = 2, 3
    at.run()
    assert not at.exception, at.exception
    finish_jobs(at, "models")
    assert not at.exception, at.exception
    assert len(at.get("plotly_chart")) == 3
    table = _scores(at)
    assert list(table["model"]) == ["base", "ft0", "ft1"]
    direct = pool_scorecard(ModelPool.from_yaml(flat), "base", Budget(2, 3))
    assert table["general loss ↓"].iloc[0] == direct.general_loss != 3.0       # computed, not the stored 3.0
    radio = at.radio(key="models_measure")
    assert radio.value == "answer_loss"                         # exact match is ~0 everywhere: answer loss
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert fig["layout"]["yaxis2"]["title"]["text"] == "answer loss (nats) ↓"
    assert fig["layout"]["yaxis"]["title"]["text"] == "Δ general loss vs base, nats ↓"     # a delta view, from 0
    assert fig["layout"]["yaxis"]["rangemode"] == "tozero"
    radio.set_value("exact_match").run()
    assert at.session_state["app_measure"] == "exact_match"     # the session-wide choice
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert fig["layout"]["yaxis2"]["title"]["text"] == "exact match ↑"

    moving = _with_manifest(tiny_llama, tmp_path / "b", {"base": 0.0, "ft0": 0.6, "ft1": 0.1})   # moves by 0.6
    at = open_page("models", moving, timeout=120)
    at.run()
    assert at.radio(key="models_measure").value == "exact_match"
    finish_jobs(at, "models")


def test_the_evaluate_button_is_visible_without_expanding_anything(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    at = open_page("models", tiny_llama.pool_yaml, timeout=120)
    at.run()
    assert not at.exception, at.exception
    # nothing to open before the main action (the folded formulas, "How this is computed", are no step of it)
    assert [e.label for e in at.expander] == ["How this is computed"], [e.label for e in at.expander]
    button = at.button(key="models_eval")
    assert button.label == "Evaluate" and not button.disabled
    finish_jobs(at, "models")


def test_the_claims_are_grouped_folded_named_and_say_why_and_come_after_the_scorecards(tiny_llama, tmp_path):
    """The claims come after the scorecards, in one folded expander per group (fine-tunes, fixes, merges) whose
    label says how many of its claims hold; inside, a static table (st.table: all rows, the whole text, no inner
    scroll) with merges named as the app names them, each with its own paper, and a reason beside each ✗; the
    caption says whether the claims were measured at the app's budget."""
    from forgetlab.merge import METHODS

    root = tmp_path / "zoo"
    shutil.copytree(tiny_llama.root, root)
    long = "math 47%, code 58%, translate 50% of the gain (mean 52%; weight average 95%); held-out loss 5.302 " * 2
    merges = ["ties", "iso_c", "della", "tsv", "lines"]
    claims = [{"key": f"merge:{m}", "claim": f"a {m} merge of the fine-tunes keeps …", "numbers": f"{m}: {long}",
               "source": "PCB-merging / submodule-linearity merging", "holds": i % 2 == 0,
               "values": {"mean_share": 0.9 + 0.1 * (i % 2 == 0), "average_mean_share": 0.95}}
              for i, m in enumerate(merges)]
    claims += [{"key": "wise_ft", "claim": "WiSE-FT …", "source": "WiSE-FT", "holds": True, "numbers": "n",
                "values": {}},
               {"key": "finetune:math", "claim": "fine-tuning math …", "source": "catastrophic forgetting",
                "holds": False, "numbers": "n", "values": {"task": "math", "exact_match": [0.0, 0.0], "gain": 0.0,
                                                           "forgetting": 0.2, "general_loss": [4.0, 4.2]}}]
    (root / "manifest.json").write_text(json.dumps({"claims": {"claims": claims, "settings": {"max_general": 7,
                                                                                            "max_task": 9}}}))
    at = open_page("models", root / tiny_llama.pool_yaml.name, timeout=120)
    at.session_state["app_max_general"], at.session_state["app_max_task"] = 7, 9
    at.run()
    assert not at.exception, at.exception
    headers = [h.value for h in at.subheader]
    assert headers.index("Scorecards") < headers.index("What this zoo shows")        # the scorecards first
    claim_groups = [e for e in at.expander if e.label != "How this is computed"]     # the page's formulas aside
    labels = [e.label for e in claim_groups]
    assert labels[:3] == ["Fine-tunes: 0 of 1 claim holds", "Fixes for forgetting: 1 of 1 claim holds",
                          "Merges: 3 of 5 claims hold"]
    assert not any(e.proto.expanded for e in claim_groups[:3])                        # folded
    tables = [t.value for t in at.table]
    assert list(tables[1].columns) == ["holds", "claim", "measured", "source"]         # all hold: no reason column
    merge_table = tables[2]
    assert list(merge_table.columns) == ["holds", "claim", "why not", "measured", "source"]
    assert merge_table["measured"].tolist() == [c["numbers"] for c in claims[:5]]     # the whole text
    assert merge_table["claim"].tolist()[:2] == ["a TIES merge of the fine-tunes keeps their own-task gains better "
                                                 "than their weight average",
                                                 "an Iso-C merge of the fine-tunes keeps their own-task gains better "
                                                 "than their weight average"]
    assert merge_table["source"].tolist() == [METHODS[m].paper for m in merges]       # each its own paper
    why = dict(zip(merge_table["holds"], merge_table["why not"]))
    assert why["✓"] == "" and why["✗"].startswith("keeps 90% of the fine-tunes' gains on average, the weight "
                                                  "average 95%")
    assert tables[0]["why not"].iloc[0].startswith("no gain on math: exact match 0.00 → 0.00")
    assert any("Same evaluation budget as the rest of the app" in c.value for c in at.caption)
    at.session_state["app_max_general"] = 8
    at.run()
    assert any("Another evaluation budget than the app's" in c.value for c in at.caption)
    finish_jobs(at, "models")


def _cached_pool(tiny_llama, tmp_path):
    """A zoo-like copy of the tiny pool whose three models are scored at the app budget 2/3 on its first visit."""
    return _with_manifest(tiny_llama, tmp_path, {"base": 0.0, "ft0": 0.6, "ft1": 0.1})


def test_the_model_selection_filters_the_chart_and_the_table(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    at = open_page("models", _cached_pool(tiny_llama, tmp_path), timeout=120)
    at.session_state["app_max_general"], at.session_state["app_max_task"] = 2, 3
    at.run()
    finish_jobs(at, "models")
    assert list(_scores(at)["model"]) == ["base", "ft0", "ft1"]
    at.multiselect(key="models_chosen").set_value(["base", "ft1"]).run()
    assert not at.exception, at.exception
    assert list(_scores(at)["model"]) == ["base", "ft1"]
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    shown = {x for trace in fig["data"] for x in (trace.get("x") or [])} | {t.get("name") for t in fig["data"]}
    assert "ft1" in shown and "ft0" not in shown
    at.multiselect(key="models_chosen").set_value([]).run()
    assert not any("general loss ↓" in d.value.columns for d in at.dataframe)
    assert any("Choose at least one model" in i.value for i in at.info)


def test_evaluate_says_so_when_every_scorecard_is_up_to_date(tiny_llama, tmp_path, monkeypatch):
    from forgetlab.ui.jobs import REGISTRY

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    at = open_page("models", _cached_pool(tiny_llama, tmp_path), timeout=120)
    at.session_state["app_max_general"], at.session_state["app_max_task"] = 2, 3
    at.run()
    finish_jobs(at, "models")                               # the first visit scores the zoo at the app's budget
    at.button(key="models_eval").click().run()
    assert not at.exception, at.exception
    said = [i.value for i in at.info if "up to date" in i.value]
    assert len(said) == 1 and said[0].startswith("All 3 scorecards are up to date (computed ")
    assert said[0].endswith("; nothing to recompute: the set is saved to Runs as it stands.")
    finish_jobs(at, "models")
    runs = list((tmp_path / "home" / "runs").iterdir())                                 # the click keeps the set
    assert len(runs) == 1
    saved = json.loads((runs[0] / "results.json").read_text())["cards"]
    shown = _scores(at)
    assert [c["model"] for c in saved] == list(shown["model"])
    assert [c["general_loss"] for c in saved] == pytest.approx(list(shown["general loss ↓"]), abs=5e-4)  # as shown
    at.multiselect(key="models_chosen").set_value(["ft0"]).run()
    at.button(key="models_eval").click().run()
    assert any(i.value.startswith("The scorecard is up to date") for i in at.info)
    finish_jobs(at, "models")


def test_models_page_evaluates_in_the_sidebar_dtype_and_refuses_what_will_not_fit(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    at = open_page("models", tiny_llama.pool_yaml, timeout=120)
    at.session_state["app_dtype"] = "bfloat16"
    at.session_state["app_max_task"] = 4
    at.run()
    assert any(c.value.startswith("Memory: needs ≈") and "bfloat16" in c.value for c in at.caption)
    at.multiselect(key="models_chosen").set_value(["base"])
    at.button(key="models_eval").click().run()
    finish_cleanly(at, "models")
    finish_jobs(at, "models-anatomy")
    run = next((tmp_path / "home" / "runs").iterdir())
    assert json.loads((run / "recipe.json").read_text())["dtype"] == "bfloat16"
    assert list(_scores(at)["model"]) == ["base"]                      # the bf16 card is the one shown
    import forgetlab.core.memory as memory

    monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1024)
    at.run()
    assert at.button(key="models_eval").disabled
    assert any("will not fit" in e.value for e in at.error)
