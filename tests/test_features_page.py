"""The Features page: a t-SNE map of a submodule's features on a tiny pool, cluster distances, CSV."""
from __future__ import annotations

from tests.jobs_helper import finish_cleanly, start_page


def test_features_page_maps_and_switches_submodule(tiny_gpt2, tmp_path, monkeypatch):
    at = start_page("features", tiny_gpt2.pool_yaml, tmp_path, monkeypatch)
    assert at.title[0].value == "Features"
    assert any("Map features" in i.value for i in at.info)
    at.number_input(key="features_samples").set_value(5)
    at.number_input(key="features_perplexity").set_value(5.0)
    at.button(key="features_run").click().run()
    finish_cleanly(at, "features")
    summary = at.dataframe[0].value
    assert list(summary["model"]) == ["base", "ft0", "ft1"] and (summary["mean distance pca"] > 0).all()
    runs = [p.name for p in (tmp_path / "runs").iterdir()]
    assert len(runs) == 1 and "features" in runs[0]                  # the map is a saved run
    assert len(at.dataframe[1].value) == 3  # one task pair per model
    assert len(at.get("plotly_chart")) == 2
    at.selectbox(key="features_level").set_value("head").run()
    at.selectbox(key="features_head").set_value(3)
    at.multiselect(key="features_models").set_value(["ft0"])
    at.radio(key="features_pooling").set_value("last")
    at.button(key="features_run").click().run()
    finish_cleanly(at, "features")
    assert list(at.dataframe[0].value["model"]) == ["ft0"]


def test_features_page_shows_the_memory_runs_in_the_sidebar_dtype_and_refuses_what_will_not_fit(tiny_llama, tmp_path,
                                                                                                monkeypatch):
    import json

    at = start_page("features", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    assert any(c.value.startswith("Memory: needs ≈") and "float32" in c.value for c in at.caption)
    assert not at.button(key="features_run").disabled
    at.session_state["app_dtype"] = "bfloat16"          # the sidebar's Dtype reaches the estimate and the job
    at.run()
    assert any(c.value.startswith("Memory: needs ≈") and "bfloat16" in c.value for c in at.caption)
    at.number_input(key="features_samples").set_value(4)
    at.number_input(key="features_perplexity").set_value(3.0)
    at.button(key="features_run").click().run()
    finish_cleanly(at, "features")
    run = next((tmp_path / "runs").iterdir())
    assert json.loads((run / "recipe.json").read_text())["dtype"] == "bfloat16"
    import forgetlab.core.memory as memory

    at.session_state["app_dtype"] = "float32"
    monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1024)
    at.run()
    assert at.button(key="features_run").disabled
    assert any("will not fit" in e.value and "Dtype" in e.value for e in at.error)
