"""The Models page renders a pool of tiny models: table, scorecards (stored ones at once), task-vector
heatmap, cosine matrix; the speciality measure is one choice for the whole session."""
from __future__ import annotations

import json
import shutil

from forgetlab.core.evaluate import Scorecard, TaskScore
from tests.jobs_helper import finish_cleanly, finish_jobs, open_page


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
    scores = at.dataframe[1].value
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
    table = at.dataframe[1].value
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
    assert not at.expander, [e.label for e in at.expander]      # nothing to open before the main action
    button = at.button(key="models_eval")
    assert button.label == "Evaluate" and not button.disabled
    finish_jobs(at, "models")


def test_the_claims_table_is_shown_whole_and_says_its_budget(tiny_llama, tmp_path):
    """All rows and the full "measured" text, in a static table (st.table: no inner scroll, no cut-off column);
    its caption says whether it was measured at the app's budget."""
    root = tmp_path / "zoo"
    shutil.copytree(tiny_llama.root, root)
    long = "math 47%, code 58%, translate 50% of the gain (mean 52%; weight average 95%); held-out loss 5.302 " * 2
    claims = [{"key": f"k{i}", "claim": f"claim {i}", "source": "paper", "holds": i % 3 != 0, "numbers": f"{i}: {long}"}
              for i in range(13)]
    (root / "manifest.json").write_text(json.dumps({"claims": {"claims": claims, "settings": {"max_general": 7,
                                                                                            "max_task": 9}}}))
    at = open_page("models", root / tiny_llama.pool_yaml.name, timeout=120)
    at.session_state["app_max_general"], at.session_state["app_max_task"] = 7, 9
    at.run()
    assert not at.exception, at.exception
    table = at.table[0].value
    assert len(table) == 13 and list(table.columns) == ["holds", "claim", "measured", "source"]
    assert table["measured"].tolist() == [c["numbers"] for c in claims]
    assert table["holds"].tolist().count("✗") == 5
    assert any("Same evaluation budget as the rest of the app" in c.value for c in at.caption)
    at.session_state["app_max_general"] = 8
    at.run()
    assert any("Another evaluation budget than the app's" in c.value for c in at.caption)
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
    assert list(at.dataframe[1].value["model"]) == ["base"]            # the bf16 card is the one shown
    import forgetlab.core.memory as memory

    monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1024)
    at.run()
    assert at.button(key="models_eval").disabled
    assert any("will not fit" in e.value for e in at.error)
