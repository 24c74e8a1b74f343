"""Sequence: fine-tune through several tasks in turn; what does each later task erase of the earlier ones?"""
from __future__ import annotations

import streamlit as st

from forgetlab.analysis.sequence import ANALYSIS, STRENGTHS, SequenceSettings, options_of
from forgetlab.core.memory import dtype_name
from forgetlab.merge.registry import METHODS, method_title
from forgetlab.plots import figures_html
from forgetlab.plots.sequence import general_loss_figure, heatmaps, op_bwt_figure, score_label, task_lines
from forgetlab.train.defaults import FALLBACK, sequence_defaults
from forgetlab.train.sequence import DEFAULT_COMPARE, SEQUENCE_METHODS, stage_budgets
from forgetlab.ui.glossary import explain, explain_group
from forgetlab.ui.jobs import partial_figure
from forgetlab.ui.page import start_page
from forgetlab.ui.panel import AnalysisPanel
from forgetlab.ui.settings import budget_caption, device_settings, eval_budget
from forgetlab.ui.tables import show_table
from forgetlab.ui.widgets import field_widget

MENU = ("Sequence", ":material/format_list_numbered:", 85)    # its entry in the app's menu (forgetlab.ui.navigation)

pool = start_page(MENU, "What does each new task erase of the ones learned before? Fine-tune the model on several "
                        "tasks one after another, score every task after every stage, and compare the ways of "
                        "fine-tuning (or merging) that are meant to keep the earlier tasks.",
                  how="R[i, j] is task j's score after stage i (stage 0: the base). OP = mean of the last row; "
                      "BWT (TRACE) = (1/T)·Σ_j (R[T, j] − R[j, j]), BWT (GEM) the same over the T − 1 earlier tasks; "
                      "FWT = (1/(T − 1))·Σ_{j≥2} (R[j − 1, j] − R[0, j]); forgetting of task j = max over earlier "
                      "stages of R[i, j] − R[T, j]. The methods: AdamW, MoFO, SFA, L1/L2 to the base, proximal GD "
                      "(L2 to the previous stage), EWC (Fisher-weighted L2 to every finished task), HFT, data "
                      "replay, LoRA per stage, and their combinations. Formulas: docs/methods.md#sequence-metrics, "
                      "#sequence-methods.",
                  needs="tasks", purpose="a task sequence")

DEFAULT_ORDER = ("math", "code", "translate")   # a pool's first tasks in this order when it is no zoo with its own
# The default comparison (7 methods × 3 stages) on the pico demo zoo at lr 1e-3, 2 CPU cores, nothing else running
# (bench/sequence_cost.py, 6 Dec 2026: 143 s wall; 21 single fine-tunes as the Fine-tune page runs them took 174 s).
DEFAULT_SECONDS = "143 s"


def widget(name: str, key: str, **kw):
    """The Sequence page's widget of setting `name` (forgetlab.ui.widgets.field_widget)."""
    return field_widget(SequenceSettings, name, key=f"sequence_{key}", **kw)


panel = AnalysisPanel(ANALYSIS, page="sequence", button="Run the sequence",
                      label=lambda s: f"Training {len(s.methods)} chain(s) through {' → '.join(s.order or ())}")
