"""forgetlab: what did fine-tuning change, and what did it cost? — the Streamlit app.

Start it with `streamlit run app.py` (listens on localhost, see .streamlit/config.toml). The pages under
pages/ are listed in a fixed order when their files exist; the sidebar picks the workspace, the model pool
and the device. Everything the pages compute is cached (forgetlab.ui) and saved under the workspace.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from forgetlab.ui.sidebar import render_first_run, render_sidebar

HERE = Path(__file__).resolve().parent

# (file stem, title, icon): the fixed order of the navigation.
PAGES = [
    ("models", "Models", ":material/hub:"),
    ("linearity", "Linearity", ":material/show_chart:"),
    ("forgetting", "Forgetting", ":material/trending_down:"),
    ("features", "Features", ":material/scatter_plot:"),
    ("merge", "Merge", ":material/merge:"),
    ("finetune", "Fine-tune", ":material/model_training:"),
    ("runs", "Runs", ":material/history:"),
]


def existing_pages() -> list[st.Page]:
    """An st.Page for every page file that exists, in the fixed order (the first is the default)."""
    found = [(stem, title, icon) for stem, title, icon in PAGES if (HERE / "pages" / f"{stem}.py").is_file()]
    return [st.Page(str(HERE / "pages" / f"{stem}.py"), title=title, icon=icon, url_path=stem,
                    default=(i == 0)) for i, (stem, title, icon) in enumerate(found)]


st.set_page_config(page_title="forgetlab", page_icon=":material/science:", layout="wide")
navigation = st.navigation(existing_pages())
pool = render_sidebar()
if pool is None:
    with st.container(border=True):
        render_first_run()
navigation.run()
