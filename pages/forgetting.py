"""Forgetting: what does each post-hoc fix buy in speciality and cost in generality, over its setting?"""
from __future__ import annotations

from dataclasses import replace

import pandas as pd
import streamlit as st

from forgetlab.analysis.base import ANALYSES
from forgetlab.analysis.retention import ENDPOINTS, relative_frame
from forgetlab.analysis.studies.fapm import PAPER_RATIO
from forgetlab.analysis.sweep_analysis import EVALUATION, X_WORDS, SweepSettings
from forgetlab.analysis.sweeps import KINDS, default_task, list_sweeps, load_sweep
from forgetlab.core.memory import dtype_name
from forgetlab.core.settings import settings_fields
from forgetlab.plots.forgetting import curves_figure, tradeoff_figure
from forgetlab.plots.relative import relative_figure
from forgetlab.ui.choices import index_of
from forgetlab.ui.errors import show_errors
from forgetlab.ui.glossary import explain, explain_group
from forgetlab.ui.jobs import partial_figure
from forgetlab.ui.measure import sweep_measures
from forgetlab.ui.page import start_page
from forgetlab.ui.panel import AnalysisPanel
from forgetlab.ui.settings import budget_caption, device_settings, eval_budget
from forgetlab.ui.tables import show_table
from forgetlab.ui.textview import alpha_point_link
from forgetlab.ui.widgets import field_widget
from forgetlab.ui.studies import show_studies

MENU = ("Forgetting", ":material/trending_down:", 30)    # its entry in the app's menu (forgetlab.ui.navigation)

pool = start_page(MENU, "How much of the new skill can you keep while giving back what fine-tuning made the model "
                        "forget? Each point of a sweep is a model between the base and the fine-tune: the best "
                        "settings keep the skill high and the general-text loss low.",
                        how="A sweep builds models from the base θ0 and the task vector τ = θ1 − θ0 at each "
                            "setting: WiSE-FT θ(α) = (1 − α)·θ0 + α·θ1, FAPM pruning θ0 + mask ⊙ τ, DARE / TIES "
                            "density, HMA (one α per block of layers), LiNeS, TSV rank, Iso-C. Generality: held-out "
                            "general loss (nats, lower is better); speciality: exact match or answer loss on the "
                            "task. The Pareto front marks the settings that no other setting beats on both "
                            "(docs/methods.md#pareto-front); the best trade-off is its point with the largest "
                            "rescaled speciality minus rescaled general loss (docs/methods.md#best-tradeoff).",
                        needs="finetuned", purpose="sweep")


ANALYSIS = {kind: ANALYSES.get(f"sweep-{kind}") for kind in KINDS}
DEFAULT_MODEL = "math"      # the README's examples sweep the demo zoo's math model
# the page's own words beside a grid's declared help, and the widget keys that differ from forgetting_<setting>
EXTRA_HELP = {"alphas": explain("alpha"),
              "ratios": explain("fapm") + "  \nratio: share of each tensor's task-vector entries zeroed.",
              "drops": explain("dare"), "keeps": explain("ties"),
              "grid": explain("hma") + "  \nOne line per point: the α of each block, first to last."}
KEYS = {("alpha", "methods"): "forgetting_alpha_methods", ("density", "methods"): "forgetting_density_methods",
        ("hma", "grid"): "forgetting_hma"}


def grid_widgets(kind: str) -> dict | None:
    """The widgets of a kind's own settings (its grid), from their declarations; None while one is unreadable."""
    values = {}
    for info in settings_fields(ANALYSIS[kind].settings):
        if info.name in EVALUATION:
            continue
        values[info.name] = field_widget(ANALYSIS[kind].settings, info.name,
                                         key=KEYS.get((kind, info.name), f"forgetting_{info.name}"),
                                         help=EXTRA_HELP.get(info.name),
                                         high=2**31 - 1 if info.name == "seed" else None)
    return None if any(v is None for v in values.values()) else values


