"""Glossary: every term the app uses, in one line each (the same lines its tooltips show), grouped and searchable;
a formula link opens that formula's section of docs/methods.md here (the app serves no files: it runs offline)."""
from __future__ import annotations

import streamlit as st

from forgetlab.ui.glossary import doc_section, glossary_rows
from forgetlab.ui.page import start_page

MENU = ("Glossary", ":material/menu_book:", 100)    # its entry in the app's menu (forgetlab.ui.navigation)

start_page(MENU, "What does each word on the pages mean? One line each — the same text as the pages' ⓘ tooltips; "
                 "the formulas, with their sources, are in docs/methods.md under the anchor each entry gives.",
                 needs=None)

anchor = st.query_params.get("formula")
if anchor:          # a formula link: its section of docs/methods.md, above the list
    section = doc_section(anchor)
    with st.container(border=True, key="glossary_formula"):
        st.caption(f"docs/methods.md#{anchor}")
        if section is None:
            st.warning(f"docs/methods.md has no section {anchor!r} (or the docs are not installed with the app).")
        else:
            st.markdown(section)
        if st.button("Close", key="glossary_close"):
            st.query_params.clear()
            st.rerun()

query = st.text_input("find a term", "", key="glossary_query",
                      placeholder="e.g. Pareto, MoFO, τ, DELLA, iso_c, rise, exact match")
rows = glossary_rows(query)
if not rows:
    st.info(f"No term matches {query!r}.")
elif query:
    st.caption(f"{len(rows)} term(s) match {query!r}.")

sections: dict[str, list[dict]] = {}
for row in rows:
    sections.setdefault(row["section"], []).append(row)
for name, entries in sections.items():
    with st.expander(f"{name} ({len(entries)})", expanded=bool(query) or name == rows[0]["section"]):
        for row in entries:
            st.markdown(f"**{row['term']}** — {row['meaning']}")
            notes = ["also written " + ", ".join(f"`{a}`" for a in row["aliases"])] if row["aliases"] else []
            if row["link"]:
                notes.append(f"formula: [{row['formula']}]({row['link']})")
            if row["source"]:
                notes.append(f"paper: {row['source']}")
            if notes:
                st.caption(" · ".join(notes))
