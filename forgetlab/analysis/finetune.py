"""What-if fine-tunes as one analysis: fine-tune a pool model on a task's train pairs — once, or AdamW, MoFO, SFA,
L2- and L1-to-init side by side on the same data, steps and seed — recording generality, speciality and
D(θ, θ0) every few steps (docs/methods.md#forgetting, #mofo, #sfa), and optionally save the fine-tuned model
into the pool.

The training is `forgetlab.train` (`runs.finetune` / `runs.compare`); this module declares the settings once
(the CLI's `forgetlab finetune` flags and the Fine-tune page's widgets), turns them into the runs' configs and
labels (`configs_of`: one function for the CLI and the page), and tells the CLI, the app's panel and the Runs
page how to show a result. A comparison's runs are points on the executor (one run per Ray worker); a single
run trains in this process, so that its model can be saved into the pool afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import pandas as pd

from forgetlab.analysis.base import ANALYSES, Analysis, Output
from forgetlab.analysis.measures import (change_text, check_general_measure, check_measure, general_measure_field,
                                         higher_is_better, limit_field, lm_eval_include_field, measure_benchmarks,
                                         measure_field)
from forgetlab.core.errors import ParameterError
from forgetlab.core.evaluate import forgetting_text
from forgetlab.core.progress import Progress
from forgetlab.core.settings import count_field, device_field, dtype_field, seed_field, setting
from forgetlab.plots.finetune import final_scatter, loss_figure, runs_of, trajectories_figure
from forgetlab.train.memory import estimate_finetune
from forgetlab.train.defaults import FALLBACK, finetune_defaults
from forgetlab.train.results import FinetuneComparison, FinetuneConfig, single_run_comparison
from forgetlab.train.runs import (L1_DEFAULT, SFA_BETA, SFA_BETA_COMPARE, check_save_as, check_start, compare,
                                  config_label, finetune, save_finetuned, standard_configs)
from forgetlab.train.mofo import FILTERS
from forgetlab.train.trainer import OPTIMIZERS, PARTITIONS, SCHEDULES, check_optimizer

SFA_P_DEFAULT, L2_DEFAULT = 0.25, 1.0
"""The comparison's SFA p and L2-to-init λ when none is given (L1's: `forgetlab.train.runs.L1_DEFAULT`)."""
POOL_DEFAULT = (f" (default: how the pool's own fine-tunes of the task were trained, as its zoo manifest records; "
                f"a pool without that record: {FALLBACK.steps} steps of batch {FALLBACK.batch_size} at lr "
                f"{FALLBACK.lr:g}, warm-up {FALLBACK.warmup})")


@dataclass
class FinetuneSettings:
    """One fine-tune of `start` on `task` (or, with `compare`, the five fixes side by side), how it trains, what
    it records every `eval_every` steps, and where it runs."""

    task: Optional[str] = setting(None, help="the task to fine-tune on (its train split)", required=True)
    start: str = setting("base", help="the pool model to start from", label="start from")
    optimizer: str = setting("adamw", help="the optimizer of a single run (lion, mofo-lion: Lion and MoFO on Lion, "
                                           "docs/methods.md#lion)", choices=OPTIMIZERS)
    fraction: float = setting(0.2, help="MoFO update fraction", label="MoFO fraction")
    filter: str = setting("momentum", help="which entries MoFO moves (mofo, mofo-lion; with --compare its MoFO run): "
                                           "momentum (MoFO's own), gradient, mv (m/√v), gv (g/√v) or random (random "
                                           "BCD); docs/methods.md#mofo-filters", choices=FILTERS, label="MoFO filter")
    partition: str = setting("tensor", help="MoFO's partitions (mofo, mofo-lion; with --compare its MoFO run): tensor "
                                            "(each weight tensor) or head (q, k, v and o of each attention head); "
                                            "docs/methods.md#head-partitions", choices=PARTITIONS,
                             label="MoFO partitions")
    steps: Optional[int] = count_field(None, "training steps of each run (one batch each)" + POOL_DEFAULT)
    batch_size: Optional[int] = count_field(None, "training batch size" + POOL_DEFAULT)
    lr: Optional[float] = setting(None, help="peak learning rate" + POOL_DEFAULT, label="learning rate",
                                  range=(0.0, None))
    weight_decay: float = setting(0.0, help="AdamW's decoupled weight decay")
    warmup: Optional[int] = setting(None, help="linear warm-up steps before the cosine decay" + POOL_DEFAULT,
                                    range=(0, None), cli_type="number")
    schedule: str = setting("cosine", help="learning-rate schedule after the warm-up", choices=SCHEDULES)
    seed: int = seed_field("seed of the batch order, dropout and LoRA's initial weights")
    sfa_p: Optional[float] = setting(None, help="SFA: average with the start every ⌈p·T⌉ steps; with --compare the "
                                                f"SFA run's p (default there {SFA_P_DEFAULT:g})", label="SFA p")
    sfa_beta: Optional[float] = setting(None, help=f"SFA: θ ← (1 − β)·θ + β·θo (default {SFA_BETA:g}, the paper's); "
                                                   f"with --compare the SFA run's β (default there "
                                                   f"{SFA_BETA_COMPARE:g}: see docs/zoo.md)", label="SFA β",
                                        range=(0.0, 1.0))
    l1: float = setting(0.0, help="L1-to-init penalty λ (loss + λ‖θ − θo‖₁); with --compare the L1-to-init run's λ "
                                  f"(default there {L1_DEFAULT:g})", label="L1-to-init λ")
    l2: float = setting(0.0, help="L2-to-init penalty λ (loss + λ/2‖θ − θo‖²); with --compare the L2-to-init run's "
                                  f"λ (default there {L2_DEFAULT:g})", label="L2-to-init λ")
    hft: float = setting(0.0, help="HFT (Half Fine-Tuning): the share of each layer's attention and MLP matrices "
                                   "frozen for the run (0.5: the paper's half; 0: off); a single run only, any "
                                   "optimizer; docs/methods.md#hft", label="HFT frozen share", range=(0.0, 1.0))
    compare: bool = setting(False, help="run AdamW, MoFO, SFA, L2- and L1-to-init with these steps/lr/seed instead "
                                        "of one run")
    eval_every: Optional[int] = count_field(None, "record every k steps (default: ten records, at most 10 steps "
                                                  "apart up to 300 steps)",
                                            label="record every k steps")
    max_general: Optional[int] = count_field(None, "at most this many general-text blocks")
    max_task: Optional[int] = count_field(None, "at most this many eval pairs per task")
    max_train: Optional[int] = count_field(None, "at most this many training pairs")
    max_length: int = setting(256, help="training sequence length: the tokens kept of each training pair (its answer "
                                        "and the end of its prompt)", range=(2, None),
                              label="training sequence length")
    device: Optional[str] = device_field(default_cuda=True)
    dtype: Optional[str] = dtype_field("the weights, gradients and optimizer state")
    gradient_checkpointing: bool = setting(False, help="recompute each layer's activations in the backward pass "
                                                       "instead of keeping them (less memory, about a third more "
                                                       "time)")
    lora: Optional[int] = setting(None, help="train a LoRA adapter of rank R ≥ 1 instead of every weight (saved "
                                             "with --save-as as a PEFT adapter); the optimizer and the fixes act on "
                                             "the adapter's parameters. Leave it out for a full fine-tune",
                                  range=(1, None), cli_type="rank", metavar="R", label="LoRA rank r")
    lora_alpha: Optional[float] = setting(None, help="LoRA alpha (default 2·R)", metavar="A", label="LoRA α")
    lora_targets: Optional[tuple[str, ...]] = setting(
        None, help="modules that get an adapter (default: every linear layer of the blocks by the model's own "
                   "names, e.g. q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj for Llama, qkv_proj,o_proj,"
                   "gate_up_proj,down_proj for Phi-3; a MoE's experts cannot have one)", cli_type="names",
        metavar="NAME[,NAME…]", label="adapted layers")
    save_as: Optional[str] = setting(None, help="save the fine-tuned model into the pool under this name")
    measure: str = measure_field("at every record")
    general_measure: str = general_measure_field("at every record")
    lm_eval_include: Optional[str] = lm_eval_include_field()
    limit: Optional[int] = limit_field()
    eval_tasks: Optional[tuple[str, ...]] = setting(None, help="tasks scored at every record (default: every task "
                                                               "of the pool)", cli=False)


def with_pool_defaults(settings: FinetuneSettings, pool=None) -> FinetuneSettings:
    """The settings with steps, batch size, lr and warm-up left out (None) filled in from the pool's own fine-tune
    recipe (`forgetlab.train.defaults.finetune_defaults` of the task, of its LoRA adapters for a LoRA run): the
    one source of those defaults for the CLI and the Fine-tune page."""
    recipe = finetune_defaults(pool, settings.task, lora=bool(settings.lora))
    given = {k: getattr(settings, k) for k in ("steps", "batch_size", "lr", "warmup")}
    return replace(settings, **{k: getattr(recipe, k) if v is None else v for k, v in given.items()})


def configs_of(settings: FinetuneSettings, pool=None) -> list[FinetuneConfig]:
    """The runs these settings ask for: with `compare`, the standard comparison (`standard_configs`: SFA p, L2
    and L1 λ from the settings where given, else the comparison's defaults); else one config named by
    `config_label` ("lora16-mofo-0.2+l2-0.5"). Steps, batch size, lr and warm-up left out come from the pool
    (`with_pool_defaults`). The CLI and the Fine-tune page both name their runs here."""
    settings = with_pool_defaults(settings, pool)
    lora = dict(lora=settings.lora or 0, lora_alpha=settings.lora_alpha,
                lora_targets=list(settings.lora_targets) if settings.lora_targets is not None else None)
    if settings.compare:
        return standard_configs(settings.steps, settings.lr, batch_size=settings.batch_size, seed=settings.seed,
                                warmup=settings.warmup, fraction=settings.fraction, filter=settings.filter,
                                partition=settings.partition,
                                sfa_p=settings.sfa_p or SFA_P_DEFAULT,
                                sfa_beta=SFA_BETA_COMPARE if settings.sfa_beta is None else settings.sfa_beta,
                                l2=settings.l2 or L2_DEFAULT,
                                l1=settings.l1 or L1_DEFAULT, **lora)
    label = config_label(settings.optimizer, fraction=settings.fraction, sfa_p=settings.sfa_p, l1=settings.l1,
                         l2=settings.l2, lora=settings.lora, filter=settings.filter, partition=settings.partition,
                         hft=settings.hft)
    return [FinetuneConfig(label=label, optimizer=settings.optimizer, steps=settings.steps,
                           batch_size=settings.batch_size, lr=settings.lr, weight_decay=settings.weight_decay,
                           fraction=settings.fraction, filter=settings.filter, partition=settings.partition,
                           warmup=settings.warmup, schedule=settings.schedule,
                           seed=settings.seed, sfa_p=settings.sfa_p,
                           sfa_beta=SFA_BETA if settings.sfa_beta is None else settings.sfa_beta, l1=settings.l1,
                           l2=settings.l2, hft=settings.hft, **lora)]


def check_settings(settings: FinetuneSettings, pool=None) -> None:
    """What the declarations cannot say: LoRA options only with a rank, --save-as only for a single run, known
    measures; with the pool, the start model exists and the model can be saved under `save_as` (checked before
    any training: the name, the pool, the target folder, a save an earlier run left half-done)."""
    if settings.lora is None and (settings.lora_alpha is not None or settings.lora_targets is not None):
        raise ParameterError("--lora-alpha and --lora-targets apply only to a LoRA fine-tune: add --lora R (a rank "
                             "≥ 1, e.g. --lora 16), or leave them out for a full fine-tune.")
    if settings.compare and settings.save_as is not None:
        raise ParameterError("--save-as saves one run; drop --compare or --save-as.")
    if settings.compare and settings.hft:
        raise ParameterError("--hft freezes matrices of a single run; --compare runs the standard five without it. "
                             "Drop --compare or --hft (HFT beside AdamW and MoFO: forgetlab study mofo-hft).")
    check_optimizer("mofo" if settings.compare else settings.optimizer, settings.filter, settings.partition)
    check_measure(settings.measure)
    check_general_measure(settings.general_measure)
    if pool is not None:
        check_start(pool, settings.start)
        if settings.save_as is not None:
            check_save_as(pool, settings.save_as)


def _is_local(executor) -> bool:
    return executor is None or executor == "local" or getattr(executor, "name", None) == "local"


def compute(pool, settings: FinetuneSettings, progress: Progress = None, executor=None) -> FinetuneComparison:
    """The fine-tune(s) of these settings. A comparison runs its configs on `executor` (one run per worker);
    a single run trains here and keeps its model on the result (`FinetuneComparison.model`), or, with
    `save_as`, saves it into the pool (`save_finetuned`; `saved_as` says where). A progress that can
    `publish` (the app's jobs) gets the records of a single run as they come (a table by step) and each
    comparison so far."""
    configs = configs_of(settings, pool)
    measure, general = settings.measure, settings.general_measure
    benchmarks = measure_benchmarks(pool, [measure, general], settings.lm_eval_include, settings.limit)
    opts = dict(start=settings.start, eval_every=settings.eval_every, max_general=settings.max_general,
                max_task=settings.max_task, max_train=settings.max_train, max_length=settings.max_length,
                device=settings.device,
                dtype=settings.dtype, gradient_checkpointing=settings.gradient_checkpointing, benchmarks=benchmarks,
                eval_tasks=list(settings.eval_tasks) if settings.eval_tasks is not None else None)
    publish = getattr(progress, "publish", None)
    if settings.compare:
        def on_run(run, partial: FinetuneComparison) -> None:
            publish(FinetuneComparison(partial.task, partial.start, list(partial.runs), partial.recipe))

        return compare(pool, settings.task, configs, progress=progress, executor=executor, measure=measure,
                       general_measure=general, on_run=on_run if publish else None, **opts)
    if not _is_local(executor):
        raise ParameterError("--executor ray runs the runs of --compare on workers (one run per worker); a single "
                             "fine-tune runs in process: add --compare or drop --executor.")
    records: list[dict] = []

    def on_record(step: int, rec: dict) -> None:
        records.append({"step": step, "general_loss": rec["general_loss"], "exact_match": rec["exact_match"],
                        "answer_loss": rec.get("answer_loss")})
        publish(pd.DataFrame(records).set_index("step"))

    run, model = finetune(pool, settings.task, configs[0], progress=progress, return_model=True,
                          on_record=on_record if publish else None, **opts)
    comp = single_run_comparison(run, measure, general)
    if settings.save_as is not None:
        comp.saved_as = (settings.save_as, save_finetuned(pool, model, settings.save_as, run=run))
    else:
        comp.model = model
    return comp


def estimate(pool, settings: FinetuneSettings):
    """The peak of the largest run (`estimate_finetune`)."""
    return estimate_finetune(pool, settings.task, configs=configs_of(settings, pool), start=settings.start,
                             device=settings.device, dtype=settings.dtype,
                             gradient_checkpointing=settings.gradient_checkpointing, max_train=settings.max_train,
                             max_length=settings.max_length)


def recipe(result: FinetuneComparison) -> dict:
    """What a saved fine-tune records besides its pool: the comparison's recipe (task, start, configs, budget,
    measures)."""
    return {k: v for k, v in result.recipe.items() if k != "pool"}


def _general(result: FinetuneComparison) -> str:
    return result.recipe.get("general_measure") or "general_loss"          # the generality it was run with


def figures(result: FinetuneComparison, measure: Optional[str] = None) -> list:
    """Trajectories, training loss and the final trade-off, speciality in `measure` (default: the run's)."""
    measure = measure or result.recipe.get("measure") or "exact_match"
    general = _general(result)
    head = f"{result.start} fine-tuned on {result.task}"
    return [trajectories_figure(result, measure, general, title=f"{head}: generality, speciality and distance"),
            loss_figure(result, title=f"{head}: training loss"),
            final_scatter(result, measure, general, title=f"{head}: final trade-off")]


def compare_figures(results: list, ids: list, measure: str = "exact_match") -> list:
    """Several saved fine-tunes on one trajectories chart and one trade-off chart (a label used in more than one
    gets its start and task, else its run id: `runs_of`)."""
    every = runs_of(results, ids)
    return [trajectories_figure(every, measure, title="fine-tunes compared: generality, speciality and distance"),
            final_scatter(every, measure, title="fine-tunes compared: final trade-off")]


TRAJECTORY_COLUMNS = ["label", "step", "general_loss", "exact_match", "answer_loss", "distance"]
FINAL_COLUMNS = ["label", "optimizer", "steps", "speciality", "answer_loss", "general_loss", "forgetting",
                 "distance", "moved", "pareto"]


def cli_report(result: FinetuneComparison) -> list:
    """The CLI's lines: the trajectories, the final points (with a benchmark measure's columns), and where the
    model was saved into the pool."""
    measure = result.recipe.get("measure") or "exact_match"
    general = _general(result)
    traj = result.trajectories()
    shown = list(dict.fromkeys(m for m in (measure, general) if "/" in m))       # the benchmark measures
    named = [f"speciality: {measure}"] if measure != "exact_match" else []
    named += [f"generality: {general}"] if general != "general_loss" else []
    final = result.to_frame()
    lines: list = [f"fine-tuning {result.start} on {result.task}: trajectories",
                   traj[[c for c in TRAJECTORY_COLUMNS + shown if c in traj.columns]],
                   "final" + (f" ({'; '.join(named)})" if named else ""),
                   final[FINAL_COLUMNS + [m for m in shown if m in final.columns]]]
    if result.saved_as is not None:
        lines.append(f"added {result.saved_as[0]} to the pool: {result.saved_as[1]}")
    return lines


def takeaway(result: FinetuneComparison) -> list[str]:
    """The fine-tune(s) in one or two sentences: each run's forgetting (final general loss − the start's, nats)
    against its speciality gain on the task (final − start, in the run's measure); with several runs, the one
    that forgets least and the one that gains most. Runs without a start or final scorecard are left out."""
    measure = result.recipe.get("measure") or "exact_match"
    runs = [r for r in result.runs if r.final is not None and r.start_card is not None]
    gains = {r.label: r.value(measure) - r.value(measure, r.start_card) for r in runs}
    runs = [r for r in runs if r.forgetting == r.forgetting and gains[r.label] == gains[r.label]]
    if not runs:
        return []
    if len(runs) == 1:
        r = runs[0]
        return [f"{r.label} forgot {forgetting_text(r.forgetting)} of general loss and gained "
                f"{change_text(measure, gains[r.label])} on {result.task}."]
    each = "; ".join(f"{r.label} {r.forgetting:+.3f} nats for {change_text(measure, gains[r.label])}" for r in runs)
    sign = 1.0 if higher_is_better(measure) else -1.0
    least = min(runs, key=lambda r: r.forgetting)
    most = max(runs, key=lambda r: sign * gains[r.label])
    return [f"Forgetting (general loss, nats) against the gain on {result.task}, per run: {each}.",
            f"{least.label} forgets least, {forgetting_text(least.forgetting)}; {most.label} gains most, "
            f"{change_text(measure, gains[most.label])}."]


ANALYSIS = ANALYSES.add("finetune", Analysis(
    "finetune", "fine-tune", FinetuneSettings, compute, FinetuneComparison,
    help="fine-tune on a task (AdamW, MoFO, SFA, L1/L2) and record forgetting",
    description="Fine-tune a pool member on a task's train pairs, recording generality, speciality and D(θ, θ0) "
                "every few steps; optionally compare AdamW, MoFO, SFA and L2 on the same data, or save the result "
                "as a new pool model.",
    checks=check_settings, estimate_fn=estimate, figures_fn=figures, compare_fn=compare_figures, measured=True,
    recipe=recipe, report=cli_report, points=True, takeaway_fn=takeaway,
    outputs=(Output("--out", "also write the trajectories to this CSV or JSON file",
                    FinetuneComparison.trajectories),)))
