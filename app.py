"""forgetlab: what did fine-tuning change, and what did it cost? — the Streamlit app.

Start it with `streamlit run app.py` (listens on localhost, see .streamlit/config.toml). The pages under
views/ are listed in a fixed order when their files exist (forgetlab.ui.navigation); the sidebar picks the
workspace, the model pool and the device. Models and results are cached by forgetlab.ui, and long jobs run
in the background so that switching pages never reloads or recomputes anything.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from forgetlab.ui.navigation import existing_pages
from forgetlab.ui.sidebar import render_first_run, render_sidebar

# Not "pages/": Streamlit would list that folder in its own sidebar menu for a moment on the first load,
# before st.navigation replaces it.
PAGES_DIR = Path(__file__).resolve().parent / "views"

st.set_page_config(page_title="forgetlab", page_icon=":material/science:", layout="wide")
navigation = st.navigation([
    st.Page(str(PAGES_DIR / f"{p.stem}.py"), title=p.title, icon=p.icon, url_path=p.stem, default=(i == 0))
    for i, p in enumerate(existing_pages(PAGES_DIR))
])
if render_sidebar() is None:
    with st.container(border=True):
        render_first_run()
navigation.run()
