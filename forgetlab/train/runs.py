"""What-if fine-tunes over a model pool: one run or a comparison, forgetting recorded along the way.

`finetune(pool, task, config)` trains a fresh copy of a pool member (the base by default) on the task's
`train` pairs with `forgetlab.train.trainer.train`, and every `eval_every` steps records generality (held-out
general loss), speciality (exact match and answer loss on the task's `eval` pairs) and D(θ, θ0)
(docs/methods.md#forgetting and "MoFO"). `compare(pool, task, configs)` runs several configurations
(AdamW, MoFO, SFA, L2 …) on the same data, steps and seed and marks the Pareto front of their final points.
`save_finetuned(pool, run, name)` writes the trained model as an HF folder and adds it to the pool (and to
its YAML file), so every other page can analyse it.
"""
from __future__ import annotations

import collections.abc
import json
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch

from forgetlab.analysis.measures import check_general_measure, check_measure
from forgetlab.core.benchmarks import checked_manager, require_task
from forgetlab.core.checkpoints import check_device, load_model, save_model
from forgetlab.core.errors import ForgetlabError, ParameterError, ProbeDataError, TrainingError
from forgetlab.core.evaluate import evaluate
from forgetlab.core.memory import dtype_name, job_dtype, large_frees_to_os
from forgetlab.core.outputs import absolute, check_name, check_output_dir
from forgetlab.core.poolsaves import finish_interrupted_saves, save_into_pool
from forgetlab.core.progress import Progress, prefixed, report, scaled
from forgetlab.core.taskvectors import WeightChange, weight_change
from forgetlab.core.workspace import home
from forgetlab.executors import PoolWorkerFactory, make_executor, worker_id
from forgetlab.train.defaults import FALLBACK
from forgetlab.train.examples import training_examples
from forgetlab.train.lora import LoraDistance, add_adapter, enable_checkpointing, save_adapter, trainable_parameters
from forgetlab.train.results import FinetuneComparison, FinetuneConfig, FinetuneRun, records_card
from forgetlab.train.trainer import MOFO_OPTIMIZERS, train


# L1-to-init strength of the comparison. Neither docs/methods.md nor the SFA rebuttal gives a value. The penalty's
# gradient is λ1·sign(θ − θo): a constant pull of λ1 on every moved entry, where L2's pull λ2·(θ − θo) grows
# with the displacement. λ1 = 1e-3 equals the L2 default's pull (λ2 = 1) at a displacement of 1e-3 per entry,
# the order of what a short fine-tune at lr 1e-3 moves an entry, so the two penalties start comparable.
L1_DEFAULT = 1e-3

SFA_BETA = 0.5
"""SFA's β of a single run (docs/methods.md#sfa: the paper's default)."""
# SFA's β in the comparison. The paper's β = 0.5 pulls half of the task vector back at every averaging, the last one
# on the last step (docs/methods.md#sfa). Under the cosine decay the averaging at ¾ of the run meets ≤ 15 % of the
# peak rate, too little to rebuild what it removed before the last one halves it again: on the pico zoo's recipe
# (math, 150 steps, lr 2.25e-4, warm-up 10) the run ends at exact match 0.04 (seeds 0 and 1; it had reached 0.66 /
# 0.62, AdamW ends at 0.92 / 0.76). β = 0.25 ends at 0.50 / 0.46 for +0.013 nats (docs/zoo.md, "What-if fine-tunes").
SFA_BETA_COMPARE = 0.25


FILTER_TAGS = {"momentum": "", "gradient": "-flt-g", "mv": "-flt-mv", "gv": "-flt-gv", "random": "-random"}
"""How a run's label names MoFO's filter (docs/methods.md#mofo-filters): nothing for MoFO's own."""


def config_label(optimizer: str = "adamw", *, fraction: float = 0.2, sfa_p: Optional[float] = None,
                 l1: float = 0.0, l2: float = 0.0, lora: Optional[int] = 0, filter: str = "momentum",
                 partition: str = "tensor", hft: float = 0.0) -> str:
    """How a single fine-tune is named in tables and charts, from what it does: the optimizer ("mofo-0.2",
    "mofo-lion-0.2" with its fraction, then its filter other than MoFO's own — "-flt-g", "-flt-mv", "-flt-gv",
    "-random" — and "-heads" for per-head partitions), then each fix it adds ("+sfa-p0.25", "+l1-0.001",
    "+l2-1", "+hft-0.5" for HFT's frozen share), after "lora16-" for a LoRA run of rank 16 —
    "lora16-mofo-0.2+l2-0.5", "mofo-0.2-flt-g-heads". The comparison's runs are named by `standard_configs`."""
    label = optimizer
    if optimizer in MOFO_OPTIMIZERS:
        label = f"{optimizer}-{fraction:g}{FILTER_TAGS.get(filter, '-' + str(filter))}"
        label += "-heads" if partition == "head" else ""
    if sfa_p:
        label += f"+sfa-p{sfa_p:g}"
    if l1:
        label += f"+l1-{l1:g}"
    if l2:
        label += f"+l2-{l2:g}"
    if hft:
        label += f"+hft-{hft:g}"
    if lora:
        label = f"lora{lora}-{label}"
    return label


