"""The Linearity page: compute scores on a tiny pool; heatmap, bars, curves, table, CSV; cached per settings."""
from __future__ import annotations

from tests.jobs_helper import finish_cleanly, open_page, start_page


def test_linearity_page_computes_and_caches(tiny_llama, tmp_path, monkeypatch):
    at = start_page("linearity", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    assert at.title[0].value == "Linearity"
    assert any("Compute scores" in i.value for i in at.info)
    at.selectbox(key="linearity_model").set_value("ft1")
    at.number_input(key="linearity_samples_math").set_value(3)
    at.text_input(key="linearity_alphas").set_value("0, 0.25, 0.5, 0.75")
    at.button(key="linearity_run").click().run()
    finish_cleanly(at, "linearity")
    table = at.dataframe[0].value
    assert list(table["level"].unique()) == ["model", "layer", "attn", "mlp", "head"]
    assert len(table) == 1 + 3 * 2 + 4 * 2 and table["NLS mean"].notna().all()
    runs = [p.name for p in (tmp_path / "runs").iterdir()]
    assert len(runs) == 1 and "linearity" in runs[0]                 # saved like the CLI's, reopened on Runs
    assert len(at.get("plotly_chart")) == 3  # heatmap, bars, curves
    assert [m.label for m in at.metric][:5] == ["model", "layer", "attn", "mlp", "head"]   # short: never cut
    # the task vector's size, which decides how linear submodules can be, computed another way
    from forgetlab.core.taskvectors import distance
    from forgetlab.core.pool import ModelPool

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    expected = distance(pool.checkpoint("ft1").state_dict(), pool.checkpoint("base").state_dict())
    assert at.metric[5].label == "D(θ, θ0)" and at.metric[5].value == f"{expected:.3g}"   # 3 digits: never truncated
    # a rerun with the same settings shows the cached result without recomputing (no status box)
    at.run()
    assert len(at.dataframe) == 1 and not at.get("status")
    # choosing particular curves redraws
    at.multiselect(key="linearity_curves").set_value([("model", None, None), ("head", 1, 2)]).run()
    assert not at.exception, at.exception
    # other settings: not computed yet
    at.radio(key="linearity_capture").set_value("base").run()
    assert any("Compute scores" in i.value for i in at.info)


def test_linearity_page_bad_alphas_message(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("linearity", tiny_llama.pool_yaml)
    at.run()
    at.text_input(key="linearity_alphas").set_value("0, 1.5")
    at.number_input(key="linearity_samples_math").set_value(2)
    at.button(key="linearity_run").click().run()
    assert not at.exception
    assert any("alphas" in e.value for e in at.error)
    at.text_input(key="linearity_alphas").set_value("zero")
    at.run()
    assert any("Cannot read" in e.value for e in at.error)
