"""What every page starts with — its title (the one its MENU declares), the question it answers in plain words, how
it is computed behind an expander, and the pool it needs, stopping with a hint when the pool lacks what the page
works on — and what every page's action ends with: its takeaway, one or two sentences with their numbers."""
from __future__ import annotations

from typing import Iterable, Optional

import streamlit as st

from forgetlab.core.pool import ModelPool
from forgetlab.ui.navigation import page_header
from forgetlab.ui.pool import require_finetuned, require_pool, require_tasks

NEEDS = ("pool", "finetuned", "tasks", "finetuned+tasks")


def start_page(menu: tuple, question: str, *, how: str = "", needs: Optional[str] = "pool",
               purpose: str = "") -> Optional[ModelPool]:
    """Draw the page's title (`menu[0]`, its MENU's title), its question in plain words and, when given, `how`
    (markdown: the formulas and symbols) in a folded "How this is computed" expander; then return the sidebar's
    pool. `needs` says what the page works on ("pool", "finetuned": a fine-tuned model, "tasks": probe data, or
    both; None: no pool), and the page stops with a hint naming `purpose` when the pool lacks it."""
    page_header(menu[0], question)
    if how:
        with st.expander("How this is computed"):
            st.markdown(how)
    if needs is None:
        return None
    if needs not in NEEDS:
        raise ValueError(f"needs must be one of {NEEDS}; got {needs!r}")
    pool = require_pool()
    if "finetuned" in needs:
        require_finetuned(pool, purpose)
    if "tasks" in needs:
        require_tasks(pool, purpose)
    return pool


def show_takeaway(lines: Iterable[str], key: str = "takeaway") -> None:
    """The action's takeaway — one or two sentences built from its result, each with its number and unit — in a
    box of its own (`st-key-<key>` in the page's HTML, which the browser tests read); nothing when empty."""
    lines = [line for line in lines if line]
    if not lines:
        return
    with st.container(key=key):
        st.success("  \n".join(lines), icon=":material/lightbulb:")