def standard_configs(steps: int = FALLBACK.steps, lr: float = FALLBACK.lr, *, batch_size: int = FALLBACK.batch_size,
                     seed: int = 0, warmup: int = FALLBACK.warmup, fraction: float = 0.2, filter: str = "momentum",
                     partition: str = "tensor", sfa_p: float = 0.25,
                     sfa_beta: float = SFA_BETA_COMPARE, l2: float = 1.0, l1: float = L1_DEFAULT, lora: int = 0,
                     lora_alpha: Optional[float] = None,
                     lora_targets: Optional[Sequence[str]] = None) -> list[FinetuneConfig]:
    """The comparison of docs/methods.md on equal footing: AdamW, MoFO (fraction, filter, partition), SFA (p, β: see
    SFA_BETA_COMPARE), L2-to-init (loss + (λ2/2)‖θ − θo‖², λ2 = `l2`) and L1-to-init (loss + λ1‖θ − θo‖₁, λ1 = `l1`,
    see L1_DEFAULT); with `lora` > 0 each trains a LoRA adapter of that rank (forgetlab.train.lora) instead of every weight. Steps, lr,
    batch and warm-up default to `forgetlab.train.defaults.FALLBACK` (a pool's own: `finetune_defaults`)."""
    common = dict(steps=steps, lr=lr, batch_size=batch_size, seed=seed, warmup=int(warmup), lora=int(lora),
                  lora_alpha=lora_alpha, lora_targets=list(lora_targets) if lora_targets is not None else None)
    return [
        FinetuneConfig(label="adamw", optimizer="adamw", **common),
        FinetuneConfig(label=config_label("mofo", fraction=fraction, filter=filter, partition=partition),
                       optimizer="mofo", fraction=fraction, filter=filter, partition=partition, **common),
        FinetuneConfig(label=f"sfa-p{sfa_p:g}", optimizer="adamw", sfa_p=sfa_p, sfa_beta=sfa_beta, **common),
        FinetuneConfig(label=f"l2-{l2:g}", optimizer="adamw", l2=l2, **common),
        FinetuneConfig(label=f"l1-{l1:g}", optimizer="adamw", l1=l1, **common),
    ]


def default_record_every(steps: int) -> int:
    """Steps between a run's records when none is given (the CLI's and the Fine-tune page's default): ⌈T/10⌉ (ten
    records), but never further apart than max(10, ⌈T/30⌉) — every ≤ 10 steps up to T = 300, so that a collapse
    between two records shows, and about 30 records for longer runs (each record evaluates the model)."""
    steps = max(1, int(steps))
    return max(1, min(math.ceil(steps / 10), max(10, math.ceil(steps / 30))))


def _eval_fn(pool, task: str, eval_tasks: Sequence[str], batch_size: int, max_general: Optional[int],
             max_task: Optional[int], benchmarks=None, manager=None):
    def fn(model, step: int) -> dict[str, Any]:
        card = evaluate(model, pool.tokenizer, pool.probes, name=f"step {step}", batch_size=batch_size,
                        max_general=max_general, max_task=max_task, tasks=eval_tasks, benchmarks=benchmarks,
                        benchmark_manager=manager)
        rec: dict[str, Any] = {"general_loss": card.general_loss, "perplexity": card.perplexity,
                               "exact_match": card.tasks[task].exact_match,
                               "answer_loss": card.tasks[task].answer_loss, "scorecard": card.to_dict()}
        for t, s in card.tasks.items():
            if t != task:
                rec[f"{t}/exact_match"] = s.exact_match
        for btask, metrics in card.benchmarks.items():       # lm-eval metrics as TASK/METRIC (a measure's name)
            rec.update({f"{btask}/{metric}": v for metric, v in metrics.items()})
        return rec
    return fn


