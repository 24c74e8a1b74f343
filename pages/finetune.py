"""Fine-tune: what if the model had been fine-tuned differently? AdamW vs MoFO vs SFA vs L2, forgetting over steps."""
from __future__ import annotations

import streamlit as st

from forgetlab.analysis.finetune import ANALYSIS, FinetuneSettings, configs_of
from forgetlab.core.memory import dtype_name
from forgetlab.plots.finetune import final_scatter, loss_figure, trajectories_figure
from forgetlab.train.defaults import finetune_defaults
from forgetlab.train.lora import checkpoint_targets
from forgetlab.train.results import FinetuneComparison
from forgetlab.train.mofo import FILTERS, NEEDS_V
from forgetlab.train.runs import L1_DEFAULT, SFA_BETA, SFA_BETA_COMPARE, default_record_every, save_finetuned
from forgetlab.train.trainer import MOFO_OPTIMIZERS, PARTITIONS
from forgetlab.ui.choices import index_of
from forgetlab.ui.errors import show_errors
from forgetlab.ui.executor import session_executor
from forgetlab.ui.glossary import explain, explain_group
from forgetlab.ui.jobs import partial_figure
from forgetlab.ui.measure import sweep_measures
from forgetlab.ui.page import start_page
from forgetlab.ui.panel import AnalysisPanel
from forgetlab.ui.pool import clear_pool_cache
from forgetlab.ui.settings import budget_caption, device_settings
from forgetlab.ui.tables import show_table
from forgetlab.ui.widgets import field_widget, follow_defaults
from forgetlab.ui.studies import show_studies

MENU = ("Fine-tune", ":material/model_training:", 80)    # its entry in the app's menu (forgetlab.ui.navigation)

pool = start_page(MENU, "What if the model had been fine-tuned differently? Fine-tune on a task and watch, every "
                        "few steps, what it gains on the task and what it costs on general text; compare the ways "
                        "of fine-tuning that are meant to forget less on the same data, steps and seed.",
                        how="Generality: held-out general loss (nats, lower is better). Speciality: exact match or "
                            "answer loss on the task's eval pairs. D(θ, θ0): the distance of the weights from the "
                            "start. MoFO updates only the parameters with the largest momentum; SFA averages θ ← (1 "
                            "− β)·θ + β·θ0 every ⌈p·T⌉ steps; L1- and L2-to-init add λ‖θ − θ0‖ to the loss. "
                            "Formulas: docs/methods.md#mofo, #sfa, #l2-to-init, #distance.",
                        needs="tasks", purpose="fine-tuning")


MODEL_KEY, MODEL_OF_KEY = "finetune_model", "finetune_model_of"
# The default comparison: the pool's own fine-tune recipe (forgetlab.train.defaults.finetune_defaults, the same
# numbers `forgetlab finetune POOL --compare` takes), a record every ≤ 10 steps (default_record_every), the
# records' budget below. DEFAULT_SECONDS: measured on the pico demo zoo through the page (AppTest, button pressed
# with the defaults) on 2 CPU cores at load 1.3–1.7, 6 Dec 2026 (docs/zoo.md, "What-if fine-tunes").
DEFAULT_GENERAL, DEFAULT_PAIRS = 16, 50
DEFAULT_TASK = "math"        # the measured default comparison, and the Forgetting page's default model
DEFAULT_SECONDS = "48 s"
# SFA at the paper's β = 0.5 in the same comparison (seed 0): math exact match 0.66 at step 100, 0.04 at the end
SFA_PAPER_PEAK, SFA_PAPER_END = 0.66, 0.04


def plan_caption(runs: int, steps: int, every: int, general: int, pairs: int) -> str:
    """What pressing Fine-tune will do, and how long the default comparison took when measured."""
    records = len({*range(0, steps + 1, every), steps})
    text = (f"{runs} run(s) × {steps} steps, each evaluated {records} times ({general} general blocks, "
            f"{pairs} pairs per task).")
    if DEFAULT_SECONDS:
        text += (f" The default comparison (5 runs) took {DEFAULT_SECONDS} on the pico demo zoo with 2 CPU cores "
                 "shared with other jobs (load 1.3–1.7); fewer steps, records or pairs are faster.")
    return text