left, right = st.columns([1, 2])
with left:
    names = list(pool.model_names)
    model = field_widget(SweepSettings, "model", key="forgetting_model", options=names,
                         default=names[index_of(names, DEFAULT_MODEL)])
    task_options = ["(mean over tasks)", *pool.task_names]
    task_choice = st.selectbox("speciality task", task_options, index=index_of(task_options, default_task(pool, model)),
                               key=f"forgetting_task_{model}", help=explain("speciality"))
    task = None if task_choice == task_options[0] else task_choice
    measures = sweep_measures("forgetting", pool)
    kind = st.radio("sweep", list(KINDS), format_func=lambda k: ANALYSIS[k].title, key="forgetting_kind",
                    help=explain_group("sweeps"))
    grid = grid_widgets(kind)
    budget = eval_budget()
    budget_caption(budget)
    device, dtype = device_settings()
    settings = ANALYSIS[kind].make_settings(model=model, task=task, max_general=budget.max_general,
                                            max_task=budget.max_task, device=device, dtype=dtype_name(dtype),
                                            **(grid or {}), **measures.values)
    panel = AnalysisPanel(ANALYSIS[kind], page="forgetting", button="Run sweep",
                          label=lambda s: f"{ANALYSIS[kind].title} of {s.model}")
    start = panel.controls(pool, settings, disabled=grid is None)


def show_partial(partial) -> None:
    """The trade-off of the points so far, while the sweep runs."""
    st.caption(f"{len(partial.points)} point(s) so far")
    st.plotly_chart(partial_figure(partial, tradeoff_figure, task=partial.task, measure=measures.measure,
                                   general_measure=measures.general_measure), key="forgetting_live")


def _view(result):
    """A copy of a sweep to draw in this session's measures (the cached result stays as computed)."""
    return replace(result, points=[replace(p) for p in result.points])


def show(current) -> None:
    """The sweep with the saved sweeps of its model chosen beside it: one trade-off chart, each sweep's curves
    (an α point opens the Text view), the table and its download."""
    saved = list_sweeps(model=current.model)
    labels = {r.id: f"{r.kind.removeprefix('sweep-')} · {r.id}" for r in saved}
    chosen = st.multiselect("saved sweeps of this model to show beside it", list(labels), format_func=labels.get,
                            key=f"forgetting_saved_{current.model}") if saved else []
    results, ids = [_view(current)], ["latest"]
    with show_errors():
        for r in saved:
            if r.id in chosen:
                loaded = load_sweep(r.path)
                if loaded.recipe != current.recipe:
                    results.append(loaded)
                    ids.append(r.id[-6:])
    for r in results:
        r.task = task if task is not None else r.task
    measures.apply(results)
    st.subheader("Speciality vs generality, every series", help=explain_group("tradeoff"))
    st.plotly_chart(tradeoff_figure(results, task=task, ids=ids), key="forgetting_tradeoff")
    relative = any(r.x_name in ENDPOINTS for r in results) and st.toggle(
        "relative axes (FAPM paper)", key="forgetting_relative",
        help="Redraw the pruning and α curves as the share of the fine-tuning gain kept and the share of the "
             "forgetting recovered, in % (docs/methods.md#relative-shares).")
    for i, r in enumerate(results):
        st.subheader(f"{ANALYSIS[r.kind].title if r.kind in ANALYSIS else r.kind} · {r.model}",
                     help=explain("speciality", "general_loss", "distance"))
        r.mark_pareto()
        if relative and r.x_name in ENDPOINTS:
            with show_errors():
                st.plotly_chart(relative_figure(relative_frame(r), x_title=X_WORDS.get(r.x_name, r.x_name),
                                                mark=PAPER_RATIO if r.x_name == "ratio" else None,
                                                title=f"{r.model} on relative axes"), key=f"forgetting_relative_{i}")
            continue
        event = st.plotly_chart(curves_figure(r), key=f"forgetting_curves_{i}", on_select="rerun",
                                selection_mode="points")
        if r.kind == "alpha":
            alpha_point_link(r.model, event, key=f"forgetting_text_{i}")
    frame = pd.concat([r.to_frame() for r in results], ignore_index=True)
    show_table(frame, key="forgetting_table")
    st.download_button("Download table (CSV)", frame.to_csv(index=False), file_name=f"forgetting-{model}.csv",
                       mime="text/csv", key="forgetting_csv", on_click="ignore")


with right:
    panel.results(pool, settings, start=start, show=show, show_partial=show_partial, model=model,
                  empty="Run a sweep (left) or pick a saved one to see its curves.")

show_studies(pool, "forgetting")
