"""Task sequences as one analysis: fine-tune (or merge) through an order of tasks with one or several methods, score
every task after every stage, and measure what each later task erases of the earlier ones — OP, TRACE's and GEM's
BWT, FWT and per-task forgetting from the score matrix R (docs/methods.md#sequence-metrics, #sequence-methods).

The chains are `forgetlab.train.sequence`; this module declares the settings once (the CLI's `forgetlab sequence`
flags and the Sequence page's widgets), turns them into the runner's arguments (`plan_of`, one function for the CLI
and the page), and tells the CLI, the app's panel and the Runs page how to show a result. Each chain is one point
of the executor, so `--executor ray` runs the methods side by side.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import pandas as pd

from forgetlab.analysis.base import ANALYSES, Analysis, Output
from forgetlab.core.errors import ParameterError
from forgetlab.core.memory import MemoryEstimate, ModelSize
from forgetlab.core.progress import Progress
from forgetlab.core.settings import count_field, device_field, dtype_field, seed_field, setting
from forgetlab.plots.sequence import figures as sequence_figures
from forgetlab.train.memory import estimate_finetune
from forgetlab.train.sequence import (DEFAULT_COMPARE, SEQUENCE_METHODS, ChainOptions, Strengths,
                                      check_merge_method, check_methods, check_order, run_sequence, stage_budgets,
                                      stage_config)
from forgetlab.train.sequence_results import SequenceResult

STRENGTHS = Strengths()
BUDGET = (" (default: how the pool's own fine-tune of each task was trained, as its zoo manifest records; a pool "
          "without that record: forgetlab's fine-tune fallback)")


@dataclass
class SequenceSettings:
    """A sequence: the order of tasks, the methods whose chains to run (or the merges), each stage's budget, the
    fixes' strengths, the scoring budget and where it runs."""

    order: Optional[tuple[str, ...]] = setting(None, help="the tasks in training order, e.g. math,code,translate",
                                               required=True, cli_type="names", metavar="TASK[,TASK…]")
    method: str = setting("adamw", help="the method of a single chain", choices=tuple(SEQUENCE_METHODS),
                          exclusive="methods")
    compare: Optional[tuple[str, ...]] = setting(
        None, help="run a chain per method instead of one, e.g. " + ",".join(DEFAULT_COMPARE) + " (the papers' "
                   "comparison)", cli_type="names", metavar="M[,M…]", exclusive="methods", label="methods")
    merge: Optional[tuple[str, ...]] = setting(
        None, help="also merge the pool's own fine-tunes of the first t tasks with this registry method, t = 1…T "
                   "(a chain per method, e.g. task_arithmetic,magmax,opcm)", cli_type="names", metavar="METHOD[,…]",
        label="merge chains")
    steps: Optional[int] = count_field(None, "training steps of each stage" + BUDGET)
    lr: Optional[float] = setting(None, help="peak learning rate of each stage" + BUDGET, label="learning rate",
                                  range=(0.0, None))
    batch_size: Optional[int] = count_field(None, "training batch size" + BUDGET)
    warmup: Optional[int] = setting(None, help="warm-up steps of each stage" + BUDGET, range=(0, None),
                                    cli_type="number")
    seed: int = seed_field("seed of the batch order, the replayed examples, HFT's halves and LoRA's initial weights")
    fraction: float = setting(STRENGTHS.fraction, help="MoFO's update fraction", label="MoFO fraction",
                              range=(0.0, 1.0))
    sfa_p: float = setting(STRENGTHS.sfa_p, help="SFA: average with the stage's start every ⌈p·T⌉ steps",
                           label="SFA p", range=(0.0, 1.0))
    sfa_beta: float = setting(STRENGTHS.sfa_beta, help="SFA: θ ← (1 − β)·θ + β·θ_start", label="SFA β",
                              range=(0.0, 1.0))
    l2: float = setting(STRENGTHS.l2, help="L2-to-init λ (loss + λ/2‖θ − θ0‖², θ0 the base)", label="L2-to-init λ",
                        range=(0.0, None))
    l1: float = setting(STRENGTHS.l1, help="L1-to-init λ (loss + λ‖θ − θ0‖₁, θ0 the base)", label="L1-to-init λ",
                        range=(0.0, None))
    proximal: float = setting(STRENGTHS.proximal, help="proximal GD's λ (loss + λ/2‖θ − θ_previous stage‖²)",
                              label="proximal λ", range=(0.0, None))
    ewc: float = setting(STRENGTHS.ewc, help="EWC's λ (loss + λ/2 Σ_k F_k (θ − θ*_k)², over the finished tasks)",
                         label="EWC λ", range=(0.0, None))
    fisher_samples: Optional[int] = count_field(STRENGTHS.fisher_samples, "train pairs of a finished task its "
                                                                          "Fisher is computed on (EWC)",
                                                label="Fisher samples")
    replay: float = setting(STRENGTHS.replay, help="data replay: earlier tasks' train pairs mixed into a stage, as a "
                                                   "share of the stage's own pairs", label="replay share",
                            range=(0.0, None))
    hft: float = setting(STRENGTHS.hft, help="HFT: the share of each block's matrices frozen per stage",
                         label="HFT frozen share", range=(0.0, 1.0))
    lora: int = setting(STRENGTHS.lora, help="LoRA's rank (the lora method: one adapter per stage, merged before "
                                             "the next)", range=(1, None), cli_type="rank", metavar="R",
                        label="LoRA rank r")
    max_general: Optional[int] = count_field(None, "at most this many general-text blocks")
    max_task: Optional[int] = count_field(None, "at most this many eval pairs per task")
    max_train: Optional[int] = count_field(None, "at most this many training pairs per task")
    device: Optional[str] = device_field(default_cuda=True)
    dtype: Optional[str] = dtype_field("the weights, gradients and optimizer state")

    @property
    def methods(self) -> list[str]:
        """The fine-tuning chains: the compared methods, else the single method."""
        return list(self.compare) if self.compare else [self.method]


