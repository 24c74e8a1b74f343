"""Glossary: every term the app uses, in one line each (the same lines its tooltips show)."""
from __future__ import annotations

import streamlit as st

from forgetlab.ui.glossary import glossary_rows
from forgetlab.ui.page import start_page

MENU = ("Glossary", ":material/menu_book:", 100)    # its entry in the app's menu (forgetlab.ui.navigation)

start_page(MENU, "What does each word on the pages mean? One line each — the same text as the pages' ⓘ tooltips; "
                 "the formulas, with their sources, are in docs/methods.md under the anchor each entry gives.",
                 needs=None)

query = st.text_input("find a term", "", key="glossary_query", placeholder="e.g. Pareto, MoFO, τ")
rows = glossary_rows(query)
if not rows:
    st.info(f"No term matches {query!r}.")
for row in rows:
    st.markdown(f"**{row['term']}** — {row['meaning']}")
    if row["formula"]:
        st.caption(f"formula: {row['formula']}")
