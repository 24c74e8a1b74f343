"""The app shell and the Streamlit adapters in forgetlab.ui (AppTest, no browser)."""
from __future__ import annotations

import threading
import time

import pytest
from streamlit.testing.v1 import AppTest

from forgetlab.ui.jobs import CANCELLED, DONE, FAILED, JobRegistry, job_key

# ---------------------------------------------------------------- job registry (pure python)


def _gated(gate: threading.Event, value):
    def fn(progress):
        progress(0.5, "half")
        assert gate.wait(10)
        progress(1.0, "end")
        return value
    return fn


def test_second_start_attaches_to_the_running_job():
    reg, gate, calls = JobRegistry(), threading.Event(), []

    def fn(progress):
        calls.append(1)
        return _gated(gate, 42)(progress)

    job1, started1 = reg.start("k", fn)
    job2, started2 = reg.start("k", fn)
    assert started1 and not started2 and job2 is job1
    gate.set()
    assert job1.wait(10)
    assert (job1.status, job1.result, job1.fraction, len(calls)) == (DONE, 42, 1.0, 1)
    job3, started3 = reg.start("k", fn)          # finished: a new click reruns it
    assert started3 and job3 is not job1
    job3.wait(10)
    assert len(calls) == 2


def test_many_threads_clicking_at_once_start_one_copy():
    reg, gate, calls = JobRegistry(), threading.Event(), []

    def fn(progress):
        calls.append(1)
        gate.wait(10)
        return "x"

    barrier = threading.Barrier(8)
    results = []

    def click():
        barrier.wait()
        results.append(reg.start("same-output", fn))

    threads = [threading.Thread(target=click) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gate.set()
    assert sum(started for _, started in results) == 1
    assert len({id(job) for job, _ in results}) == 1
    results[0][0].wait(10)
    assert len(calls) == 1


def test_cancel_stops_at_next_progress_and_failure_is_kept():
    reg, gate = JobRegistry(), threading.Event()
    job, _ = reg.start("c", _gated(gate, 1))
    while job.fraction < 0.5:
        time.sleep(0.01)
    job.cancel()
    gate.set()
    job.wait(10)
    assert job.status == CANCELLED and job.result is None

    def boom(progress):
        raise ValueError("bad")

    bad, _ = reg.start("b", boom)
    bad.wait(10)
    assert bad.status == FAILED and isinstance(bad.error, ValueError) and "ValueError: bad" in bad.traceback


def test_registry_prunes_old_finished_jobs_but_keeps_running_ones():
    reg, gate = JobRegistry(keep_finished=2), threading.Event()
    running, _ = reg.start("run", _gated(gate, 0))
    for i in range(5):
        j, _ = reg.start(f"f{i}", lambda p, i=i: i)
        j.wait(10)
    reg.start("last", lambda p: 0)[0].wait(10)
    keys = {j.key for j in reg.jobs()}
    assert "run" in keys and len(keys) <= 4
    gate.set()
    running.wait(10)


def test_job_key_is_stable_and_depends_on_every_part():
    a = job_key("merge", "/out", {"alpha": 0.5, "b": [1, 2]})
    assert a == job_key("merge", "/out", {"b": [1, 2], "alpha": 0.5})
    assert a != job_key("merge", "/out", {"alpha": 0.6, "b": [1, 2]})
    assert a.startswith("merge-")

# ---------------------------------------------------------------- adapters inside a Streamlit script


def _errors_script():
    import streamlit as st

    from forgetlab.errors import ParameterError
    from forgetlab.ui import show_errors

    with show_errors():
        raise ParameterError("alpha must lie in [0, 1]; got 2. Pass a value between 0 and 1.")
    with show_errors():
        raise ValueError("kaput")
    with show_errors():
        st.stop() if st.session_state.get("stop") else None
    st.write("still alive")


def test_show_errors_keeps_the_page_alive():
    at = AppTest.from_function(_errors_script).run(timeout=30)
    assert not at.exception
    errors = [e.value for e in at.error]
    assert errors[0] == "alpha must lie in [0, 1]; got 2. Pass a value between 0 and 1."
    assert errors[1].startswith("Unexpected error: ValueError: kaput") and "still usable" in errors[1]
    assert at.expander[0].label == "Traceback" and "kaput" in at.expander[0].code[0].value
    assert at.markdown[-1].value == "still alive"
    at.session_state["stop"] = True       # st.stop() must pass through show_errors, not be shown as error
    at.run(timeout=30)
    assert not at.exception and len(at.error) == 2 and not any(m.value == "still alive" for m in at.markdown)


def _progress_script():
    import streamlit as st

    from forgetlab.ui import progress_bar, show_errors

    seen = []
    with progress_bar("Scoring") as progress:
        for i in range(5):
            progress(i / 4, f"step {i}")
            seen.append(i)
    st.write(f"steps {len(seen)}")
    with show_errors():
        with progress_bar("Failing") as progress:
            progress(0.2, "")
            raise RuntimeError("no")


def test_progress_bar_completes_and_marks_failures():
    at = AppTest.from_function(_progress_script).run(timeout=30)
    assert not at.exception
    assert at.markdown[0].value == "steps 5"
    statuses = [b for b in at.main.children.values() if type(b).__name__ == "Status"]
    assert [(s.label, s.icon) for s in statuses] == [("Scoring: done", ":material/check:"),
                                                     ("Failing: failed", ":material/error:")]
    assert "Unexpected error: RuntimeError: no" in at.error[0].value


def _device_script():
    import streamlit as st

    from forgetlab.ui import device_settings, render_device_settings

    with st.sidebar:
        render_device_settings()
    device, dtype = device_settings()
    st.write(f"{device} {dtype}")


def test_device_settings_default_to_cpu_and_follow_the_sidebar():
    import torch

    at = AppTest.from_function(_device_script).run(timeout=30)
    assert not at.exception
    assert at.sidebar.selectbox(key="app_device").options == (["cpu", "cuda"] if torch.cuda.is_available()
                                                              else ["cpu"])
    at.sidebar.selectbox(key="app_dtype").set_value("bfloat16").run(timeout=30)
    assert at.markdown[0].value.endswith("torch.bfloat16")


def _job_script():
    import threading

    import streamlit as st

    from forgetlab.ui import run_once

    gate = st.session_state.setdefault("gate", threading.Event())

    def work(progress):
        progress(0.3, "working")
        gate.wait(10)
        return 7

    clicked = st.button("Go")
    result = run_once(st.session_state.get("key", "job-test"), work, start=clicked, label="Test job")
    if result is not None:
        st.write(f"result {result}")


def test_run_once_shows_progress_then_result_and_ignores_a_second_click():
    from forgetlab.ui.jobs import REGISTRY

    key = f"job-test-{time.time()}"
    at = AppTest.from_function(_job_script)
    at.session_state["key"] = key
    at.run(timeout=30)
    assert REGISTRY.get(key) is None and not at.markdown
    at.button[0].click().run(timeout=30)
    job = REGISTRY.get(key)
    assert job is not None and job.running
    at.button[0].click().run(timeout=30)          # second click while running: attaches
    assert REGISTRY.get(key) is job
    assert any("already running" in i.value for i in at.info)
    at.session_state["gate"].set()
    job.wait(10)
    at.run(timeout=30)
    assert not at.exception
    assert [m.value for m in at.markdown] == ["result 7"]