def strengths_of(settings: SequenceSettings) -> Strengths:
    """The fixes' strengths these settings ask for."""
    return Strengths(fraction=settings.fraction, sfa_p=settings.sfa_p, sfa_beta=settings.sfa_beta, l2=settings.l2,
                     l1=settings.l1, proximal=settings.proximal, ewc=settings.ewc,
                     fisher_samples=settings.fisher_samples, replay=settings.replay, hft=settings.hft,
                     lora=settings.lora)


def options_of(settings: SequenceSettings, pool) -> ChainOptions:
    """Every chain's shared options: each task's budget from the pool's own fine-tune recipe (its LoRA adapters'
    recipe for the lora method), with a zoo's own sequence steps and lr over it where its manifest records them
    (`stage_budgets`), and the given steps, lr, batch size and warm-up over both."""
    given = dict(steps=settings.steps, lr=settings.lr, batch_size=settings.batch_size, warmup=settings.warmup)
    order = list(settings.order or ())
    return ChainOptions(budgets=stage_budgets(pool, order, **given),
                        lora_budgets=stage_budgets(pool, order, lora=True, **given), seed=settings.seed,
                        max_train=settings.max_train, max_general=settings.max_general, max_task=settings.max_task,
                        device=settings.device, dtype=settings.dtype)


def check_settings(settings: SequenceSettings, pool=None) -> None:
    """What the declarations cannot say: known, distinct methods (and merge methods); with the pool, an order of at
    least two distinct tasks of the pool, each with a train split, and merges that can merge 1…T models."""
    if settings.sfa_p <= 0:
        raise ParameterError(f"--sfa-p must lie in (0, 1]; got {settings.sfa_p:g}. 0.25 averages 4 times a stage.")
    check_methods(settings.methods)
    for m in settings.merge or ():
        check_merge_method(m, max(2, len(settings.order or ())))
    if pool is not None:
        check_order(pool, settings.order or ())


def compute(pool, settings: SequenceSettings, progress: Progress = None, executor=None) -> SequenceResult:
    """Every chain of the settings (`forgetlab.train.sequence.run_sequence`); a progress that can `publish` (the
    app's jobs) gets the result so far as each chain lands."""
    publish = getattr(progress, "publish", None)

    def on_chain(partial: SequenceResult) -> None:      # a new object per landing: the page draws each one once
        publish(replace(partial, chains=list(partial.chains), recipe=dict(partial.recipe)))

    return run_sequence(pool, list(settings.order), settings.methods, merges=list(settings.merge or ()),
                        strengths=strengths_of(settings), options=options_of(settings, pool), executor=executor,
                        progress=progress, on_chain=on_chain if publish else None)


def estimate(pool, settings: SequenceSettings) -> MemoryEstimate:
    """The peak of the largest stage — a fine-tune of the base with that stage's recipe (a process runs its chains
    one at a time) — plus the previous stage's weights (kept for D to the previous stage) and, for EWC, its
    accumulated Fisher terms A and B (two float32 copies of the weights). ParameterError for settings it cannot
    estimate (no task picked, an unknown method): the run's own checks say what to change."""
    if not settings.order:
        raise ParameterError("Pick the tasks of the sequence, in training order.")
    check_methods(settings.methods)
    options = options_of(settings, pool)
    strengths = strengths_of(settings)
    configs = [stage_config(SEQUENCE_METHODS[m], strengths, options.budgets[t], settings.seed)
               for m in settings.methods for t in settings.order]
    task = max(settings.order, key=lambda t: options.budgets[t].batch_size)
    est = estimate_finetune(pool, task, configs=configs, device=settings.device, dtype=settings.dtype,
                            max_train=settings.max_train)
    size = ModelSize.of(pool.checkpoint("base"))
    parts = {**est.parts, "previous stage's weights": size.bytes(est.dtype)}
    if any(SEQUENCE_METHODS[m].ewc for m in settings.methods):
        parts["EWC Fisher terms (A, B)"] = 2 * size.bytes("float32")
    return replace(est, job="sequence", parts=parts)