device, dtype = device_settings()
left, right = st.columns([1, 2])
with left:
    tasks = pool.task_names
    zoo = sequence_defaults(pool)               # a zoo's own sequence (the one its claims measure)
    preferred = zoo.order if zoo is not None else DEFAULT_ORDER
    default_order = list(preferred) if all(t in tasks for t in preferred) else tasks[:3]
    order = widget("order", "order", options=tasks, default=default_order, label="tasks, in training order",
                   help="Pick the tasks in the order the model learns them: the first one picked is trained first.")
    methods = widget("compare", "methods", options=list(SEQUENCE_METHODS),
                     default=list(zoo.methods if zoo is not None else DEFAULT_COMPARE), label="ways of fine-tuning",
                     format_func=lambda m: f"{m}: {SEQUENCE_METHODS[m].title}", help=explain_group("sequence"))
    merges = widget("merge", "merges", options=sorted(METHODS.names()), default=[], label="merge chains (optional)",
                    format_func=method_title, help="Merge the pool's own fine-tunes of the first t tasks, t = 1…T.")
    with st.expander("Strengths of the fixes"):
        c1, c2 = st.columns(2)
        strengths = {name: widget(name, name, container=c)
                     for name, c in (("fraction", c1), ("sfa_p", c2), ("sfa_beta", c1), ("proximal", c2),
                                     ("ewc", c1), ("replay", c2), ("l2", c1), ("l1", c2), ("hft", c1), ("lora", c2))}
    recipe = {}
    with st.expander("Each stage's training"):
        st.caption("By default each stage trains as the pool's own fine-tune of its task was trained (its zoo "
                   "manifest's steps, batch and learning rate, with the zoo's sequence settings where it has them; "
                   "a pool without a manifest: 100 steps of batch 8 at 1e-3).")
        if st.checkbox("the same steps and learning rate for every stage", key="sequence_override"):
            first = stage_budgets(pool, order[:1])[order[0]] if order else FALLBACK
            c1, c2 = st.columns(2)
            recipe = {"steps": widget("steps", "steps", default=first.steps, low=1, container=c1),
                      "lr": widget("lr", "lr", default=first.lr, low=1e-8, format="%g", container=c2)}
    seed = widget("seed", "seed", high=2**31 - 1)
    budget = eval_budget()
    settings = SequenceSettings(order=tuple(order), compare=tuple(methods) or None, merge=tuple(merges) or None,
                                seed=seed, max_general=budget.max_general, max_task=budget.max_task, device=device,
                                dtype=dtype_name(dtype), **strengths, **recipe)
    if len(order) >= 2 and (methods or merges):
        options = options_of(settings, pool)
        steps = {t: b.steps for t, b in options.budgets.items()}
        n_chains = len(settings.methods) + len(merges)
        st.caption(f"{len(settings.methods)} fine-tuning chain(s) × {len(order)} stages "
                   f"({', '.join(f'{t}: {s} steps' for t, s in steps.items())})"
                   f"{f' and {len(merges)} merge chain(s)' if merges else ''}; {n_chains * len(order) + 1} scorings."
                   + (f" The default comparison took {DEFAULT_SECONDS} on the pico demo zoo with 2 idle CPU cores."
                      if DEFAULT_SECONDS else ""))
    budget_caption()
    start = panel.controls(pool, settings, disabled=len(order) < 2 or not (methods or merges))
    if len(order) < 2:
        st.caption("Pick at least two tasks: one task is a plain fine-tune (Fine-tune page).")


def draw(result, partial: bool = False) -> None:
    """The heatmaps of R, each task over the stages, OP against BWT, the general loss; then the tables and the
    downloads."""
    score = st.radio("score", ["exact_match", "answer_loss"], format_func=score_label, horizontal=True,
                     key="sequence_score" + ("_partial" if partial else ""), help=explain("exact match"))
    build = (lambda f, *a: partial_figure(result, f, *a)) if partial else (lambda f, *a: f(result, *a))
    tag = "_partial" if partial else ""
    st.plotly_chart(build(heatmaps, score), key=f"sequence_heatmaps{tag}")
    st.plotly_chart(build(task_lines, score), key=f"sequence_lines{tag}")
    if len(result.chains) > 1:
        st.plotly_chart(build(op_bwt_figure, score), key=f"sequence_op_bwt{tag}")
    st.plotly_chart(build(general_loss_figure), key=f"sequence_general{tag}")
    if partial:
        return
    st.subheader("Metrics per method")
    st.caption(explain("op", "bwt", "fwt", "task_forgetting"))
    show_table(result.summary_frame(), key="sequence_summary")
    with st.expander("Every stage: general loss, distances, time"):
        show_table(result.stage_frame(), key="sequence_stages")
    c1, c2 = st.columns(2)
    c1.download_button("Download matrix.csv", result.matrix_frame().to_csv(index=False), file_name="matrix.csv",
                       mime="text/csv", key="sequence_matrix_csv", on_click="ignore")
    c2.download_button("Download summary.csv", result.summary_frame().to_csv(index=False), file_name="summary.csv",
                       mime="text/csv", key="sequence_summary_csv", on_click="ignore")
    st.download_button("Download the figures (HTML)", lambda: figures_html(ANALYSIS.figures(result, score)),
                       file_name="sequence.html", mime="text/html", key="sequence_html", on_click="ignore")


with right:
    panel.results(pool, settings, start=start, show=draw, show_partial=lambda r: draw(r, partial=True),
                  empty="Pick the tasks in order and the ways of fine-tuning, then press **Run the sequence**.")
