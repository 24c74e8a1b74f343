"""Runs: everything saved under the workspace — reopen a run's charts, compare runs, download results."""
from __future__ import annotations

import json

import streamlit as st

from forgetlab.core import workspace as ws
from forgetlab.ui.errors import show_errors
from forgetlab.ui.pool import get_pool
from forgetlab.ui.measure import speciality_measure
from forgetlab.ui.navigation import require_app
from forgetlab.ui.page import show_takeaway, start_page
from forgetlab.ui.runs import (compare_figures, compare_frame, figure_html, run_figures, run_label, run_takeaway,
                               runs_table)
from forgetlab.ui.tables import measure_view, show_table

MENU = ("Runs", ":material/history:", 90)    # its entry in the app's menu (forgetlab.ui.navigation)

require_app()     # a page opened by its URL on a fresh server: go through app.py


def _mtime(path) -> float:
    return path.stat().st_mtime if path.exists() else 0.0


@st.cache_data(show_spinner=False, max_entries=8)
def _runs(root: str, mtime: float):
    """Saved runs, re-read only when the runs folder changes (a run added, renamed or deleted)."""
    return ws.list_runs()


@st.cache_data(show_spinner=False, max_entries=8)
def _merges(root: str, mtime: float):
    return ws.list_merges()


@st.cache_data(show_spinner=False, max_entries=64)
def _figures(run_id: str, mtime: float, measure: str, _run):
    """A run's charts, rebuilt only when its folder or the measure changes (switching back redraws from cache)."""
    return run_figures(_run, measure)


def _downloads(figs, key: str) -> None:
    cols = st.columns(max(1, len(figs)))
    for i, (fig, col) in enumerate(zip(figs, cols)):
        col.download_button(f"Figure {i + 1} (HTML)", data=lambda fig=fig: figure_html(fig),
                            file_name=f"{key}-figure{i + 1}.html", mime="text/html", key=f"runs_fig_{key}_{i}",
                            on_click="ignore")


def show_run(run) -> None:
    """One run: its recipe, results table, charts and downloads."""
    st.subheader(run_label(run))
    if run.kind == "textdiff" and st.button("Open in the Text view", key=f"runs_text_{run.id}"):
        from forgetlab.ui.textview import open_saved_text_view

        open_saved_text_view(run.path)
    with st.expander("Recipe", expanded=False):
        st.json(run.recipe)
    show_takeaway(run_takeaway(run), key="runs_takeaway")
    with show_errors():
        frame = run.frame()
        figs = _figures(str(run.path), _mtime(run.path), measure, run)
        for i, fig in enumerate(figs):
            st.plotly_chart(fig, key=f"runs_chart_{run.id}_{i}")
        show_table(measure_view(frame, measure), key=f"runs_table_{run.id}")
        c1, c2 = st.columns(2)
        if frame is not None:
            c1.download_button("Results (CSV)", frame.to_csv(index=False), file_name=f"{run.id}.csv",
                               mime="text/csv", key=f"runs_csv_{run.id}", on_click="ignore")
        c2.download_button("Recipe (JSON)", json.dumps(run.recipe, indent=2), file_name=f"{run.id}-recipe.json",
                           mime="application/json", key=f"runs_recipe_{run.id}", on_click="ignore")
        if figs:
            _downloads(figs, run.id)
        if frame is None and not figs:
            st.json(run.results, expanded=False)


def show_comparison(runs) -> None:
    """Two or more runs of the same kind on one chart each metric, plus the stacked table."""
    kinds = sorted({r.kind for r in runs})
    if len(kinds) > 1:
        st.warning(f"These runs are of different kinds ({', '.join(kinds)}); select runs of one kind to "
                   "compare them on one chart.")
        return
    st.subheader(f"Comparing {len(runs)} {kinds[0]} runs")
    with show_errors():
        frame = compare_frame(runs)
        figs = compare_figures(runs, measure)
        if not figs:
            st.info("These runs saved no table with numeric results to chart.")
        for i, fig in enumerate(figs):
            st.plotly_chart(fig, key=f"runs_compare_{i}")
        if not frame.empty:
            show_table(measure_view(frame, measure), key="runs_compare_table")
            st.download_button("Compared results (CSV)", frame.to_csv(index=False), file_name="comparison.csv",
                               mime="text/csv", key="runs_compare_csv", on_click="ignore")
        if figs:
            _downloads(figs, "comparison")
    for run in runs:
        with st.expander(f"Recipe of {run_label(run)}"):
            st.json(run.recipe)


def show_merges(merges) -> None:
    """Merged models saved under merges/: their recipe.yaml, downloadable."""
    if not merges:
        st.info(f"No merged models yet in {ws.merges_dir()}. The Merge page saves them there.")
        return
    name = st.selectbox("Merged model", [m.name for m in merges], key="runs_merge")
    folder = next(m for m in merges if m.name == name)
    recipe = (folder / "recipe.yaml").read_text()
    st.caption(str(folder))
    st.code(recipe, language="yaml")
    st.download_button("Recipe (YAML)", recipe, file_name=f"{name}-recipe.yaml", mime="application/x-yaml",
                       key="runs_merge_recipe", on_click="ignore")
    files = sorted(p.name for p in folder.iterdir() if p.is_file())
    st.caption("Files: " + ", ".join(files))
    with show_errors():
        from forgetlab.merge.workflow import cards_frame, load_merge
        from forgetlab.plots.merge import scorecard_figure

        saved = load_merge(folder)
        if saved.cards:
            st.markdown("**Scorecard** — the merge beside its base and parents, as evaluated when it was made")
            st.plotly_chart(scorecard_figure(saved.cards, measure, merged=[name]), key="runs_merge_chart")
            show_table(cards_frame(saved.cards, merged=[name]), key="runs_merge_table")
        else:
            st.caption("This merge was not evaluated (no scorecards.json); the Merge page evaluates its merges.")
start_page(MENU, "What has been computed so far? Every analysis, sweep, merge and fine-tune saved in the workspace: "
                 "reopen its charts, compare runs of one kind on one chart, download results (CSV), figures (HTML "
                 "here; PNG with the camera icon above each chart) and merge recipes.", needs=None)

measure = speciality_measure("runs", get_pool(show=False))
runs, merges = [], []
with show_errors():
    runs = _runs(str(ws.runs_dir()), _mtime(ws.runs_dir()))
    merges = _merges(str(ws.merges_dir()), _mtime(ws.merges_dir()))

tab_runs, tab_merges = st.tabs([f"Runs ({len(runs)})", f"Merged models ({len(merges)})"])
with tab_runs:
    if not runs:
        st.info(f"No runs saved yet in {ws.runs_dir()}. The other pages save each run here.")
    else:
        kinds = sorted({r.kind for r in runs})
        kind = st.selectbox("Kind", ["all", *kinds], key="runs_kind")
        shown = [r for r in runs if kind == "all" or r.kind == kind]
        show_table(runs_table(shown), key="runs_list")
        by_id = {r.id: r for r in shown}
        chosen = st.multiselect("Open runs (pick two or more of one kind to compare)", list(by_id),
                                default=list(by_id)[:1], format_func=lambda i: run_label(by_id[i]),
                                key=f"runs_open_{kind}")
        picked = [by_id[i] for i in chosen]
        if len(picked) == 1:
            show_run(picked[0])
        elif len(picked) > 1:
            show_comparison(picked)
with tab_merges:
    show_merges(merges)
