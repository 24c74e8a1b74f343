"""forgetlab: what did fine-tuning change, and what did it cost? — the Streamlit app.

Start it with `streamlit run app.py`: a server on localhost (see .streamlit/config.toml) that prints the URL
to open. The pages under pages/ are listed in a fixed order when their files exist
(forgetlab.ui.navigation); the sidebar holds the menu (drawn here, not by Streamlit, so that its automatic
list of pages/ never flashes on the first load), the workspace, the model pool and the device. Models and
results are cached by forgetlab.ui, and long jobs run in the background so that switching pages never
reloads or recomputes anything.

This script stays light: torch, transformers and the pool are imported by the pages that need them, after
the sidebar and the page frame are drawn.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from forgetlab.ui.navigation import APP_ICON, build_pages, render_menu

PAGES_DIR = Path(__file__).resolve().parent / "pages"

st.set_page_config(page_title="forgetlab", page_icon=str(APP_ICON), layout="wide")
pages = build_pages(PAGES_DIR)
navigation = st.navigation(pages, position="hidden")
with st.sidebar:
    render_menu(pages)

from forgetlab.ui.sidebar import render_first_run, render_sidebar  # noqa: E402 - after the menu is drawn

from forgetlab.ui.heap import freeze_long_lived  # noqa: E402

from forgetlab.ui.settings import workspace_home  # noqa: E402
from forgetlab.ui.zoo_build import render_build_banner  # noqa: E402

try:
    chosen_pool = render_sidebar()
    render_build_banner(workspace_home(), has_pool=chosen_pool is not None)
    if chosen_pool is None:
        with st.container(border=True):
            render_first_run()
    navigation.run()
finally:
    freeze_long_lived()     # keep the garbage collector off torch & co. (forgetlab/ui/heap.py)
