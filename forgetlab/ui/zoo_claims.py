"""Streamlit view of "what this zoo shows": the papers' claims as measured at the end of a zoo build.

`render_zoo_claims(pool)` draws the table that `forgetlab.zoo.claims.zoo_claims` stored in the zoo's manifest
(✓/✗, the claim, the measured numbers, the paper) whole, as a static table (all rows, the measured text
wrapped: no cut-off column, no inner scroll); it draws nothing for a pool that is not a zoo (a user's own
pool) or a zoo whose preset measures no claims. It never computes anything.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from forgetlab.ui.settings import eval_budget
from forgetlab.zoo.claims import stored_claims

if TYPE_CHECKING:  # pragma: no cover
    from forgetlab.core.pool import ModelPool


def _budget_note(claims) -> str:
    """A warning sentence when the claims were measured at another budget than the app's (sidebar)."""
    app = eval_budget()
    if (claims.settings.get("max_general"), claims.settings.get("max_task")) == (app.max_general, app.max_task):
        return " Same evaluation budget as the rest of the app."
    return (" **Another evaluation budget than the app's** (sidebar: " + app.describe() + "), so its held-out losses "
            "differ from the scorecards below.")


def render_zoo_claims(pool: "ModelPool | None") -> bool:
    """Draw the zoo's measured claims under a "What this zoo shows" heading; returns whether anything was
    drawn (False for a pool without stored claims)."""
    claims = stored_claims(pool) if pool is not None else None
    if claims is None:
        return False
    frame = claims.to_frame()
    held = int((frame["holds"] == "✓").sum())
    with st.container(border=True):
        st.subheader("What this zoo shows")
        st.caption(f"The papers' headline claims, measured on this zoo's own models at the end of its build: "
                   f"{held} of {len(frame)} hold here. Speciality is "
                   f"{claims.settings.get('measure', 'exact_match').replace('_', ' ')} on each model's own task "
                   f"({claims.settings.get('max_task')} eval pairs per task, {claims.settings.get('max_general')} "
                   f"held-out blocks); measured in {claims.seconds:.0f} s." + _budget_note(claims))
        # st.table, not st.dataframe: every row and the whole "measured" text (wrapped), with no inner scroll
        st.table(frame[["holds", "claim", "measured", "source"]], hide_index=True)
    return True
