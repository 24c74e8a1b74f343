"""Fine-tune: what if the model had been fine-tuned differently? AdamW vs MoFO vs SFA vs L2, forgetting over steps."""
from __future__ import annotations

import streamlit as st

from forgetlab.analysis.finetune import ANALYSIS, FinetuneSettings, configs_of
from forgetlab.core.memory import dtype_name
from forgetlab.plots.finetune import final_scatter, loss_figure, trajectories_figure
from forgetlab.train.lora import checkpoint_targets
from forgetlab.train.results import FinetuneComparison
from forgetlab.train.runs import L1_DEFAULT, save_finetuned
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
from forgetlab.ui.widgets import field_widget

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
# the default comparison (5 runs) on the pico demo zoo: DEFAULT_SECONDS measured (see the caption below)
# The zoo's own fine-tune recipe (150 steps of 16 pairs at lr 2.25e-4): AdamW learns math (EM 0 → 0.98) at
# +0.048 nats, MoFO keeps 0.96 at +0.031, L2/L1-to-init 0.94 at +0.024/+0.027, SFA (p 0.25, β 0.5) forgets
# nothing and, after its last averaging with θ0 at step 150, keeps nothing of math (EM 0.90 at step 75, before
# the averaging at 76; 0 at 150, D 0.007) — the story in one click. Measured with
# the CLI-equivalent `forgetlab finetune POOL --task math --compare --steps 150 --lr 2.25e-4 --batch-size 16
# --eval-every 75 --max-general 16 --max-task 50`: 30.4 s wall on two idle cores, 2026-12-05 (zoo 594ad755).
DEFAULT_STEPS, DEFAULT_RECORDS, DEFAULT_GENERAL, DEFAULT_PAIRS = 150, 2, 16, 50
DEFAULT_LR, DEFAULT_BATCH = 2.25e-4, 16
DEFAULT_TASK = "math"        # the measured default comparison, and the Forgetting page's default model
DEFAULT_SECONDS = "30 s"


def plan_caption(runs: int, steps: int, every: int, general: int, pairs: int) -> str:
    """What pressing Fine-tune will do, and how long the default comparison took when measured."""
    records = len({*range(0, steps + 1, every), steps})
    text = (f"{runs} run(s) × {steps} steps, each evaluated {records} times ({general} general blocks, "
            f"{pairs} pairs per task).")
    if DEFAULT_SECONDS:
        text += (f" The default comparison (5 runs) took {DEFAULT_SECONDS} on the pico demo zoo with 2 idle "
                 "CPU cores, 40 s beside another process that holds a core; fewer steps, records or pairs are faster.")
    return text


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
    c1, c2 = st.columns(2)
    steps = widget("steps", "steps", default=DEFAULT_STEPS, high=100_000, container=c1)
    lr = widget("lr", "lr", default=DEFAULT_LR, low=1e-6, high=1.0, format="%.6f", container=c2,
                help="default: the demo zoo's own fine-tuning rate")
    batch = widget("batch_size", "batch", default=DEFAULT_BATCH, high=512, container=c1)
    seed = widget("seed", "seed", high=2**31 - 1, container=c2,
                  help="the same seed gives every run the same batches in the same order")
    fraction = widget("fraction", "fraction", low=0.01, high=1.0, container=c1,
                      help=explain("mofo") + "  \nShare of each tensor's entries that move per step; 1 = AdamW.")
    sfa_beta = widget("sfa_beta", "sfa_beta", low=0.0, high=1.0, container=c2,
                      help=explain("sfa") + "  \nβ: weight of the starting weights in each average (0 = plain "
                           "fine-tuning, 1 = back to the start).")
    sfa_p_help = "SFA p: average every ⌈p·steps⌉ steps (1 = once, at the end: WiSE-FT with α = 1 − β)."
    l1_help = explain("l1") + "  \nλ: strength of the pull (0 = off)."
    l2_help = explain("l2") + "  \nλ: strength of the pull (0 = off)."
    optimizer = "adamw"
    if mode == "one run":
        optimizer = widget("optimizer", "optimizer", options=["adamw", "mofo"], radio=True,
                           help=explain("adamw", "mofo"))
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
    eval_every = widget("eval_every", "eval_every", default=max(1, int(steps) // DEFAULT_RECORDS), high=100_000,
                        container=c3, help="each record evaluates the model (general loss, speciality, D): the "
                                           "slowest part of a run")
    max_general = widget("max_general", "max_general", default=DEFAULT_GENERAL, high=4096, container=c4,
                         label="general blocks (max)")
    max_task = widget("max_task", "max_task", default=DEFAULT_PAIRS, high=4096, container=c3,
                      label="eval pairs (max)")
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
        task=task, start=start, optimizer=optimizer, fraction=fraction, steps=steps, batch_size=batch, lr=lr,
        seed=seed, sfa_p=sfa_p, sfa_beta=sfa_beta, l1=l1, l2=l2, compare=mode == "comparison",
        eval_every=eval_every, max_general=max_general, max_task=max_task, device=device, dtype=dtype_name(dtype),
        gradient_checkpointing=checkpointing, measure=measure, general_measure=general,
        lm_eval_include=spec.include if spec else None, limit=spec.limit if spec else None, eval_tasks=(task,),
        **lora)
    runs = len(configs_of(settings))
    panel = AnalysisPanel(ANALYSIS, page="finetune", button="Fine-tune",
                          label=lambda s: f"Fine-tuning {s.start} on {s.task} ({runs} run(s))",
                          executor=lambda s: session_executor() if s.compare else None)   # one run: here
    # the main action at the top of the results, where it is seen without scrolling past the settings
    go = panel.controls(pool, settings)
    st.caption(plan_caption(runs, steps, eval_every, max_general, max_task))

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
