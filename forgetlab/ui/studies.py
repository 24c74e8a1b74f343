"""The app's side of the studies (forgetlab.analysis.study): a page calls `show_studies(pool, "finetune")` and gets,
under **Paper studies**, a pick of the studies that live on it, the paper's claim, the study's own settings (drawn
from its settings' declarations; the budget the pool's own, as the CLI's defaults), its main button and its result
— the table in the paper's form, the figure, the claim beside the measurement — through the one analysis panel.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import streamlit as st

from forgetlab.analysis.base import Analysis
from forgetlab.analysis.study import StudyResult, studies
from forgetlab.core.memory import dtype_name
from forgetlab.core.settings import settings_fields
from forgetlab.plots import figures_html
from forgetlab.ui.panel import AnalysisPanel
from forgetlab.ui.settings import device_settings, eval_budget
from forgetlab.ui.tables import show_table
from forgetlab.ui.widgets import field_widget

# Settings the page fills in itself: the sidebar's device, dtype and evaluation budget.
FROM_SIDEBAR = {"device", "dtype", "max_general", "max_task"}
JS_MAX = 2**53 - 1          # the largest whole number a browser's number box holds


def pool_names(pool, name: str) -> list[str] | None:
    """The pool's names a setting called `name` picks from: tasks for task/tasks, fine-tunes for model/models."""
    if name in ("task", "tasks"):
        return list(pool.task_names)
    if name in ("model", "models"):
        return [m for m in pool.model_names if m != "base"]
    return None


def study_settings(pool, analysis: Analysis, key: str) -> Any:
    """The study's settings from its widgets: its pool names (task, models) and every setting with a default of
    its own (grids, fractions, seed, draws); settings whose default is the pool's own (None: steps, lr, …) keep it,
    as on the CLI; device, dtype and the evaluation budget come from the sidebar."""
    values: dict[str, Any] = {}
    for info in settings_fields(analysis.settings):
        if info.name in FROM_SIDEBAR or not info.spec.cli:
            continue
        names = pool_names(pool, info.name)
        if names is not None:
            if info.sequence:           # left empty: the study's own default (its help says which)
                default = [n for n in (info.default or ()) if n in names]
                values[info.name] = tuple(st.multiselect(info.label, names, default=default,
                                                         key=f"{key}_{info.name}", help=info.spec.help,
                                                         placeholder="the study's default")) or None
            else:
                default = info.default if info.default in names else (names[0] if names else None)
                values[info.name] = st.selectbox(info.label, names, index=names.index(default) if default else 0,
                                                 key=f"{key}_{info.name}", help=info.spec.help)
        elif info.default is not None:
            hi = (info.spec.range or (None, None))[1]
            browser_max = 2**31 - 1 if hi is not None and hi > JS_MAX else None    # a seed's 64 bits: too wide
            values[info.name] = field_widget(analysis.settings, info.name, key=f"{key}_{info.name}", high=browser_max)
    device, dtype = device_settings()
    budget = eval_budget()
    sidebar = {"device": device, "dtype": dtype_name(dtype), "max_general": budget.max_general,
               "max_task": budget.max_task}
    known = {f.name for f in settings_fields(analysis.settings)}
    settings = analysis.make_settings(**{k: v for k, v in values.items() if v is not None})
    return replace(settings, **{k: v for k, v in sidebar.items() if k in known})


def show_result(analysis: Analysis, key: str):
    """A study's result: the figure, the table in the paper's form, and the two files `--out` writes."""

    def show(result: StudyResult) -> None:
        for i, fig in enumerate(analysis.figures(result)):
            st.plotly_chart(fig, key=f"{key}_figure_{i}")
        show_table(result.table, key=f"{key}_table")
        st.caption(f"{result.seconds:.0f} s. The same table and figure: `forgetlab study {analysis.study.name} POOL "
                   f"--out DIR`.")
        c1, c2 = st.columns(2)
        c1.download_button("Download table.csv", result.table.to_csv(index=False), file_name="table.csv",
                           mime="text/csv", key=f"{key}_csv", on_click="ignore")
        c2.download_button("Download figure.html", lambda: figures_html(analysis.figures(result)),
                           file_name="figure.html", mime="text/html", key=f"{key}_html", on_click="ignore")
    return show


def show_studies(pool, page: str) -> None:
    """The studies of `page` (module docstring); nothing where the page has none."""
    found = studies(page)
    if not found:
        return
    st.divider()
    st.subheader("Paper studies")
    st.caption("Each reproduces one table or figure of the five papers on this pool and puts the paper's claim "
               "beside what it measures here (docs/studies.md holds the measurements on the pico demo zoo).")
    by_name = {a.study.name: a for a in found}
    name = st.selectbox("study", list(by_name), key=f"{page}_study_pick",
                        format_func=lambda n: f"{n} — {by_name[n].study.paper}, {by_name[n].study.artifact}")
    analysis = by_name[name]
    info = analysis.study
    st.markdown(f"**{info.title[:1].upper() + info.title[1:]}.** The paper's claim: {info.claim}")
    key = f"study_{info.name.replace('-', '_')}"
    panel = AnalysisPanel(analysis, page=key, button="Run the study",
                          label=lambda s: f"{info.paper}, {info.artifact}")
    left, right = st.columns([1, 2])
    with left:
        settings = study_settings(pool, analysis, key)
        start = panel.controls(pool, settings)
    with right:
        panel.results(pool, settings, start=start, show=show_result(analysis, key),
                      empty=f"Press **Run the study** to measure the claim on this pool.")