class CheckpointWeights(collections.abc.Mapping):
    """A checkpoint's weights as a mapping read tensor by tensor, each in the dtype given for it (θ0 of a run in
    the dtype it was loaded in, so step 0 gives exactly 0 and no copy of θ0 stays in memory)."""

    def __init__(self, checkpoint, dtypes: Mapping[str, torch.dtype]):
        self.checkpoint, self.dtypes = checkpoint, dict(dtypes)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.checkpoint.read(name, dtype=self.dtypes[name])

    def __iter__(self):
        return iter(self.dtypes)

    def __len__(self) -> int:
        return len(self.dtypes)

    def __contains__(self, name: object) -> bool:     # without reading the tensor (Mapping's default reads it)
        return name in self.dtypes


class _StreamedDistance:
    """D(θ, θ0) and the moved share of a model's trainable weights against the checkpoint it was loaded from
    (`forgetlab.core.taskvectors.weight_change`, θ0 streamed by `CheckpointWeights`)."""

    def __init__(self, model, checkpoint):
        names = set(checkpoint.names())
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and n in names]
        self.start = CheckpointWeights(checkpoint, {n: p.dtype for n, p in self.params})

    @torch.no_grad()
    def __call__(self) -> WeightChange:
        return weight_change(self.params, self.start)


def check_start(pool, start: str) -> None:
    """Refuse a start that is neither the base nor a model of the pool, naming the pool's models."""
    if start != "base" and start not in pool.model_names:
        raise ForgetlabError(f"The pool has no model {start!r}; its models are: base, "
                             f"{', '.join(pool.model_names)}. Pick one of them to fine-tune.")


def finetune(pool, task: str, config: FinetuneConfig | None = None, *, start: str = "base",
             eval_every: Optional[int] = None, eval_tasks: Optional[Sequence[str]] = None,
             max_general: Optional[int] = None, max_task: Optional[int] = None, max_train: Optional[int] = None,
             max_length: int = 256, batch_size_eval: int = 16, device: Optional[str] = None,
             dtype: Optional[str | torch.dtype] = None, gradient_checkpointing: bool = False,
             progress: Progress = None, return_model: bool = False, on_record=None, benchmarks=None):
    """Fine-tune a fresh copy of pool member `start` on `task` with `config`; return a `FinetuneRun`
    (and the trained model when `return_model`).

    Records every `eval_every` steps (default: `default_record_every`) and at steps 0 and T: generality (general
    loss, perplexity), speciality on `task` (exact match, answer loss; other tasks' exact match too) and
    D(θ, θ0) from the starting weights. The pool's cached models are never modified. A NaN loss raises
    `TrainingError` after restoring the last good weights (see `trainer.train`). `on_record(step, record)`
    is called with each record as soon as it is made (for live charts). `benchmarks` (a BenchmarkSpec) also
    runs those lm-eval tasks at every record (`TASK/METRIC` keys, usable as the measure). `max_length` (default 256)
    is the training sequence length: a pair longer than that keeps its answer (and EOS) and the end of its prompt
    (`forgetlab.core.data.encode_pairs`).

    `dtype` (default bfloat16 on CUDA, float32 on the CPU: `forgetlab.core.memory.job_dtype`) is the weights',
    gradients' and optimizer state's precision; the loss is reduced in float32. `gradient_checkpointing`
    recomputes each layer's activations in the backward pass instead of keeping them. A config with `lora` > 0
    trains a PEFT adapter (forgetlab.train.lora). D(θ, θ0) is streamed from the start's checkpoint (no copy
    of the starting weights is kept for it).
    """
    config = config or FinetuneConfig()
    check_start(pool, start)
    if not pool.probes.general:
        raise ProbeDataError("Fine-tuning records generality on held-out general text; add `probes: general:` "
                             "to the pool file.")
    examples = training_examples(pool, task, max_length=max_length, max_train=max_train)
    manager = checked_manager(benchmarks)
    tasks = list(eval_tasks) if eval_tasks is not None else list(pool.task_names)
    if task not in tasks:
        tasks.append(task)
    every = eval_every if eval_every is not None else default_record_every(config.steps)
    report(progress, 0.0, f"loading {start}")
    device = check_device(device)
    dt = job_dtype(dtype, device)
    model = load_model(pool.checkpoint(start), device=device, dtype=dt)
    if gradient_checkpointing:
        enable_checkpointing(model)
    if config.lora:
        model = add_adapter(model, config.lora, config.lora_alpha, config.lora_targets, seed=config.seed)
        distance_fn = LoraDistance(model, pool.checkpoint(start))
    else:
        distance_fn = _StreamedDistance(model, pool.checkpoint(start))
    tok = pool.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    fn = _eval_fn(pool, task, tasks, batch_size_eval, max_general, max_task, benchmarks if manager else None,
                  manager)
    if on_record is not None:
        inner = fn

        def fn(model, step):  # noqa: F811 - the same records, also handed to on_record
            rec = inner(model, step)
            on_record(step, rec)
            return rec
    try:
        with large_frees_to_os(device):
            result = train(model, examples, **config.train_kwargs(), eval_every=every, eval_fn=fn, pad_id=pad,
                           distance_fn=distance_fn, progress=progress)
    except TrainingError as err:
        partial = getattr(err, "result", None)
        if partial is not None:
            err.run = FinetuneRun(config, task, start, partial)  # type: ignore[attr-defined]
        raise
    result.settings.update(dtype=dtype_name(dt), device=str(device), gradient_checkpointing=bool(gradient_checkpointing),
                           trainable_parameters=trainable_parameters(model), max_length=int(max_length))
    run = FinetuneRun(config=config, task=task, start=start, train=result,
                      final=records_card(result.history[-1]), start_card=records_card(result.history[0]))
    report(progress, 1.0, f"done · speciality {run.speciality:.3f} · general loss {run.general_loss:.3f}")
    if return_model:
        return run, model
    del model
    return run


