"""Helpers for the pages' AppTest tests.

`open_page("forgetting", pool_yaml)` is an AppTest of `pages/forgetting.py` with that pool chosen (not yet run).
AppTest runs only the script thread: a page's background job (forgetlab.ui.jobs) must be waited for:
`finish_jobs(at, "forgetting")` waits for every running job whose key starts with that prefix (the page's
name, see `forgetlab.ui.jobs.job_key`) and reruns the page, which then shows the job's result.
"""
from __future__ import annotations

import time
from pathlib import Path

PAGES = Path(__file__).resolve().parents[1] / "pages"


def open_page(name: str, pool_yaml, timeout: float = 180):
    """An AppTest of the page `pages/<name>.py` with `pool_yaml` as the sidebar's pool (call `.run()`)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=timeout)
    at.session_state["forgetlab_pool_path"] = str(pool_yaml)
    return at


def running_jobs(prefix: str = "") -> list:
    """The jobs of the process-wide registry that are running now and whose key starts with `prefix`."""
    from forgetlab.ui.jobs import REGISTRY

    return [j for j in REGISTRY.jobs() if j.running and j.key.startswith(prefix)]


def finish_jobs(at, prefix: str = "", timeout: float = 180.0):
    """Wait (bounded) until the running jobs of `prefix` end, then `at.run()`; returns `at`."""
    deadline = time.monotonic() + timeout
    for job in running_jobs(prefix):
        assert job.wait(max(0.0, deadline - time.monotonic())), f"{job.label} still running after {timeout} s"
    return at.run()


def start_page(name: str, pool_yaml, home, monkeypatch, timeout: float = 180):
    """`open_page` with the workspace at `home` (FORGETLAB_HOME), run once and checked to have raised nothing."""
    monkeypatch.setenv("FORGETLAB_HOME", str(home))
    at = open_page(name, pool_yaml, timeout)
    at.run()
    assert not at.exception, at.exception
    return at


def finish_cleanly(at, prefix: str = "", timeout: float = 180.0):
    """`finish_jobs`, then check that the page raised nothing and shows no error; returns `at`."""
    finish_jobs(at, prefix, timeout)
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    return at
