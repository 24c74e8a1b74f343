"""The Forgetting page: run a sweep on a tiny pool, see curves, scatter and table; reopen saved sweeps."""
from __future__ import annotations

from tests.jobs_helper import finish_cleanly, open_page, start_page


def test_forgetting_page_runs_alpha_sweep_and_reopens(tiny_llama, tmp_path, monkeypatch):
    at = start_page("forgetting", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    assert at.title[0].value == "Forgetting"
    assert any("Run a sweep" in i.value for i in at.info)
    assert at.radio(key="forgetting_measure").value == "answer_loss"     # no scorecards: what always moves
    at.radio(key="forgetting_measure").set_value("exact_match").run()
    at.text_input(key="forgetting_alphas").set_value("0, 0.5, 1")
    at.session_state["app_max_general"] = 2
    at.session_state["app_max_task"] = 3
    at.button(key="forgetting_run").click().run()
    finish_cleanly(at, "forgetting")
    table = at.dataframe[0].value
    assert list(table["α"]) == [0.0, 0.5, 1.0]                       # friendly headers
    assert table["on the Pareto front"].any()
    import os
    import socket
    assert list(table["worker"]) == [f"{socket.gethostname()}:{os.getpid()}"] * 3   # who ran each point
    assert not {"worker host", "worker pid"} & set(table.columns)
    assert len(at.get("plotly_chart")) == 2           # trade-off scatter + curves
    assert len(list((tmp_path / "runs").iterdir())) == 1
    # speciality measured by answer loss: the charts and table change, nothing is recomputed
    at.radio(key="forgetting_measure").set_value("answer_loss").run()
    assert not at.exception, at.exception
    by_loss = at.dataframe[0].value
    assert set(by_loss["measure"]) == {"answer_loss"}
    assert list(by_loss["speciality"]) == list(by_loss["answer loss ↓"]) == list(table["answer loss ↓"])
    assert at.session_state["app_measure"] == "answer_loss"           # one choice for every page
    assert len(list((tmp_path / "runs").iterdir())) == 1
    # a fresh session shows the saved sweep
    again = open_page("forgetting", tiny_llama.pool_yaml)
    again.run()
    assert not again.exception, again.exception
    assert list(again.dataframe[0].value["α"]) == [0.0, 0.5, 1.0]


def test_forgetting_page_pruning_and_bad_grid(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("forgetting", tiny_llama.pool_yaml)
    at.run()
    at.radio(key="forgetting_kind").set_value("pruning").run()
    at.text_input(key="forgetting_ratios").set_value("0, 0.9, 1")
    at.multiselect(key="forgetting_scores").set_value(["fapm", "magnitude"])
    at.session_state["app_max_general"] = 1
    at.session_state["app_max_task"] = 2
    at.button(key="forgetting_run").click().run()
    finish_cleanly(at, "forgetting")
    assert set(at.dataframe[0].value["series"]) == {"fapm", "magnitude"}
    at.text_input(key="forgetting_ratios").set_value("0, 1.5")
    at.button(key="forgetting_run").click().run()
    assert not at.exception
    assert any("[0, 1]" in e.value for e in at.error)


def test_forgetting_sweep_runs_in_the_background_shows_partial_attaches_and_cancels(tiny_llama, tmp_path,
                                                                                   monkeypatch):
    """While the sweep runs: its points so far are drawn, a second click attaches to it, the job is found
    again after a setting changed, and Cancel stops it with nothing saved."""
    import threading

    from forgetlab.analysis import sweeps
    from tests.jobs_helper import running_jobs

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    first_point, gate = threading.Event(), threading.Event()
    real = sweeps.alpha_curve

    def gated(pool, model, *, on_point=None, **kwargs):
        def hook(point, partial):
            on_point(point, partial)
            first_point.set()
            assert gate.wait(60)
        return real(pool, model, on_point=hook if on_point else None, **kwargs)

    monkeypatch.setitem(sweeps.SWEEPS, "alpha", gated)
    at = open_page("forgetting", tiny_llama.pool_yaml)
    at.run()
    at.text_input(key="forgetting_alphas").set_value("0, 0.5, 1")
    at.session_state["app_max_general"] = 2
    at.session_state["app_max_task"] = 3
    try:
        at.button(key="forgetting_run").click().run()
        (job,) = running_jobs("forgetting")
        assert first_point.wait(60)
        at.run()
        assert not at.exception, at.exception
        assert any("1 point(s) so far" in c.value for c in at.caption)       # the partial trade-off chart
        assert len(at.get("plotly_chart")) == 1 and len(at.get("progress")) == 1
        at.button(key="forgetting_run").click().run()                        # impatient second click
        assert running_jobs("forgetting") == [job]
        assert any("already running" in i.value for i in at.info)
        at.text_input(key="forgetting_alphas").set_value("0, 1").run()       # other settings: still shown
        assert len(at.get("progress")) == 1
        at.button(key=f"cancel-{job.key}").click().run()
    finally:
        gate.set()
    assert job.wait(60) and job.status == "cancelled"
    at.run()
    assert not at.exception and any("cancelled; nothing was saved" in i.value for i in at.info)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_forgetting_page_shows_the_sweep_memory_and_refuses_what_will_not_fit(tiny_llama, tmp_path, monkeypatch):
    at = start_page("forgetting", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    assert not at.exception, at.exception
    assert any(c.value.startswith("Memory: needs ≈") and "float32" in c.value for c in at.caption)
    assert not at.button(key="forgetting_run").disabled
    at.session_state["app_dtype"] = "bfloat16"          # the sidebar's Dtype reaches the estimate (and the sweep)
    at.run()
    assert any(c.value.startswith("Memory: needs ≈") and "bfloat16" in c.value for c in at.caption)
    import forgetlab.core.memory as memory

    monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1024)
    at.run()
    assert at.button(key="forgetting_run").disabled
    assert any("device-map" in e.value for e in at.error)     # already bf16: the fix left is spreading the copy
