"""A Streamlit progress adapter: the core's `progress(fraction, message)` callback drawn as st.status + bar."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

import streamlit as st

ProgressCallback = Callable[[float, str], None]


@contextmanager
def progress_bar(label: str, *, min_interval: float = 0.1) -> Iterator[ProgressCallback]:
    """Yield a `progress(fraction, message)` callback that drives an st.status box with an st.progress bar.

    Updates are throttled to one every `min_interval` seconds (the final 1.0 always shows). On success the
    status turns "complete"; on an exception it turns "error" and the exception propagates (wrap the call
    in `show_errors()` to show it). Use it from the script thread only; background jobs use `run_once`.
    """
    status = st.status(label, expanded=True, state="running")
    with status:
        bar = st.progress(0.0, text=label)
    last = [0.0]

    def report(fraction: float, message: str = "") -> None:
        f = min(1.0, max(0.0, float(fraction)))
        now = time.monotonic()
        if f < 1.0 and now - last[0] < min_interval:
            return
        last[0] = now
        bar.progress(f, text=f"{label} — {message}" if message else label)

    try:
        yield report
    except BaseException:
        status.update(label=f"{label}: failed", state="error", expanded=False)
        raise
    bar.progress(1.0, text=f"{label} — done")
    status.update(label=f"{label}: done", state="complete", expanded=False)
