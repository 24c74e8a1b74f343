"""Forgetting as a process: fine-tuning (or merging) through a sequence of tasks, scored after every stage.

`run_sequence(pool, order, methods)` runs one chain per method. A fine-tuning chain starts from the base, trains on
the first task of the order, then from those weights on the second, and so on (`run_chain`); after every stage it
scores every task of the order (exact match and answer loss), the general held-out loss, D(θ, θ0) to the base and
D to the previous stage's weights. A merge chain (`merge_chain`) merges the pool's own fine-tunes of the first t
tasks with a registry method, t = 1…T, and scores each merge the same way. The base is scored once and shared by
every chain (stage 0). The score matrices and their metrics are `forgetlab.train.sequence_results`.

The methods (`SEQUENCE_METHODS`, docs/methods.md#sequence-methods) are recipes over the trainer's fixes, with their
strengths in `Strengths`: AdamW (naive sequential fine-tuning), MoFO, SFA (averaging with the stage's starting
weights), L2- and L1-to-init (anchored at the base), proximal GD (L2 to the previous stage's weights), EWC (the
diagonal Fisher of every finished task, accumulated), HFT (a random half of each block's matrices frozen per
stage), data replay (a share of earlier tasks' train examples mixed into each stage), LoRA (one adapter per stage,
merged before the next), and the combinations MoFO + replay and MoFO + EWC.
"""
from __future__ import annotations

import math
import random
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from forgetlab.core.checkpoints import check_device, load_model
from forgetlab.core.errors import ParameterError, ProbeDataError
from forgetlab.core.evaluate import evaluate
from forgetlab.core.memory import dtype_name, job_dtype, large_frees_to_os
from forgetlab.core.progress import Progress, prefixed, report, scaled
from forgetlab.core.taskvectors import distance
from forgetlab.executors import PoolWorkerFactory, make_executor, worker_id
from forgetlab.merge import run as run_merge
from forgetlab.merge.registry import get_method, validate_params
from forgetlab.merge.workflow import pool_recipe
from forgetlab.train.defaults import FinetuneDefaults, finetune_defaults, sequence_defaults
from forgetlab.train.ewc import EwcPenalty, diagonal_fisher
from forgetlab.train.examples import training_examples
from forgetlab.train.lora import add_adapter
from forgetlab.train.results import FinetuneConfig
from forgetlab.train.runs import CheckpointWeights, SFA_BETA_COMPARE, L1_DEFAULT
from forgetlab.train.sequence_results import SequenceChain, SequenceResult, StageScores
from forgetlab.train.trainer import train


@dataclass(frozen=True)
class SequenceMethod:
    """A way to train through a sequence: which optimizer and which of the fixes each stage uses (their strengths
    are `Strengths`). `title` names it in plain words."""

    name: str
    title: str
    optimizer: str = "adamw"
    sfa: bool = False
    l2_init: bool = False
    l1_init: bool = False
    proximal: bool = False
    ewc: bool = False
    hft: bool = False
    replay: bool = False
    lora: bool = False


SEQUENCE_METHODS: dict[str, SequenceMethod] = {m.name: m for m in (
    SequenceMethod("adamw", "AdamW, naive sequential fine-tuning"),
    SequenceMethod("mofo", "MoFO", optimizer="mofo"),
    SequenceMethod("sfa", "SFA, averaging with the stage's start", sfa=True),
    SequenceMethod("l2-init", "L2 to the base", l2_init=True),
    SequenceMethod("l1-init", "L1 to the base", l1_init=True),
    SequenceMethod("proximal", "proximal GD, L2 to the previous stage", proximal=True),
    SequenceMethod("ewc", "EWC, Fisher-weighted L2 to every finished task", ewc=True),
    SequenceMethod("hft", "HFT, half of the matrices frozen per stage", hft=True),
    SequenceMethod("replay", "data replay of earlier tasks", replay=True),
    SequenceMethod("lora", "LoRA, one adapter per stage merged before the next", lora=True),
    SequenceMethod("mofo+replay", "MoFO with data replay", optimizer="mofo", replay=True),
    SequenceMethod("mofo+ewc", "MoFO with EWC", optimizer="mofo", ewc=True),
)}
"""The sequence methods by name (docs/methods.md#sequence-methods)."""

DEFAULT_COMPARE = ("adamw", "mofo", "sfa", "proximal", "ewc", "replay", "mofo+replay")
"""The comparison of the papers' sequence claims: SFA against replay and AdamW (Soup-to-go), MoFO against AdamW,
EWC and proximal GD between them, MoFO + replay against both alone (MoFO §4.3 and its rebuttal)."""


