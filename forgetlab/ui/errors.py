"""Show errors on a page: a ForgetlabError as its message, anything else as a short note plus the traceback.

The page keeps running after the `with show_errors():` block, so one failed action never blanks the page.
Streamlit's own control-flow exceptions (st.stop, st.rerun) derive from BaseException and pass through.
"""
from __future__ import annotations

import traceback
from contextlib import contextmanager
from typing import Iterator

import streamlit as st

from forgetlab.core.errors import ForgetlabError


def render_error(exc: BaseException, tb: str | None = None) -> None:
    """Draw one error: st.error with the message for a ForgetlabError, else a short error + traceback."""
    if isinstance(exc, ForgetlabError):
        st.error(str(exc), icon="⚠️")
        return
    st.error(f"Unexpected error: {type(exc).__name__}: {exc}; the page is still usable.", icon="🚨")
    with st.expander("Traceback"):
        st.code(tb or "".join(traceback.format_exception(exc)), language="text")


@contextmanager
def show_errors() -> Iterator[None]:
    """Run the block; show a ForgetlabError or unexpected exception on the page instead of crashing it."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - the point is to keep the page alive
        render_error(exc, traceback.format_exc())
