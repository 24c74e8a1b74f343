"""The Attribution page: compute the maps on a tiny pool, see heatmaps, scatter, additivity; reopen the saved map;
turn chosen submodules into a recipe that the Merge page opens."""
from __future__ import annotations

from tests.jobs_helper import finish_cleanly, open_page, start_page


def test_attribution_page_maps_reopen_and_recipe(tiny_llama, tmp_path, monkeypatch):
    at = start_page("attribution", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    assert at.title[0].value == "Attribution"
    assert any("Compute the maps" in i.value for i in at.info)
    at.radio(key="attribution_level").set_value("layer")
    at.session_state["app_max_general"] = 1
    at.session_state["app_max_task"] = 2
    at.button(key="attribution_run").click().run()
    finish_cleanly(at, "attribution")
    assert len(at.get("plotly_chart")) == 3                 # two heatmaps + the trade-off scatter
    table = at.dataframe[1].value
    assert set(table["map"]) == {"only_this", "leave_one_out"}
    assert set(table["key"]) == {"embed", "0", "1", "norm", "lm_head"}
    assert len(list((tmp_path / "runs").iterdir())) == 1
    # the recipe: keep layer 1 only
    at.multiselect(key="attribution_keep_ft0_layer").set_value(["1"])
    at.button(key="attribution_to_merge").click().run()
    assert not at.exception, at.exception
    sent = at.session_state["attribution_recipe"]
    assert sent == {"models": ["ft0"], "method": "submodule_alpha", "params": {"alphas": "1=1", "default": 0.0}}
    # a fresh session shows the saved map
    again = open_page("attribution", tiny_llama.pool_yaml)
    again.run()
    assert not again.exception, again.exception
    assert len(again.get("plotly_chart")) == 3
    # bad input: an α line out of range → an error, nothing started
    again.text_input(key="attribution_alphas").set_value("0, 2")
    again.button(key="attribution_run").click().run()
    assert any("[0, 1]" in e.value for e in again.error)
    again.text_input(key="attribution_alphas").set_value("0, x")
    again.button(key="attribution_run").click().run()
    assert not again.exception, again.exception
    assert any("α line" in e.value for e in again.error)
    assert len(list((tmp_path / "runs").iterdir())) == 1            # nothing more was saved
    # the Merge page opens the recipe in its form
    merge = open_page("merge", tiny_llama.pool_yaml)
    merge.session_state["attribution_recipe"] = sent
    merge.run()
    assert not merge.exception, merge.exception
    assert merge.selectbox(key="merge_method").value == "submodule_alpha"
    assert merge.multiselect(key="merge_models").value == ["ft0"]
    assert merge.text_input(key="merge_submodule_alpha_alphas").value == "1=1"