@dataclass(frozen=True)
class Strengths:
    """How strongly each fix acts: MoFO's update fraction, SFA's p and β, the L2/L1-to-init λ, proximal GD's λ,
    EWC's λ and Fisher sample count, the replay share, HFT's frozen share and LoRA's rank (docs/methods.md)."""

    fraction: float = 0.2
    sfa_p: float = 0.25
    sfa_beta: float = SFA_BETA_COMPARE
    l2: float = 1.0
    l1: float = L1_DEFAULT
    proximal: float = 1.0
    ewc: float = 1000.0
    fisher_samples: Optional[int] = 256
    replay: float = 0.25
    hft: float = 0.5
    lora: int = 8


def check_methods(names: Sequence[str]) -> list[str]:
    """The names if each is a sequence method and none repeats; ParameterError naming the choices otherwise."""
    names = [str(n).strip() for n in names]
    unknown = [n for n in names if n not in SEQUENCE_METHODS]
    if unknown:
        raise ParameterError(f"Unknown sequence method {', '.join(map(repr, unknown))}; choose from "
                             f"{', '.join(SEQUENCE_METHODS)}.")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ParameterError(f"{', '.join(map(repr, repeated))} is named twice; list each method once.")
    if not names:
        raise ParameterError(f"Name at least one method; choose from {', '.join(SEQUENCE_METHODS)}.")
    return names


def check_order(pool, order: Sequence[str]) -> list[str]:
    """The order if it names at least two distinct tasks of the pool, each with a train split (the runs' data);
    ParameterError / ProbeDataError saying what to change otherwise."""
    order = [str(t).strip() for t in order]
    if len(order) < 2:
        raise ParameterError(f"A sequence needs at least two tasks; got {', '.join(order) or 'none'}. Give an order "
                             f"such as --order {','.join(pool.task_names[:3]) or 'math,code'} (the pool's tasks: "
                             f"{', '.join(pool.task_names) or 'none'}); one task is a plain fine-tune "
                             "(forgetlab finetune).")
    repeated = sorted({t for t in order if order.count(t) > 1})
    if repeated:
        raise ParameterError(f"Task {', '.join(map(repr, repeated))} appears twice in the order; name each task "
                             "once.")
    pool.check_tasks(order, where=" in --order")
    untrained = [t for t in order if not (pool.probes.task(t).train or [])]
    if untrained:
        raise ProbeDataError(f"Task {', '.join(map(repr, untrained))} has no train split, so no stage can train on "
                             "it: add a `train:` file for it under `probes: tasks:` in the pool file, or leave it "
                             "out of the order.")
    return order


def stage_budgets(pool, order: Sequence[str], *, lora: bool = False, steps: Optional[int] = None,
                  lr: Optional[float] = None, batch_size: Optional[int] = None,
                  warmup: Optional[int] = None) -> dict[str, FinetuneDefaults]:
    """Each task's stage recipe: how the pool's own fine-tunes of that task were trained
    (forgetlab.train.defaults.finetune_defaults; `lora`: its LoRA adapters' run), with the zoo's sequence steps and
    learning rate in their place where its manifest sets them (`sequence_defaults`, full fine-tunes), and the given
    values over both."""
    zoo = sequence_defaults(pool) if not lora else None
    if zoo is not None:
        steps = zoo.steps if steps is None else steps
        lr = zoo.lr if lr is None else lr
    out = {}
    for t in order:
        d = finetune_defaults(pool, t, lora=lora)
        given = {k: v for k, v in dict(steps=steps, lr=lr, batch_size=batch_size, warmup=warmup).items()
                 if v is not None}
        d = replace(d, **given)
        if d.warmup > d.steps:
            d = replace(d, warmup=d.steps)
        out[t] = d
    return out


def stage_config(method: SequenceMethod, strengths: Strengths, budget: FinetuneDefaults, seed: int) -> FinetuneConfig:
    """The trainer's recipe of one stage of `method` (the EWC penalty, the L2/L1 anchor and the replayed data are
    the chain's, not the config's): the task's budget, the optimizer, SFA, L2/L1 or proximal λ, HFT's share,
    LoRA's rank."""
    l2 = strengths.l2 if method.l2_init else (strengths.proximal if method.proximal else 0.0)
    return FinetuneConfig(label=method.name, optimizer=method.optimizer, steps=budget.steps,
                          batch_size=budget.batch_size, lr=budget.lr, warmup=budget.warmup, seed=seed,
                          fraction=strengths.fraction, sfa_p=strengths.sfa_p if method.sfa else None,
                          sfa_beta=strengths.sfa_beta, l2=l2, l1=strengths.l1 if method.l1_init else 0.0,
                          hft=strengths.hft if method.hft else 0.0, lora=strengths.lora if method.lora else 0)


