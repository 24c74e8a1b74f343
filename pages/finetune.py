"""Fine-tune: what if the model had been fine-tuned differently? AdamW vs MoFO vs SFA vs L2, forgetting over steps."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from forgetlab.plots.finetune import final_scatter, loss_figure, trajectories_figure
from forgetlab.train.runs import (L1_DEFAULT, FinetuneComparison, FinetuneConfig, compare, finetune,
                                  save_finetune_run, save_finetuned, standard_configs)
from forgetlab.ui.errors import show_errors
from forgetlab.ui.jobs import job_key, run_once
from forgetlab.ui.pool import clear_pool_cache, require_pool, require_tasks
from forgetlab.ui.settings import budget_caption, device_settings, workspace_home
from forgetlab.ui.glossary import explain, explain_group
from forgetlab.core.memory import dtype_name
from forgetlab.train.lora import checkpoint_targets
from forgetlab.ui.jobs import partial_figure
from forgetlab.ui.memory import memory_check
from forgetlab.ui.measure import sweep_measures
from forgetlab.ui.navigation import page_header
from forgetlab.ui.tables import show_table
from forgetlab.ui.choices import index_of

MENU = ("Fine-tune", ":material/model_training:", 80)    # its entry in the app's menu (forgetlab.ui.navigation)

page_header("Fine-tune",
            "Fine-tune on a task and watch what it costs: held-out general loss, speciality and the distance "
            "D(θ, θ0) from the starting weights, every few steps. Compare the training-time fixes on the same "
            "data, steps and seed.")

pool = require_pool()
require_tasks(pool, "fine-tuning")

RESULT_KEY, MODEL_KEY = "finetune_result", "finetune_model"
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


left, right = st.columns([1, 2])
with left:
    task = st.selectbox("task", pool.task_names, key="finetune_task", index=index_of(pool.task_names, DEFAULT_TASK))
    start = st.selectbox("start from", ["base", *pool.model_names], key="finetune_start")
    mode = st.radio("mode", ["one run", "comparison"], index=1, horizontal=True, key="finetune_mode",
                    help="comparison: AdamW, MoFO, SFA, L2- and L1-to-init, one run each, with the same steps, lr, "
                         "batches and seed.  \n" + explain_group("finetune"))
    weights = st.radio("trains", ["every weight", "a LoRA adapter"], horizontal=True, key="finetune_weights",
                       help="LoRA trains a low-rank update (α/r)·B·A of chosen layers and leaves the weights "
                            "frozen: far less memory (what fits a 7–8B model on one GPU); the optimizer and the "
                            "fixes then act on A and B.")
    lora = dict(lora=0)
    if weights == "a LoRA adapter":
        c7, c8 = st.columns(2)
        rank = c7.number_input("LoRA rank r", 1, 1024, 16, key="finetune_lora_r")
        alpha = c8.number_input("LoRA α", 0.1, 1e4, float(2 * rank), key="finetune_lora_alpha",
                                help="scale α/r of the update (default 2·r)")
        offered = checkpoint_targets(pool.checkpoint(start))
        targets = st.multiselect("adapted layers", offered, default=offered, key="finetune_lora_targets")
        lora = dict(lora=int(rank), lora_alpha=float(alpha), lora_targets=targets)  # none chosen: refused, not all
    checkpointing = st.checkbox("gradient checkpointing", key="finetune_checkpointing",
                                help="recompute each layer's activations in the backward pass instead of keeping "
                                     "them: less memory, about a third more time")
    c1, c2 = st.columns(2)
    steps = c1.number_input("steps", 1, 100_000, DEFAULT_STEPS, key="finetune_steps",
                            help="training steps of each run (one batch each)")
    lr = c2.number_input("learning rate", 1e-6, 1.0, DEFAULT_LR, format="%.6f", key="finetune_lr",
                         help="default: the demo zoo's own fine-tuning rate")
    batch = c1.number_input("batch size", 1, 512, DEFAULT_BATCH, key="finetune_batch")
    seed = c2.number_input("seed", 0, 2**31 - 1, 0, key="finetune_seed",
                           help="the same seed gives every run the same batches in the same order")
    fraction = c1.number_input("MoFO fraction", 0.01, 1.0, 0.2, key="finetune_fraction",
                               help=explain("mofo") + "  \nShare of each tensor's entries that move per step; "
                                    "1 = AdamW.")
    sfa_beta = c2.number_input("SFA β", 0.0, 1.0, 0.5, key="finetune_sfa_beta",
                               help=explain("sfa") + "  \nβ: weight of the starting weights in each average "
                                    "(0 = plain fine-tuning, 1 = back to the start).")
    sfa_p_help = "SFA p: average every ⌈p·steps⌉ steps (1 = once, at the end: WiSE-FT with α = 1 − β)."
    l1_help = explain("l1") + "  \nλ: strength of the pull (0 = off)."
    l2_help = explain("l2") + "  \nλ: strength of the pull (0 = off)."
    if mode == "one run":
        optimizer = st.radio("optimizer", ["adamw", "mofo"], horizontal=True, key="finetune_optimizer",
                             help=explain("adamw", "mofo"))
        use_sfa = st.checkbox("SFA averaging", key="finetune_use_sfa", help=explain("sfa"))
        sfa_p = (st.number_input("SFA p", 0.01, 1.0, 0.25, key="finetune_sfa_p", help=sfa_p_help)
                 if use_sfa else None)
        l1 = st.number_input("L1-to-init λ", 0.0, 1e6, 0.0, key="finetune_l1", help=l1_help)
        l2 = st.number_input("L2-to-init λ", 0.0, 1e6, 0.0, key="finetune_l2", help=l2_help)
    else:
        sfa_p = st.number_input("SFA p", 0.01, 1.0, 0.25, key="finetune_cmp_sfa_p", help=sfa_p_help)
        c5, c6 = st.columns(2)
        l2 = c5.number_input("L2-to-init λ", 0.0, 1e6, 1.0, key="finetune_cmp_l2", help=l2_help)
        l1 = c6.number_input("L1-to-init λ", 0.0, 1e6, L1_DEFAULT, format="%g", key="finetune_cmp_l1",
                             help=l1_help + " The comparison's default 1e-3 pulls as hard as L2's λ = 1 at a "
                                            "displacement of 1e-3 per weight (docs/methods.md#l1-to-init).")
    c3, c4 = st.columns(2)
    eval_every = c3.number_input("record every k steps", 1, 100_000, max(1, int(steps) // DEFAULT_RECORDS),
                                 key="finetune_eval_every",
                                 help="each record evaluates the model (general loss, speciality, D): the "
                                      "slowest part of a run")
    max_general = c4.number_input("general blocks (max)", 1, 4096, DEFAULT_GENERAL, key="finetune_max_general")
    max_task = c3.number_input("eval pairs (max)", 1, 4096, DEFAULT_PAIRS, key="finetune_max_task")
    budget_caption(note=f" · this page's in-training records use their own, smaller budget ({int(max_general)} "
                        f"blocks, {int(max_task)} pairs, above) to keep runs quick, so their general loss differs "
                        "from the other pages'")

with right:
    measures = sweep_measures("finetune", pool)
    measure, general = measures.measure, measures.general_measure
    device, dtype = device_settings()
    # a benchmark measure (an lm-eval TASK/METRIC of the pool) is run at every record of every run
    # records score the fine-tuned task only (the charts show no other): a third of the evaluation time
    common = dict(start=start, eval_every=int(eval_every), max_general=int(max_general), max_task=int(max_task),
                  eval_tasks=[task], device=device, dtype=dtype_name(dtype), gradient_checkpointing=checkpointing,
                  **measures.settings)
    if mode == "one run":
        label = optimizer if optimizer == "adamw" else f"mofo-{fraction:g}"
        label += f"+sfa-p{sfa_p:g}" if sfa_p else ""
        label += f"+l1-{l1:g}" if l1 else ""
        label += f"+l2-{l2:g}" if l2 else ""
        configs = [FinetuneConfig(label=label, optimizer=optimizer, steps=int(steps), lr=float(lr),
                                  batch_size=int(batch), seed=int(seed), fraction=float(fraction), sfa_p=sfa_p,
                                  sfa_beta=float(sfa_beta), l1=float(l1), l2=float(l2), **lora)]
    else:
        configs = standard_configs(int(steps), float(lr), batch_size=int(batch), seed=int(seed),
                                   fraction=float(fraction), sfa_p=float(sfa_p), sfa_beta=float(sfa_beta), l2=float(l2),
                                   l1=float(l1), **lora)
    # the main action at the top of the results, where it is seen without scrolling past the settings
    fits = memory_check("finetune", pool=pool, task=task, configs=configs, start=start, device=device,
                        dtype=dtype, gradient_checkpointing=checkpointing)
    go = st.button("Fine-tune", type="primary", key="finetune_run", disabled=not fits)
    st.caption(plan_caption(len(configs), int(steps), int(eval_every), int(max_general), int(max_task)))

    def work(progress):
        """The fine-tune(s), publishing what is recorded so far, then saved; one run keeps its model too."""
        model = None
        if mode == "one run":
            records: list[dict] = []

            def on_record(step, rec) -> None:
                records.append({"step": step, "general loss ↓": rec["general_loss"],
                                f"{task} exact match ↑": rec["exact_match"],
                                f"{task} answer loss ↓": rec.get("answer_loss")})
                progress.publish(pd.DataFrame(records).set_index("step"))

            run, model = finetune(pool, task, configs[0], progress=progress, return_model=True,
                                  on_record=on_record, **common)
            result = FinetuneComparison(task, start, [run], {"task": task, "start": start,
                                                             "configs": [configs[0].to_dict()]})
            result.mark_pareto(measure, general)
        else:
            from forgetlab.ui.executor import session_executor

            result = compare(pool, task, configs, progress=progress, measure=measure, general_measure=general,
                             executor=session_executor(), **common,
                             on_run=lambda run, partial: progress.publish(FinetuneComparison(
                                 partial.task, partial.start, list(partial.runs), partial.recipe)))
        return {"result": result, "model": model, "path": save_finetune_run(result)}

    def show_partial(partial) -> None:
        if isinstance(partial, pd.DataFrame):
            st.caption(f"records so far (step {partial.index[-1]} of {int(steps)})")
            st.line_chart(partial, height=220)
        else:
            st.caption(f"{len(partial.runs)} of {len(configs)} runs done")
            st.plotly_chart(partial_figure(partial, trajectories_figure, measure, general), key="finetune_live")

    def keep(done: dict) -> None:
        # the model moves into this session: the finished job (kept for other tabs) must not hold a model copy
        st.session_state[RESULT_KEY], st.session_state[MODEL_KEY] = done["result"], done.pop("model", None)
        st.toast(f"Saved under {done['path']}")

    key = job_key("finetune", pool.key, str(workspace_home()), task, [c.to_dict() for c in configs], common)
    run_once(key, work, start=go, label=f"Fine-tuning {start} on {task} ({len(configs)} run(s))", slot="finetune",
             on_done=keep, show_partial=show_partial)

    result = st.session_state.get(RESULT_KEY)
    if result is None:
        st.info("Configure a run (left) and press Fine-tune.")
    else:
        st.subheader(f"{result.start} fine-tuned on {result.task}",
                     help=explain("general_loss", "speciality", "distance"))
        st.plotly_chart(trajectories_figure(result, measure, general), key="finetune_trajectories")
        # stacked, each at the column's full width (side by side they were ~170 px wide at a 1000 px window)
        st.markdown("**Final trade-off**", help=explain("pareto"))
        st.plotly_chart(final_scatter(result, measure, general), key="finetune_final")
        st.markdown("**Training loss**")
        st.plotly_chart(loss_figure(result), key="finetune_loss")
        frame = result.to_frame()
        show_table(frame, key="finetune_table")
        traj = result.trajectories()
        st.download_button("Download trajectories (CSV)",
                           traj.drop(columns=[c for c in traj.columns if c.startswith("scorecard")]).to_csv(index=False),
                           file_name=f"finetune-{result.task}.csv", mime="text/csv", key="finetune_csv",
                           on_click="ignore")
        model = st.session_state.get(MODEL_KEY)
        if model is not None and len(result.runs) == 1:
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
