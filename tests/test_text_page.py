"""The Text page: score typed text and the held-out split on a tiny pool, see the shaded tokens (hover = both
models' top-3), the contexts, per-class bars, logit lens; open it from a Forgetting point / a merge (a request)
and from the Runs page; bad input is a message and saves nothing."""
from __future__ import annotations

from tests.jobs_helper import finish_cleanly, open_page, start_page


def _runs(home):
    return list((home / "runs").iterdir()) if (home / "runs").exists() else []


def _html(at) -> str:
    return "".join(e.proto.body for e in at.get("html"))


def test_text_page_scores_shows_and_reopens(tiny_llama, tmp_path, monkeypatch):
    at = start_page("text", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    assert at.title[0].value == "Text"
    assert any("Score a text" in i.value for i in at.info)
    # bad input: an empty text is a message, nothing runs or is saved
    at.radio(key="text_source").set_value("my own text").run()
    at.text_area(key="text_lines").set_value("  \n").run()
    at.button(key="text_run").click().run()
    assert any("empty" in e.value for e in at.error)
    assert _runs(tmp_path) == []
    # typed text, against the other fine-tune
    at.text_area(key="text_lines").set_value("The river flows past the mill.\nShips carried 42 sacks of salt.").run()
    at.selectbox(key="text_against").set_value("ft1")
    at.button(key="text_run").click().run()
    finish_cleanly(at, "text")
    body = _html(at)
    assert body.count("<span title=") >= 10 and "ft0 predicted:" in body and "ft1 predicted:" in body
    assert "nats" in body and "linear-gradient" in body                     # the legend
    assert len(at.get("plotly_chart")) == 3                                  # classes, lens, positions
    contexts = at.dataframe[0].value
    assert len(contexts) > 0 and contexts["context"].str.contains(r"\[").all()
    assert len(_runs(tmp_path)) == 1
    at.radio(key="text_measure").set_value("kl").run()
    assert not at.exception, at.exception
    # a fresh session shows the saved run
    again = open_page("text", tiny_llama.pool_yaml)
    again.run()
    assert not again.exception, again.exception
    assert again.selectbox(key="text_saved").value is not None
    assert "<span title=" in _html(again)


def test_a_forgetting_point_opens_its_text_view_against_the_base(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("text", tiny_llama.pool_yaml)
    at.session_state["text_request"] = {"model": "ft1", "alpha": 0.5, "against": "base"}
    at.session_state["app_max_general"] = 2
    at.run()
    finish_cleanly(at, "text")
    assert at.selectbox(key="text_model").value == "ft1" and at.checkbox(key="text_use_alpha").value
    assert at.slider(key="text_alpha").value == 0.5
    result = at.session_state["text_result"]
    assert result.model == "ft1@alpha=0.5" and result.against == "base" and result.source == "heldout"
    assert len(result.docs) == 2 and len(_runs(tmp_path)) == 1
    # the Runs page lists it with its figures and sends it back to the Text page
    runs = open_page("runs", tiny_llama.pool_yaml)
    runs.run()
    assert not runs.exception, runs.exception
    assert len(runs.get("plotly_chart")) == 3
    run_id = _runs(tmp_path)[0].name
    runs.button(key=f"runs_text_{run_id}").click().run()
    assert not runs.exception, runs.exception
    assert runs.session_state["text_open_run"] == str(_runs(tmp_path)[0])
    text = open_page("text", tiny_llama.pool_yaml)
    text.session_state["text_open_run"] = str(_runs(tmp_path)[0])
    text.run()
    assert not text.exception, text.exception
    assert text.session_state["text_result"].model == "ft1@alpha=0.5"
    assert "<span title=" in _html(text)


def test_a_merge_on_the_merge_page_opens_its_text_view(tiny_llama, tmp_path, monkeypatch):
    at = start_page("merge", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    at.selectbox(key="merge_method").set_value("wise_ft").run()
    at.multiselect(key="merge_models").set_value(["ft0"]).run()
    at.number_input(key="merge_wise_ft_alpha").set_value(0.5)
    at.text_input(key="merge_name_wise_ft").set_value("half")
    at.session_state["app_max_general"] = 1
    at.session_state["app_max_task"] = 1
    at.button(key="merge_run").click().run()
    finish_cleanly(at, "merge")
    at.button(key="merge_text").click().run()
    assert not at.exception, at.exception
    request = at.session_state["text_request"]
    assert request == {"model": "half", "alpha": None, "against": "base"}
    text = open_page("text", tiny_llama.pool_yaml)
    text.session_state["text_request"] = request
    text.session_state["app_max_general"] = 1
    text.run()
    finish_cleanly(text, "text")
    merged = text.session_state["text_result"]
    assert merged.model == "half" and merged.against == "base" and len(merged.docs) == 1
    # the merge is the registry's WiSE-FT at α = 0.5: the same tokens as the sweep point ft0 at α = 0.5
    from forgetlab.analysis.textdiff import textdiff
    from forgetlab.core.pool import ModelPool

    point = textdiff(ModelPool.from_yaml(tiny_llama.pool_yaml), "ft0", alpha=0.5, max_general=1, lens=False)
    assert abs(point.tokens["rise"] - merged.tokens["rise"]).max() < 1e-5


def test_a_clicked_curve_point_gives_its_alpha():
    from forgetlab.ui.textview import clicked_alpha

    assert clicked_alpha({"selection": {"points": [{"x": 0.3, "y": 0.7, "curve_number": 1}]}}) == 0.3
    assert clicked_alpha({"selection": {"points": []}}) is None
    assert clicked_alpha(None) is None


def test_text_page_shows_the_memory_runs_in_the_sidebar_dtype_and_refuses_what_will_not_fit(tiny_llama, tmp_path,
                                                                                            monkeypatch):
    at = start_page("text", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    assert any(c.value.startswith("Memory: needs ≈") and "float32" in c.value for c in at.caption)
    at.session_state["app_dtype"] = "bfloat16"
    at.run()
    assert any(c.value.startswith("Memory: needs ≈") and "bfloat16" in c.value for c in at.caption)
    at.radio(key="text_source").set_value("my own text").run()
    at.text_area(key="text_lines").set_value("The river flows past the mill.").run()
    at.button(key="text_run").click().run()
    finish_cleanly(at, "text")
    import json

    run = _runs(tmp_path)[0]
    assert json.loads((run / "recipe.json").read_text())["dtype"] == "bfloat16"
    import forgetlab.core.memory as memory

    at.session_state["app_dtype"] = "float32"
    monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1024)
    at.run()
    assert at.button(key="text_run").disabled
    assert any("will not fit" in e.value and "--no-lens" in e.value for e in at.error)