def replay_examples(earlier: Sequence[Sequence[Any]], n_current: int, share: float, seed: int) -> list[Any]:
    """The replayed examples of a stage: round(share · n_current) examples drawn without replacement (seeded) from
    the earlier tasks' train examples taken together (all of them when there are fewer)."""
    if not (0.0 <= share < math.inf):
        raise ParameterError(f"The replay share must be a number ≥ 0; got {share}.")
    pooled = [ex for task in earlier for ex in task]
    k = min(len(pooled), int(round(share * n_current)))
    if k <= 0:
        return []
    picks = sorted(random.Random(int(seed)).sample(range(len(pooled)), k))
    return [pooled[i] for i in picks]


def base_weights(pool, model) -> CheckpointWeights:
    """The base's weights for the model's parameters that its checkpoint stores, read on demand in the dtypes the
    model holds them in (the L2/L1-to-init anchor and D(θ, θ0)'s θ0, never a copy in memory)."""
    ckpt = pool.checkpoint("base")
    names = set(ckpt.names())
    return CheckpointWeights(ckpt, {n: p.dtype for n, p in model.named_parameters() if n in names})


def _trainable(model) -> list[tuple[str, torch.Tensor]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def score_model(model, pool, order: Sequence[str], *, stage: int, after_task: Optional[str],
                max_general: Optional[int], max_task: Optional[int], batch_size: int = 16,
                base: Optional[Mapping[str, torch.Tensor]] = None,
                previous: Optional[Mapping[str, torch.Tensor]] = None, progress: Progress = None) -> StageScores:
    """One row of R: every task of the order scored on its eval split (exact match, answer loss), the general
    held-out loss, and D(θ, θ0) to `base` / D to `previous` where given (docs/methods.md#forgetting)."""
    card = evaluate(model, pool.tokenizer, pool.probes, name=f"stage {stage}", batch_size=batch_size,
                    max_general=max_general, max_task=max_task, tasks=list(order), progress=progress)
    params = [(n, p) for n, p in model.named_parameters()]
    return StageScores(stage=stage, after_task=after_task,
                       exact_match={t: card.tasks[t].exact_match for t in order},
                       answer_loss={t: card.tasks[t].answer_loss for t in order}, general_loss=card.general_loss,
                       distance_to_base=distance(params, base) if base is not None else 0.0,
                       distance_to_previous=distance(params, previous) if previous is not None else math.nan)


@dataclass(frozen=True)
class ChainOptions:
    """What every chain of a sequence shares: the stage budgets per task, the seed, the data and scoring limits,
    where it runs and in which precision."""

    budgets: Mapping[str, FinetuneDefaults]
    lora_budgets: Optional[Mapping[str, FinetuneDefaults]] = None
    seed: int = 0
    max_train: Optional[int] = None
    max_general: Optional[int] = None
    max_task: Optional[int] = None
    max_length: int = 256
    device: Optional[str] = None
    dtype: Optional[str] = None
    eval_batch_size: int = 16


def run_chain(pool, order: Sequence[str], method: SequenceMethod | str, strengths: Strengths, options: ChainOptions,
              *, progress: Progress = None, on_stage: Optional[Callable[[StageScores], None]] = None,
              return_model: bool = False):
    """Fine-tune through the order with `method`: stage i starts from stage i − 1's weights (stage 1 from the base)
    and trains on task i's train pairs with that task's budget (`options.budgets`), then is scored
    (`score_model`). Returns a `SequenceChain` of stages 1…T (and the final model when `return_model`).

    Per method (docs/methods.md#sequence-methods): SFA averages with the stage's starting weights; L2/L1-to-init
    pull toward the base (streamed from its checkpoint); proximal GD pulls toward the stage's starting weights;
    EWC adds the diagonal Fisher of each finished task (on its first `fisher_samples` train pairs) at that task's
    final weights; HFT freezes a new random half per stage (seed + stage); replay mixes `replay` × n examples of the
    earlier tasks into the stage's data; LoRA trains one adapter per stage and merges it before the next."""
    method = SEQUENCE_METHODS[method] if isinstance(method, str) else method
    order = list(order)
    started = time.perf_counter()
    device = check_device(options.device)
    dt = job_dtype(options.dtype, device)
    report(progress, 0.0, f"{method.name}: loading the base")
    model = load_model(pool.checkpoint("base"), device=device, dtype=dt)
    base = base_weights(pool, model)
    tok = pool.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ewc = EwcPenalty(strengths.ewc) if method.ewc else None
    seen: list[list[Any]] = []
    stages: list[StageScores] = []
    settings: dict[str, Any] = {"method": method.name, "stages": []}
    n = len(order)
    for i, task in enumerate(order):
        stage_t0 = time.perf_counter()
        part = prefixed(scaled(progress, i / n, (i + 1) / n), f"{method.name} · stage {i + 1} of {n} · {task}")
        budget = (options.lora_budgets or options.budgets)[task] if method.lora else options.budgets[task]
        config = stage_config(method, strengths, budget, options.seed)
        own = training_examples(pool, task, max_length=options.max_length, max_train=options.max_train)
        replayed = replay_examples(seen, len(own), strengths.replay, options.seed + i) if method.replay else []
        previous = {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters()}
        kwargs = config.train_kwargs()
        if method.hft:
            kwargs["hft_seed"] = options.seed + i
        if method.l2_init or method.l1_init:
            kwargs["penalty_anchor"] = base
        stage_model = add_adapter(model, config.lora, None, None, seed=options.seed + i) if config.lora else model
        with large_frees_to_os(device):
            result = train(stage_model, [*own, *replayed], **kwargs, ewc=ewc, pad_id=pad, record_distance=False,
                           progress=scaled(part, 0.0, 0.85))
        if config.lora:
            model = stage_model.merge_and_unload()
        if ewc is not None and i < n - 1:
            report(part, 0.85, "Fisher of the finished task")
            sample = own[: strengths.fisher_samples] if strengths.fisher_samples else own
            ewc.add_task(diagonal_fisher(model, sample, pad_id=pad),
                         {name: p.detach().clone() for name, p in _trainable(model)})
        scores = score_model(model, pool, order, stage=i + 1, after_task=task, max_general=options.max_general,
                             max_task=options.max_task, batch_size=options.eval_batch_size, base=base,
                             previous=previous, progress=scaled(part, 0.9, 1.0))
        del previous
        seen.append(own)
        scores.seconds = time.perf_counter() - stage_t0
        scores.notes = {"train_loss": result.final_loss, "replayed": len(replayed), "examples": len(own)}
        stages.append(scores)
        settings["stages"].append({"task": task, "config": config.to_dict(), "replayed": len(replayed),
                                   "train_seconds": result.seconds})
        if on_stage is not None:
            on_stage(scores)
    settings.update(dtype=dtype_name(dt), device=str(device))
    chain = SequenceChain(method=method.name, stages=stages, kind="finetune", seconds=time.perf_counter() - started,
                          settings=settings, worker=worker_id())
    if return_model:
        return chain, model
    return chain


def check_merge_method(method: str, n_tasks: int) -> str:
    """`method` if it is a registry merge method that merges any count of models from 1 to `n_tasks` with its
    defaults; ParameterError naming the problem otherwise."""
    spec = get_method(method)
    for t in range(1, n_tasks + 1):
        try:
            validate_params(spec, {}, n_models=t)
        except ParameterError as exc:
            raise ParameterError(f"--merge {method} cannot build the merge chain: with {t} model(s) it says: {exc} "
                                 "Choose a method that merges any number of models (e.g. task_arithmetic, ties, "
                                 "magmax, opcm).") from None
    return method


def merge_chain(pool, order: Sequence[str], method: str, options: ChainOptions, *, progress: Progress = None,
                on_stage: Optional[Callable[[StageScores], None]] = None) -> SequenceChain:
    """Merging through the order: for t = 1…T, the pool's own fine-tunes of the first t tasks
    (`pool.model_for_task`) merged into the base with `method` and its defaults, exactly as `forgetlab merge`
    writes them (forgetlab.merge.run, into a temporary folder), then scored like a stage."""
    order = list(order)
    check_merge_method(method, len(order))
    members = [pool.model_for_task(t) for t in order]
    started = time.perf_counter()
    device = check_device(options.device)
    dt = job_dtype(options.dtype, device)
    stages: list[StageScores] = []
    previous = None
    n = len(order)
    for t in range(1, n + 1):
        t0 = time.perf_counter()
        part = prefixed(scaled(progress, (t - 1) / n, t / n), f"merge:{method} · {t} of {n} · {', '.join(members[:t])}")
        recipe = pool_recipe(pool, method, members[:t], seed=options.seed)
        with tempfile.TemporaryDirectory(prefix="forgetlab-merge-chain-") as tmp:
            out = Path(tmp) / "merged"
            run_merge(recipe, out, progress=scaled(part, 0.0, 0.5), pool=pool)
            model = load_model(out, device=device, dtype=dt)
        base = base_weights(pool, model)
        scores = score_model(model, pool, order, stage=t, after_task=order[t - 1], max_general=options.max_general,
                             max_task=options.max_task, batch_size=options.eval_batch_size, base=base,
                             previous=previous, progress=scaled(part, 0.5, 1.0))
        previous = {k: p.detach().to("cpu", copy=True) for k, p in model.named_parameters()}
        del model
        scores.seconds = time.perf_counter() - t0
        scores.notes = {"merged": members[:t]}
        stages.append(scores)
        if on_stage is not None:
            on_stage(scores)
    return SequenceChain(method=f"merge:{method}", stages=stages, kind="merge", seconds=time.perf_counter() - started,
                         settings={"method": method, "models": members, "dtype": dtype_name(dt)}, worker=worker_id())


class _ChainFactory(PoolWorkerFactory):
    """A sequence worker: one chain per item ("finetune", name) or ("merge", method), built around the pool."""

    def __init__(self, pool, order, strengths, options):
        super().__init__(pool)
        self.order, self.strengths, self.options = list(order), strengths, options

    def build(self, pool):
        def state(item, progress=None):
            kind, name = item
            if kind == "merge":
                return merge_chain(pool, self.order, name, self.options, progress=progress)
            return run_chain(pool, self.order, name, self.strengths, self.options, progress=progress)
        return state


def base_scores(pool, order: Sequence[str], options: ChainOptions, progress: Progress = None) -> StageScores:
    """Stage 0: the base scored once, shared by every chain."""
    device = check_device(options.device)
    model = load_model(pool.checkpoint("base"), device=device, dtype=job_dtype(options.dtype, device))
    return score_model(model, pool, order, stage=0, after_task=None, max_general=options.max_general,
                       max_task=options.max_task, batch_size=options.eval_batch_size, progress=progress)


def run_sequence(pool, order: Sequence[str], methods: Sequence[str] = ("adamw",), *, merges: Sequence[str] = (),
                 strengths: Strengths = Strengths(), options: Optional[ChainOptions] = None, executor=None,
                 progress: Progress = None,
                 on_chain: Optional[Callable[[SequenceResult], None]] = None) -> SequenceResult:
    """Every chain of a sequence: one fine-tuning chain per name of `methods` (SEQUENCE_METHODS) and one merge chain
    per registry method of `merges`, all from the same base scores (stage 0, computed once). `executor` ("ray" or
    a forgetlab.executors.Executor) runs each chain as one point (chains side by side on workers); chains come back
    in the order given. `on_chain(result so far)` is called as each chain lands."""
    order = check_order(pool, order)
    methods = check_methods(methods) if methods else []
    for m in merges:
        check_merge_method(m, len(order))
    if not methods and not merges:
        raise ParameterError("Name at least one method (--method, --compare) or a merge (--merge).")
    options = options or ChainOptions(budgets=stage_budgets(pool, order))
    items = [("finetune", m) for m in methods] + [("merge", m) for m in merges]
    report(progress, 0.0, "scoring the base")
    result = SequenceResult(order=order, base=base_scores(pool, order, options), recipe={
        "order": order, "methods": methods, "merges": list(merges), "strengths": asdict(strengths),
        "budgets": {t: asdict(b) for t, b in options.budgets.items()},
        "seed": options.seed, "max_train": options.max_train, "max_general": options.max_general,
        "max_task": options.max_task, "max_length": options.max_length,
        "pool": str(pool.source) if getattr(pool, "source", None) else None})
    slots: list[Optional[SequenceChain]] = [None] * len(items)
    body = scaled(progress, 0.05, 1.0)

    def landed(index: int, chain: SequenceChain) -> None:
        slots[index] = chain
        result.chains = [c for c in slots if c is not None]
        if on_chain is not None:
            on_chain(result)

    if executor is not None and executor != "local":
        executor = make_executor(executor)

        def on_result(out) -> None:
            if not out.ok:
                result.recipe.setdefault("failed", []).append({"method": items[out.index][1], "error": out.error})
                return
            landed(out.index, out.value)

        executor.map(_ChainFactory(pool, order, strengths, options), items, on_result=on_result, progress=body)
        result.recipe["executor"] = executor.describe()
        return result
    factory = _ChainFactory(pool, order, strengths, options)
    state = factory.build(pool)
    for k, item in enumerate(items):
        part = scaled(body, k / len(items), (k + 1) / len(items))
        landed(k, state(item, progress=part))
    return result