def compare(pool, task: str, configs: Sequence[FinetuneConfig], *, start: str = "base",
            eval_every: Optional[int] = None, eval_tasks: Optional[Sequence[str]] = None,
            max_general: Optional[int] = None, max_task: Optional[int] = None, max_train: Optional[int] = None,
            max_length: int = 256, device: Optional[str] = None, dtype: Optional[str | torch.dtype] = None,
            gradient_checkpointing: bool = False, on_run=None, progress: Progress = None,
            executor=None, benchmarks=None, measure: str = "exact_match",
            general_measure: str = "general_loss") -> FinetuneComparison:
    """Run each config from the same start on the same task data and mark the Pareto front of the finals.

    Configs should share `steps`, `batch_size` and `seed` for a fair comparison (same batches in the same
    order); `on_run(run, comparison)` is called after each run. Labels must be distinct. `executor` ("ray" or a
    `forgetlab.executors.Executor`) runs one fine-tune per worker; runs come back in the configs' order and
    record the worker that trained them. `max_length` is each training pair's token budget (see `finetune`).
    `benchmarks` runs lm-eval tasks at every record (see `finetune`);
    `measure` (exact_match, answer_loss or a `TASK/METRIC` of them) and `general_measure` (general_loss or a
    `TASK/METRIC` of them) decide the Pareto front.
    """
    configs = list(configs)
    if not configs:
        raise ParameterError("Give at least one fine-tuning config to compare.")
    labels = [c.label for c in configs]
    if len(set(labels)) != len(labels):
        raise ParameterError(f"Config labels must be distinct; got {labels}.")
    for m in (check_measure(measure), check_general_measure(general_measure)):
        require_task(m, benchmarks)
    checked_manager(benchmarks)               # an unknown task or a bad include folder fails before training
    comp = FinetuneComparison(task=task, start=start, recipe={
        "task": task, "start": start, "configs": [c.to_dict() for c in configs], "eval_every": eval_every,
        "max_general": max_general, "max_task": max_task, "max_train": max_train, "max_length": int(max_length),
        "measure": measure,
        "general_measure": general_measure,
        "benchmarks": benchmarks.to_dict() if benchmarks is not None else None,
        "pool": str(pool.source) if getattr(pool, "source", None) else None})
    n = len(configs)
    kw = dict(start=start, eval_every=eval_every, eval_tasks=eval_tasks, max_general=max_general,
              max_task=max_task, max_train=max_train, max_length=int(max_length), device=device, benchmarks=benchmarks,
              dtype=dtype if dtype is None or isinstance(dtype, str) else str(dtype).removeprefix("torch."),
              gradient_checkpointing=gradient_checkpointing)
    comp.recipe.update(dtype=kw["dtype"], gradient_checkpointing=bool(gradient_checkpointing))
    if executor is not None and executor != "local":
        executor = make_executor(executor)
        slots: list[Optional[FinetuneRun]] = [None] * n

        def landed(out) -> None:
            if not out.ok:                         # its worker died twice: listed, the other runs are kept
                comp.recipe.setdefault("failed", []).append({"label": labels[out.index], "error": out.error})
                return
            run = out.value
            run.executor, run.worker = executor.name, dict(out.worker or {})
            slots[out.index] = run
            comp.runs = [r for r in slots if r is not None]
            comp.mark_pareto(measure, general_measure)
            if on_run is not None:
                on_run(run, comp)

        executor.map(_FinetuneFactory(pool, task, kw, labels), configs, on_result=landed, progress=progress)
        comp.recipe["executor"] = executor.describe()
        return comp
    for i, cfg in enumerate(configs):
        run = finetune(pool, task, cfg, progress=prefixed(scaled(progress, i / n, (i + 1) / n), run_label(i, n, cfg)),
                       **kw)
        run.worker = worker_id()
        comp.runs.append(run)
        comp.mark_pareto(measure, general_measure)
        if on_run is not None:
            on_run(run, comp)
    return comp


