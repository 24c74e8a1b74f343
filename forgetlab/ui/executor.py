"""Sidebar choice of where many-point jobs run (this process, or Ray), kept for the browser session.

`render_executor_settings()` draws it; `session_executor()` gives what a page passes as `executor=` to a sweep
(a fresh `forgetlab.executors.RayExecutor` per job, so each job starts and stops its own workers).
"""
from __future__ import annotations

import streamlit as st

from forgetlab.executors import RayExecutor

EXECUTOR_KEY = "app_executor"
ADDRESS_KEY = "app_executor_address"
WORKERS_KEY = "app_executor_workers"


def render_executor_settings() -> None:
    """Executor selector (local / ray) and, for Ray, the cluster address and the number of workers."""
    st.selectbox("Points run on", ["local", "ray"], key=EXECUTOR_KEY,
                 format_func=lambda v: {"local": "this process", "ray": "Ray workers"}[v],
                 help="Sweeps evaluate many independent models. Ray runs them on workers that each keep the "
                      "base and task vector loaded (one per CPU, or per GPU); the points are the same.")
    if st.session_state.get(EXECUTOR_KEY) == "ray":
        st.text_input("Ray address", key=ADDRESS_KEY, placeholder="blank: start Ray on this machine",
                      help="auto, host:port or ray://host:port of a running cluster")
        st.number_input("Ray workers (0: as many as fit)", min_value=0, value=0, step=1, key=WORKERS_KEY)


def session_executor():
    """"local", or a new RayExecutor with this session's address and worker count."""
    if st.session_state.get(EXECUTOR_KEY, "local") != "ray":
        return "local"

    address = (st.session_state.get(ADDRESS_KEY) or "").strip() or None
    workers = int(st.session_state.get(WORKERS_KEY) or 0) or None
    return RayExecutor(address=address, workers=workers)