def sfa_note() -> str:
    """Why the comparison's SFA averages with β = SFA_BETA_COMPARE by default, not the paper's β (measured on the
    demo zoo)."""
    return (f"SFA's β here is {SFA_BETA_COMPARE:g} by default, not the paper's {SFA_BETA:g}. At {SFA_BETA:g} SFA "
            "collapses on the demo zoo: under the cosine decay its averaging at ¾ of the run meets ≤ 15 % of the peak "
            "learning rate, too little to win back what the averaging removed, and its last averaging, on the last "
            f"step, halves what is left (math exact match {SFA_PAPER_PEAK:.2f} at step 100, {SFA_PAPER_END:.2f} at "
            f"the end). Set β to {SFA_BETA:g} to see it.")


def widget(name: str, key: str, **kw):
    """The Fine-tune page's widget of setting `name` (forgetlab.ui.widgets.field_widget)."""
    return field_widget(FinetuneSettings, name, key=f"finetune_{key}", **kw)


left, right = st.columns([1, 2])
with left:
    task = widget("task", "task", options=pool.task_names, default=pool.task_names[index_of(pool.task_names,
                                                                                            DEFAULT_TASK)])
    start = widget("start", "start", options=["base", *pool.model_names])
    mode = st.radio("mode", ["one run", "comparison"], index=1, horizontal=True, key="finetune_mode",
                    help="comparison: AdamW, MoFO, SFA, L2- and L1-to-init, one run each, with the same steps, lr, "
                         "batches and seed.  \n" + explain_group("finetune"))
    weights = st.radio("trains", ["every weight", "a LoRA adapter"], horizontal=True, key="finetune_weights",
                       help="LoRA trains a low-rank update (α/r)·B·A of chosen layers and leaves the weights "
                            "frozen: far less memory (what fits a 7–8B model on one GPU); the optimizer and the "
                            "fixes then act on A and B.")
    lora = dict(lora=None)
    if weights == "a LoRA adapter":
        c7, c8 = st.columns(2)
        rank = widget("lora", "lora_r", default=16, high=1024, container=c7)
        alpha = widget("lora_alpha", "lora_alpha", default=float(2 * rank), low=0.1, high=1e4, container=c8,
                       help="scale α/r of the update")
        offered = checkpoint_targets(pool.checkpoint(start))
        targets = widget("lora_targets", "lora_targets", options=offered, default=offered)
        lora = dict(lora=rank, lora_alpha=alpha, lora_targets=tuple(targets))  # none chosen: refused, not all
    checkpointing = widget("gradient_checkpointing", "checkpointing")
    recipe = finetune_defaults(pool, task, lora=weights == "a LoRA adapter")     # the CLI's defaults too
    own = ("how this pool's own fine-tunes of the task were trained" if recipe.source != "fallback"
           else "forgetlab's fallback: this pool records no fine-tune recipe")
    beta_default = SFA_BETA_COMPARE if mode == "comparison" else SFA_BETA
    follow_defaults({"finetune_steps": recipe.steps, "finetune_lr": recipe.lr, "finetune_batch": recipe.batch_size,
                     "finetune_sfa_beta": beta_default}, "finetune_defaults")
    c1, c2 = st.columns(2)
    steps = widget("steps", "steps", default=recipe.steps, high=100_000, container=c1, help=f"default: {own}")
    batch = widget("batch_size", "batch", default=recipe.batch_size, high=512, container=c2, help=f"default: {own}")
    seed = widget("seed", "seed", high=2**31 - 1, container=c1,
                  help="the same seed gives every run the same batches in the same order")
    # the whole width: in half a column the field showed 2.25e-4 clipped to "0.0002"
    lr = widget("lr", "lr", default=recipe.lr, low=1e-6, high=1.0, format="%g", help=f"default: {own}")
    c1, c2 = st.columns(2)
    fraction = widget("fraction", "fraction", low=0.01, high=1.0, container=c1,
                      help=explain("mofo") + "  \nShare of each tensor's entries that move per step; 1 = AdamW.")
    sfa_beta = widget("sfa_beta", "sfa_beta", default=beta_default, low=0.0, high=1.0, container=c2,
                      help=explain("sfa") + "  \nβ: weight of the starting weights in each average (0 = plain "
                           f"fine-tuning, 1 = back to the start). The comparison's default {SFA_BETA_COMPARE:g}: "
                           f"the paper's {SFA_BETA:g} collapses on the demo zoo (see the note under the button).")
    sfa_p_help = "SFA p: average every ⌈p·steps⌉ steps (1 = once, at the end: WiSE-FT with α = 1 − β)."
    l1_help = explain("l1") + "  \nλ: strength of the pull (0 = off)."
    l2_help = explain("l2") + "  \nλ: strength of the pull (0 = off)."
    optimizer, mofo = "adamw", dict(filter=FILTERS[0], partition=PARTITIONS[0])
    if mode == "one run":
        optimizer = widget("optimizer", "optimizer", options=["adamw", "mofo", "lion", "mofo-lion"], radio=True,
                           help=explain("adamw", "mofo", "lion", "mofo_lion"))
        if optimizer in MOFO_OPTIMIZERS:      # MoFO's ablations: which entries move, and within which groups
            c1, c2 = st.columns(2)
            mofo = dict(filter=widget("filter", "filter" if optimizer == "mofo" else "filter_lion", container=c1,
                                      help=explain("mofo_filter"),
                                      options=[f for f in FILTERS if optimizer == "mofo" or f not in NEEDS_V]),
                        partition=widget("partition", "partition", container=c2, help=explain("head_partitions")))
        use_sfa = st.checkbox("SFA averaging", key="finetune_use_sfa", help=explain("sfa"))
        sfa_p = widget("sfa_p", "sfa_p", default=0.25, low=0.01, high=1.0, help=sfa_p_help) if use_sfa else None
        l1 = widget("l1", "l1", low=0.0, high=1e6, help=l1_help)
        l2 = widget("l2", "l2", low=0.0, high=1e6, help=l2_help)
    else:
        sfa_p = widget("sfa_p", "cmp_sfa_p", default=0.25, low=0.01, high=1.0, help=sfa_p_help)
        c5, c6 = st.columns(2)
        l2 = widget("l2", "cmp_l2", default=1.0, low=0.0, high=1e6, container=c5, help=l2_help)
        l1 = widget("l1", "cmp_l1", default=L1_DEFAULT, low=0.0, high=1e6, format="%g", container=c6,
                    help=l1_help + " The comparison's default 1e-3 pulls as hard as L2's λ = 1 at a displacement "
                                   "of 1e-3 per weight (docs/methods.md#l1-to-init).")
    c3, c4 = st.columns(2)
    follow_defaults({"finetune_eval_every": default_record_every(steps)}, "finetune_records_default")
    eval_every = widget("eval_every", "eval_every", default=default_record_every(steps), high=100_000,
                        container=c3, help="each record evaluates the model (general loss, speciality, D): the "
                                           "slowest part of a run")
    max_general = widget("max_general", "max_general", default=DEFAULT_GENERAL, high=4096, container=c4,
                         label="general blocks (max)")
    max_task = widget("max_task", "max_task", default=DEFAULT_PAIRS, high=4096, container=c3,
                      label="eval pairs (max)")
    max_length = widget("max_length", "max_length", high=100_000, container=c4, help=explain("max_length"))
    budget_caption(note=f" · this page's in-training records use their own, smaller budget ({int(max_general)} "
                        f"blocks, {int(max_task)} pairs, above) to keep runs quick, so their general loss differs "
                        "from the other pages'")