def run_label(i: int, n: int, config: FinetuneConfig) -> str:
    """How a comparison's progress names its i-th run (0-based) of n: "run 2 of 5 · mofo-0.2"."""
    return f"run {i + 1} of {n} · {config.label}"


class _FinetuneFactory(PoolWorkerFactory):
    """A fine-tune worker (one run per item, a config), built around the pool
    (`forgetlab.executors.PoolWorkerFactory`)."""

    def __init__(self, pool, task: str, kw: dict, labels: Sequence[str] = ()):
        super().__init__(pool)
        self.task, self.kw, self.labels = task, kw, list(labels)

    def build(self, pool):
        def state(cfg, progress=None):
            if cfg.label in self.labels:
                progress = prefixed(progress, run_label(self.labels.index(cfg.label), len(self.labels), cfg))
            return finetune(pool, self.task, cfg, progress=progress, **self.kw)
        return state


# --------------------------------------------------------------------------------------------- saving


def default_model_dir(pool, name: str) -> Path:
    """Where `save_finetuned` puts a model: `finetuned/<name>` beside the pool file, else in the workspace."""
    if getattr(pool, "source", None):
        return Path(pool.source).parent / "finetuned" / name
    return home() / "finetuned" / name


def check_save_as(pool, name: str, *, out_dir=None, overwrite: bool = False) -> Path:
    """Check, before any training, that a fine-tune can be saved into the pool as `name`: a plain name
    (forgetlab.core.outputs.check_name), not 'base' nor a model the pool has, and a target folder that may be
    written. Returns the target folder."""
    check_name(name, "model name")
    if name == "base":
        raise ParameterError("'base' names the pool's base model; choose another name for the fine-tune.")
    target = Path(out_dir) if out_dir is not None else default_model_dir(pool, name)
    if name in finish_interrupted_saves(pool, absolute(target).parent):    # a save killed half-way: finished
        raise ForgetlabError(f"{name!r} was saved into {target} by an earlier fine-tune that was stopped before "
                             f"it could add it to {pool.source}; it is added there now. Choose another name to "
                             "save this fine-tune too.")
    if name in pool.model_names:
        raise ForgetlabError(f"The pool has a model named {name!r} already; choose another name.")
    check_output_dir(target, overwrite)
    return target


def save_finetuned(pool, model, name: str, *, run: Optional[FinetuneRun] = None, out_dir=None,
                   overwrite: bool = False, update_yaml: bool = True) -> Path:
    """Save a trained model as an HF folder (`forgetlab.core.checkpoints.save_model`, atomic) with its recipe
    (`finetune.json`), add it to the pool under `name`, and add it to the pool's YAML file if it has one
    (a round-trip edit: the user's comments and keys stay). A LoRA fine-tune of the base is saved as a PEFT
    adapter folder (`{adapter: …}` in the pool); one of another pool model is merged into it and saved whole.

    An existing folder is replaced only with `overwrite=True`; a name the pool already has is refused. The folder
    and the pool's entry appear together or not at all, even when interrupted (forgetlab.core.poolsaves).
    """
    target = check_save_as(pool, name, out_dir=out_dir, overwrite=overwrite)
    run_json = json.dumps(run.to_dict(), indent=2, default=str) if run is not None else None
    if hasattr(model, "peft_config"):            # a LoRA fine-tune (forgetlab.train.lora)
        if run is None or run.start == "base":   # an adapter of the pool's base: saved as such
            return save_adapter(pool, model, name, target=target, run_json=run_json, overwrite=overwrite,
                                update_yaml=update_yaml)
        model = model.merge_and_unload()         # an adapter of another model: saved merged, as a full model
    extra = {"finetune.json": run_json} if run_json is not None else None
    inputs = [pool.checkpoint(n).path for n in ["base", *pool.model_names]]
    if getattr(pool, "source", None):
        inputs.append(pool.source)
    return save_into_pool(pool, name, target, lambda then: save_model(
        model, pool.tokenizer, target, overwrite=overwrite, extra_files=extra, inputs=inputs, kind="finetune",
        then=then), update_yaml=update_yaml)

