"""The Models page renders a pool of tiny models: table, scorecards, task-vector heatmap, cosine matrix."""
from __future__ import annotations

from tests.jobs_helper import finish_jobs, open_page


def test_models_page_renders_and_evaluates(tiny_llama):
    at = open_page("models", tiny_llama.pool_yaml, timeout=120)
    at.run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Models"
    table = at.dataframe[0].value
    assert list(table["model"]) == ["base", "ft0", "ft1"]
    assert len(at.get("plotly_chart")) == 2  # norms heatmap + cosine matrix before any evaluation
    at.multiselect(key="models_chosen").set_value(["base", "ft0"])
    at.number_input(key="models_max_task").set_value(4)
    at.button(key="models_eval").click().run()
    finish_jobs(at, "models")
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    scores = at.dataframe[1].value
    assert list(scores["model"]) == ["base", "ft0"]
    assert {"general_loss", "math/exact_match", "copy/answer_loss"} <= set(scores.columns)
    assert len(at.get("plotly_chart")) == 3
    at.selectbox(key="models_tv_model").set_value("ft1").run()
    assert not at.exception


def test_models_page_with_malformed_pool_shows_message(tmp_path):
    bad = tmp_path / "pool.yaml"
    bad.write_text("base: [")
    at = open_page("models", bad, timeout=60)
    at.run()
    assert not at.exception
    assert any("not valid YAML" in e.value for e in at.error)
