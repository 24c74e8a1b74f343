"""Opening the Text page (pages/text.py) from another page: a model (a WiSE-FT point, a merge) to score against
the base, or a saved text diff to show."""
from __future__ import annotations

import streamlit as st

REQUEST_KEY = "text_request"      # {"model": name, "alpha": float | None, "against": "base"}: preset and run
OPEN_RUN_KEY = "text_open_run"    # the folder of a saved textdiff run to show
PAGE = "pages/text.py"


def _switch(done: str) -> None:
    """Go to the Text page; a page run alone (no navigation) says what waits instead."""
    try:
        st.switch_page(PAGE)
    except Exception:  # noqa: BLE001 - a page run alone (tests) has no navigation: the request waits in the session
        st.success(done)


def open_text_view(model: str, alpha: float | None = None, against: str = "base") -> None:
    """Go to the Text page with `model` (at WiSE-FT point `alpha` when given) preset against `against`; the page
    scores the held-out split at once."""
    st.session_state[REQUEST_KEY] = {"model": model, "alpha": None if alpha is None else float(alpha),
                                     "against": against}
    _switch("Text view ready: open the Text page.")


def open_saved_text_view(path) -> None:
    """Go to the Text page showing the text diff saved at `path` (a runs/ folder)."""
    st.session_state[OPEN_RUN_KEY] = str(path)
    _switch("Saved text diff ready: open the Text page.")


def clicked_alpha(event) -> float | None:
    """The α of the first point clicked on a WiSE-FT curves chart (the event st.plotly_chart returns with
    on_select="rerun"; its points' x is α), None when nothing is selected."""
    try:
        points = event["selection"]["points"]
    except (KeyError, TypeError):
        return None
    xs = [p.get("x") for p in points if isinstance(p, dict) and isinstance(p.get("x"), (int, float))]
    return float(xs[0]) if xs else None


def alpha_point_link(model: str, event, key: str) -> None:
    """Under a WiSE-FT curves chart: a button opening the clicked point's text view against the base."""
    alpha = clicked_alpha(event)
    if alpha is None:
        st.caption("Click a point of the curves to open its text view against the base.")
    elif st.button(f"Open α = {alpha:g} of {model} in the Text view (against the base)", key=key):
        open_text_view(model, alpha)