def recipe(result: SequenceResult) -> dict:
    """What a saved sequence records besides its pool: its recipe (order, methods, budgets, strengths)."""
    return {k: v for k, v in result.recipe.items() if k != "pool"}


def cli_report(result: SequenceResult) -> list:
    """The CLI's lines: each chain's stages (general loss, distances, seconds), then R of each chain (exact
    match), then the summary of metrics."""
    lines: list = ["stages", result.stage_frame()]
    for m in result.methods:
        r = pd.DataFrame(result.matrix(m, "exact_match"), columns=result.order,
                         index=["base", *[f"after {t}" for t in result.order]])
        lines += [f"{m}: exact match after each stage", r]
    lines += ["metrics (OP, BWT as TRACE and GEM define them, FWT, forgetting per task)", result.summary_frame()]
    for failed in result.recipe.get("failed", []):
        lines.append(f"the chain {failed['method']} failed: {failed['error']}")
    return lines


def takeaway(result: SequenceResult) -> list[str]:
    """The sequence in one or two sentences: how much of the first task's gain survives to the end per chain, and
    which chain keeps most (best OP) and forgets least (best TRACE BWT). In exact match, or — when no chain's first
    stage gained any exact match (a model too small to answer exactly) — in answer loss."""
    if not result.chains:
        return []
    first = result.order[0]
    score = "exact_match"
    kept = {m: result.retained_gain(m, score=score) for m in result.methods}
    if not any(v == v for v in kept.values()):
        score = "answer_loss"
        kept = {m: result.retained_gain(m, score=score) for m in result.methods}
    word = "exact-match" if score == "exact_match" else "answer-loss"
    summary = result.summary_frame()
    rows = summary[summary.score == score].set_index("method")
    each = "; ".join(f"{m} {kept[m]:.0%}" if kept[m] == kept[m] else f"{m} (no gain)" for m in result.methods)
    lines = [f"Share of the first task's ({first}) {word} gain left after the last stage: {each}."]
    higher = score == "exact_match"
    if len(result.chains) > 1:
        best_op = rows["op"].idxmax() if higher else rows["op"].idxmin()
        best_bwt = rows["bwt_trace"].idxmax() if higher else rows["bwt_trace"].idxmin()
        what = "the highest overall exact match" if higher else "the lowest mean answer loss"
        lines.append(f"{best_op} ends with {what} (OP {rows.loc[best_op, 'op']:.{2 if higher else 3}f}); "
                     f"{best_bwt} loses least of the earlier tasks (BWT {rows.loc[best_bwt, 'bwt_trace']:+.3f}).")
    else:
        m = result.methods[0]
        sign = "negative" if higher else "positive"
        lines.append(f"OP {rows.loc[m, 'op']:.3f}, BWT {rows.loc[m, 'bwt_trace']:+.3f} ({word.replace('-', ' ')}; a "
                     f"{sign} BWT is what later tasks erased).")
    return lines

ANALYSIS = ANALYSES.add("sequence", Analysis(
    "sequence", "task sequence", SequenceSettings, compute, SequenceResult,
    help="fine-tune or merge through a sequence of tasks and measure what each later task erases",
    description="Fine-tune the base through an order of tasks (each stage starts from the previous one's weights) "
                "with one method or several side by side (AdamW, MoFO, SFA, L1/L2-to-init, proximal GD, EWC, HFT, "
                "replay, LoRA and combinations), or merge the pool's fine-tunes of the first t tasks; score every "
                "task after every stage and report OP, BWT (TRACE and GEM), FWT and per-task forgetting.",
    checks=check_settings, estimate_fn=estimate, figures_fn=sequence_figures, measured=True, recipe=recipe,
    report=cli_report, points=True, takeaway_fn=takeaway,
    outputs=(Output("--out", "write matrix.csv (every task after every stage, per method) and summary.csv (OP, BWT, "
                    "FWT, forgetting per method and score) into this folder", metavar="DIR",
                    files=(("matrix.csv", SequenceResult.matrix_frame),
                           ("summary.csv", SequenceResult.summary_frame))),)))
