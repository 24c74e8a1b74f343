"""Streamlit view of "what this zoo shows": the papers' claims as measured at the end of a zoo build.

`render_zoo_claims(pool)` draws the claims that `forgetlab.zoo.claims.zoo_claims` stored in the zoo's manifest,
grouped (fine-tunes, fixes, merges) in expanders closed by default whose headings say how many hold; inside, a
static table per group (✓/✗, the claim, why a ✗ fails, the measured numbers, the paper; all rows, the text
wrapped: no cut-off column, no inner scroll). It draws nothing for a pool that is not a zoo (a user's own pool)
or a zoo whose preset measures no claims. It never computes anything.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from forgetlab.ui.settings import eval_budget
from forgetlab.zoo.claim_reasons import GROUPS, held_text
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
    """Draw the zoo's measured claims under a "What this zoo shows" heading, one folded expander per group
    (fine-tunes, fixes, merges: `forgetlab.zoo.claim_reasons.GROUPS`), each heading saying how many of its claims
    hold and each ✗ saying why; returns whether anything was drawn (False for a pool without stored claims)."""
    claims = stored_claims(pool) if pool is not None else None
    if claims is None:
        return False
    frame = claims.to_frame()
    with st.container(border=True):
        st.subheader("What this zoo shows")
        st.caption(f"The papers' headline claims, measured on this zoo's own models at the end of its build: "
                   f"{held_text(frame['holds'])} here. Speciality is "
                   f"{claims.settings.get('measure', 'exact_match').replace('_', ' ')} on each model's own task "
                   f"({claims.settings.get('max_task')} eval pairs per task, {claims.settings.get('max_general')} "
                   f"held-out blocks); measured in {claims.seconds:.0f} s." + _budget_note(claims))
        for group, heading, about in GROUPS:
            rows = frame[frame["group"] == group]
            if rows.empty:
                continue
            with st.expander(f"{heading}: {held_text(rows['holds'])}", expanded=False):
                st.caption(about.capitalize() + ".")
                columns = ["holds", "claim", "why not", "measured", "source"]
                if not (rows["holds"] != "✓").any():
                    columns.remove("why not")          # every claim holds: no empty column
                # st.table, not st.dataframe: every row and the whole text (wrapped), with no inner scroll
                st.table(rows[columns], hide_index=True)
    return True
