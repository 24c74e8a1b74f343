"""The app's sidebar (drawn by app.py on every run): workspace, pool choice, device, evaluation budget, running jobs.

Also the first-run panel: with no pool anywhere, offer to build the pico demo zoo in the background
(`forgetlab.zoo.build`) and open it when it is done.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from forgetlab.core.workspace import use_home
from forgetlab.ui.choices import index_of
from forgetlab.ui.executor import render_executor_settings
from forgetlab.ui.jobs import REGISTRY, job_key, run_once
from forgetlab.ui.settings import (POOL_KEY, pool_path, render_budget_settings, render_device_settings, set_pool_path,
                                   workspace_home, zoo_presets)
from forgetlab.ui.zoo_build import REGISTRY as _jobs
from forgetlab.ui.zoo_build import build_key
from forgetlab.zoo import SIZES, build

OWN = "Your own pool.yaml…"
CHOICE_KEY = "app_pool_choice"
OWN_PATH_KEY = "app_pool_own"
HOME_KEY = "app_workspace"
HOME_APPLIED_KEY = "app_workspace_path"


def render_workspace() -> Path:
    """Show the workspace folder, editable; a change applies to this browser session only (and the jobs it
    starts): other sessions keep theirs (forgetlab.core.workspace.use_home)."""
    chosen = st.session_state.get(HOME_APPLIED_KEY)
    use_home(chosen)
    if st.session_state.get(HOME_KEY) is None:
        st.session_state[HOME_KEY] = str(workspace_home())
    new = st.text_input("Workspace", key=HOME_KEY,
                        help="Folder holding zoo/, merges/ and runs/ (FORGETLAB_HOME by default). Changing "
                             "it applies to this browser session only.").strip()
    if new and Path(new).expanduser() != workspace_home():
        st.session_state[HOME_APPLIED_KEY] = str(Path(new).expanduser())
        use_home(st.session_state[HOME_APPLIED_KEY])
        st.session_state.pop(POOL_KEY, None)
        st.session_state.pop(CHOICE_KEY, None)
    return workspace_home()


def render_pool_choice() -> str | None:
    """Pick a zoo preset of the workspace or the user's own pool.yaml; stores the path for `get_pool()`."""
    presets = zoo_presets()
    options = [*presets, OWN]
    chosen_path = st.session_state.get(POOL_KEY)
    if st.session_state.get(CHOICE_KEY) not in options:
        match = next((n for n, p in presets.items() if chosen_path and str(p) == str(chosen_path)), None)
        if match is None and chosen_path:
            st.session_state[OWN_PATH_KEY] = str(chosen_path)
        st.session_state[CHOICE_KEY] = match or (OWN if chosen_path or not presets else options[0])
    choice = st.selectbox("Model pool", options, key=CHOICE_KEY,
                          help="A demo zoo preset found in the workspace, or a pool.yaml of your own "
                               "(a base, fine-tuned models and probe data).")
    if choice == OWN:
        own = st.text_input("Path to pool.yaml", key=OWN_PATH_KEY, placeholder="~/models/pool.yaml").strip()
        set_pool_path(own or None)
        return own or None
    set_pool_path(presets[choice])
    return pool_path()


def render_jobs() -> None:
    """A line per background job that is running right now (any page, any session)."""
    running = [j for j in REGISTRY.jobs() if j.running]
    if running:
        st.caption("Running: " + "; ".join(f"{j.label} {j.fraction:.0%}" for j in running))


def render_sidebar() -> str | None:
    """Draw the whole sidebar; returns the chosen pool path (None when there is none)."""
    with st.sidebar:
        render_workspace()
        path = render_pool_choice()
        render_device_settings()
        render_budget_settings()
        render_executor_settings()
        render_jobs()
    return path


SIZE_NOTES = {"tiny": "tiny — about a minute, for a first look", "default": "default — a few minutes, clearer effects"}


def render_first_run() -> None:
    """With no pool at all: explain, and offer to build the pico demo zoo in the background, then open it."""

    st.subheader("Welcome to forgetlab")
    st.write("forgetlab shows what fine-tuning changed in a language model and what it cost. It needs a "
             "**model pool**: a base model, fine-tuned versions of it, and probe data. The small demo zoo (a "
             "pico Llama pre-trained on a Wikipedia sample and fine-tuned on three tasks, entirely offline) is "
             "built for you, or enter the path of your own pool.yaml in the sidebar.")
    auto = _jobs.get(build_key(workspace_home()))
    if auto is not None and auto.running:
        st.caption("The demo zoo is being built now (progress above); its base model opens here the moment it "
                   "is saved.")
        return
    sizes = list(SIZES)
    size = st.selectbox("Zoo size", sizes, index=index_of(sizes, "default"),
                        format_func=lambda s: SIZE_NOTES.get(s, s), key="app_zoo_size")
    home = workspace_home()
    key = job_key("zoo-build", str(home), "pico", size)
    clicked = st.button("Build the pico demo zoo", type="primary", key="app_zoo_build")

    def work(progress):
        return build(preset="pico", size=size, home=home, progress=progress)

    result = run_once(key, work, start=clicked, label="Building the pico zoo")
    if result is not None:
        pool_yaml = getattr(result, "pool_yaml", None) or (Path(result) if isinstance(result, (str, Path))
                                                          else None)
        if pool_yaml is not None and str(st.session_state.get(POOL_KEY)) != str(pool_yaml):
            set_pool_path(pool_yaml)
            st.session_state.pop(CHOICE_KEY, None)
            REGISTRY.forget(key)
            st.rerun()