with right:
    measures = sweep_measures("finetune", pool)
    measure, general = measures.measure, measures.general_measure
    device, dtype = device_settings()
    # a benchmark measure (an lm-eval TASK/METRIC of the pool) is run at every record of every run, with the
    # quick limit of `sweep_measures`; records score the fine-tuned task only (the charts show no other)
    spec = measures.settings.get("benchmarks")
    settings = FinetuneSettings(
        task=task, start=start, optimizer=optimizer, fraction=fraction, **mofo, max_length=max_length, steps=steps,
        batch_size=batch, lr=lr,
        warmup=recipe.warmup, seed=seed, sfa_p=sfa_p, sfa_beta=sfa_beta, l1=l1, l2=l2, compare=mode == "comparison",
        eval_every=eval_every, max_general=max_general, max_task=max_task, device=device, dtype=dtype_name(dtype),
        gradient_checkpointing=checkpointing, measure=measure, general_measure=general,
        lm_eval_include=spec.include if spec else None, limit=spec.limit if spec else None, eval_tasks=(task,),
        **lora)
    runs = len(configs_of(settings, pool))
    panel = AnalysisPanel(ANALYSIS, page="finetune", button="Fine-tune",
                          label=lambda s: f"Fine-tuning {s.start} on {s.task} ({runs} run(s))",
                          executor=lambda s: session_executor() if s.compare else None)   # one run: here
    # the main action at the top of the results, where it is seen without scrolling past the settings
    go = panel.controls(pool, settings)
    st.caption(plan_caption(runs, steps, eval_every, max_general, max_task))
    if mode == "comparison":
        st.caption(sfa_note())

    def show_partial(partial) -> None:
        """A single run's records so far, or the comparison's finished runs."""
        if isinstance(partial, FinetuneComparison):
            st.caption(f"{len(partial.runs)} of {runs} runs done")
            st.plotly_chart(partial_figure(partial, trajectories_figure, measure, general), key="finetune_live")
        else:
            st.caption(f"records so far (step {partial.index[-1]} of {steps})")
            st.line_chart(partial.rename(columns={"general_loss": "general loss ↓",
                                                  "exact_match": f"{task} exact match ↑",
                                                  "answer_loss": f"{task} answer loss ↓"}), height=220)

    def show(result) -> None:
        """The trajectories, the final trade-off, the training loss, the table; a single run's model to keep."""
        if result.model is not None:      # the model moves into this session: the finished job holds no copy
            st.session_state[MODEL_OF_KEY], st.session_state[MODEL_KEY] = result, result.take_model()
        st.subheader(f"{result.start} fine-tuned on {result.task}",
                     help=explain("general_loss", "speciality", "distance"))
        st.plotly_chart(trajectories_figure(result, measure, general), key="finetune_trajectories")
        # stacked, each at the column's full width (side by side they were ~170 px wide at a 1000 px window)
        st.markdown("**Final trade-off**", help=explain("pareto"))
        st.plotly_chart(final_scatter(result, measure, general), key="finetune_final")
        st.markdown("**Training loss**")
        st.plotly_chart(loss_figure(result), key="finetune_loss")
        show_table(result.to_frame(), key="finetune_table")
        traj = result.trajectories()
        st.download_button("Download trajectories (CSV)",
                           traj.drop(columns=[c for c in traj.columns if c.startswith("scorecard")]).to_csv(index=False),
                           file_name=f"finetune-{result.task}.csv", mime="text/csv", key="finetune_csv",
                           on_click="ignore")
        model = st.session_state.get(MODEL_KEY) if st.session_state.get(MODEL_OF_KEY) is result else None
        if model is not None:
            st.markdown("**Keep this model** — add it to the pool so every other page can analyse it.")
            name = st.text_input("name in the pool", f"{result.task}-{result.runs[0].label}",
                                 key="finetune_save_name")
            if st.button("Save into the pool", key="finetune_save"):
                with show_errors():
                    path = save_finetuned(pool, model, name.strip(), run=result.runs[0])
                    clear_pool_cache()
                    st.success(f"Saved {name} to {path} and added it to the pool.")
        elif len(result.runs) > 1:
            st.caption("To save one of these models into the pool, run it alone (mode: one run).")

    panel.results(pool, settings, start=go, show=show, show_partial=show_partial,
                  empty="Configure a run (left) and press Fine-tune.")

show_studies(pool, "finetune")
