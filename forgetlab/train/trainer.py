"""A deterministic causal-LM training loop for pre-training and supervised fine-tuning.

`train(model, examples, steps=...)` runs `steps` optimizer steps over `forgetlab.core.data.EncodedExample`s
(labels −100 where no loss is taken: prompt tokens of task pairs; labels = input_ids for plain text) with

- the causal-LM loss: mean cross-entropy of the token at position i+1 predicted from positions ≤ i, over the
  positions whose label is not −100;
- batches shuffled by a `torch.Generator` seeded with `seed` (same seed, same batches, same weights);
- AdamW, MoFO (`forgetlab.train.mofo.MoFO`, docs/methods.md#mofo, with its filters and per-head partitions), Lion
  or MoFO-Lion (`forgetlab.train.lion`, docs/methods.md#lion), or SGD; an optional linear warm-up followed by a
  cosine decay to 0 (or a constant rate), gradient clipping to norm 1.0;
- the training-time fixes of docs/methods.md: SFA averaging θ ← (1 − β)·θ + β·θo every ⌈p·T⌉ steps and at the end,
  and the L1/L2-to-init penalties l1·‖θ − θo‖₁ + (l2/2)·‖θ − θo‖² (θo = the weights at the start of the run, or
  a given `penalty_anchor`, e.g. the base inside a sequence of tasks);
- for a sequence of tasks: the EWC penalty of the finished tasks (`forgetlab.train.ewc`, docs/methods.md#ewc) and
  HFT, a random share of every layer's attention and MLP matrices frozen for the run (`forgetlab.train.hft`,
  docs/methods.md#hft);
- a record every `eval_every` steps (and at steps 0 and T): the distance D(θ, θo) of docs/methods.md, the share of
  weights that moved more than 2e-6 (docs/methods.md#moved-share) and whatever `eval_fn(model, step)` returns.

A non-finite loss or gradient stops the run with `forgetlab.core.errors.TrainingError` (its `.result` holds the
run up to that point). With `rollback=True` the weights are first put back to the last ones that gave a finite
loss; that costs a full copy of the trainable weights, so it is off by default (the model then holds the weights
after the last completed step).

Memory: beyond the weights, their gradients and the optimizer's state, a run keeps one copy of the trainable
weights θo only when its formula needs it (SFA averaging, the L1/L2-to-init penalties without a `penalty_anchor`,
or D(θ, θo) records without a `distance_fn`), in the weights' own dtype. HFT's frozen matrices need neither
gradients nor optimizer state; an EWC penalty holds two float32 copies of the weights (its caller's).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, Sequence

import pandas as pd
import torch

from forgetlab.core.taskvectors import WeightChange, weight_change
from forgetlab.core.data import collate
from forgetlab.core.errors import ParameterError, TrainingError, check_fraction
from forgetlab.core.progress import Progress, report
from forgetlab.train.hft import freeze_, hft_frozen, unfreeze_
from forgetlab.train.lion import LION_BETAS, Lion
from forgetlab.train.mofo import (ADAM_BETAS, FILTERS, MoFO, check_filter, head_partitions,
                                  unfiltered_parameters)

OPTIMIZERS = ("adamw", "mofo", "lion", "mofo-lion", "sgd")
MOFO_OPTIMIZERS = ("mofo", "mofo-lion")
"""The optimizers that take MoFO's options (fraction, filter, partition): MoFO on Adam and on Lion."""
PARTITIONS = ("tensor", "head")
"""MoFO's partitions: PyTorch's parameter tensors, or q, k, v and o per attention head
(docs/methods.md#head-partitions)."""
SCHEDULES = ("cosine", "constant")


class GradPenalty(Protocol):
    """A penalty that adds its own gradient after back-propagation (`forgetlab.train.ewc.EwcPenalty`): its
    strength `lam`, the tasks it holds, and `add_grad_(named_params) -> value`."""

    lam: float
    tasks: int

    def add_grad_(self, named_params: Sequence[tuple[str, torch.Tensor]]) -> float: ...


@dataclass
class TrainResult:
    """What a training run did: per-step losses and learning rates, periodic records, its settings.

    `history` holds one dict per record (`step`, `distance` = D(θ, θo), `moved` = the share of entries with
    |θ − θo| > 2e-6 where it was measured, plus the keys of `eval_fn`);
    `averaged_at` lists the steps after which SFA averaged the weights; `stopped` is None for a run that
    finished, else the reason it stopped.
    """

    steps: int
    completed_steps: int = 0
    losses: list[float] = field(default_factory=list)
    penalties: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    averaged_at: list[int] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    stopped: Optional[str] = None

    @property
    def final_loss(self) -> float:
        """The training loss of the last completed step (NaN when no step was taken)."""
        return self.losses[-1] if self.losses else float("nan")

    def loss_frame(self) -> pd.DataFrame:
        """One row per completed step: `step` (1-based), `loss` (task loss), `penalty`, `lr`."""
        n = len(self.losses)
        return pd.DataFrame(
            {
                "step": list(range(1, n + 1)),
                "loss": self.losses,
                "penalty": self.penalties[:n] if self.penalties else [0.0] * n,
                "lr": self.lrs[:n],
            }
        )

    def history_frame(self) -> pd.DataFrame:
        """One row per record (step 0, every `eval_every` steps, the last step) with its flattened values."""
        rows = [_flatten(h) for h in self.history]
        return pd.DataFrame(rows)

    def to_frame(self) -> pd.DataFrame:
        """Per-step losses joined with the periodic records on `step` (step 0 holds the initial record)."""
        losses = self.loss_frame()
        hist = self.history_frame()
        if hist.empty:
            return losses
        return pd.merge(losses, hist, on="step", how="outer").sort_values("step").reset_index(drop=True)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (round-trips through `TrainResult.from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainResult":
        """Rebuild a result saved with `to_dict`."""
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def _flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, prefix=f"{name}."))
        else:
            out[name] = value
    return out


def lr_factor(step: int, steps: int, warmup: int = 0, schedule: str = "cosine") -> float:
    """Multiplier of the base learning rate for the step with 0-based index `step` out of `steps`.

    Linear warm-up: (step + 1) / warmup for step < warmup. Then `"cosine"`: ½·(1 + cos(π·s / S)) with
    s = step − warmup and S = steps − warmup (the first step after warm-up gets the full rate, the rate
    approaches 0 at the end); `"constant"`: 1.
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(1, steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / span))


def sfa_interval(steps: int, p: float) -> int:
    """The SFA averaging period ⌈p·T⌉ steps (at least 1) for a run of T = `steps` steps."""
    return max(1, math.ceil(p * steps - 1e-9))


def sfa_average_(params: Sequence[torch.Tensor], anchors: Sequence[torch.Tensor], beta: float) -> None:
    """In place: θ ← (1 − β)·θ + β·θo for every parameter θ and its anchor θo (docs/methods.md#sfa)."""
    with torch.no_grad():
        for p, p0 in zip(params, anchors):
            p.mul_(1.0 - beta).add_(p0.to(device=p.device, dtype=p.dtype), alpha=beta)


def add_penalty_grad_(
    params: Sequence[torch.Tensor], anchors: Iterable[torch.Tensor], l1: float, l2: float
) -> float:
    """Add the gradient of l1·‖θ − θo‖₁ + (l2/2)·‖θ − θo‖² to each `.grad`; return the penalty's value.

    The gradient is l1·sign(θ − θo) + l2·(θ − θo) (the sub-gradient 0 where θ = θo), added in place so the
    penalty costs no extra autograd graph.
    """
    total = 0.0
    with torch.no_grad():
        for p, p0 in zip(params, anchors):
            diff = p.detach() - p0.to(device=p.device, dtype=p.dtype)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if l2:
                p.grad.add_(diff, alpha=l2)
                total += 0.5 * l2 * float(diff.double().pow(2).sum())
            if l1:
                p.grad.add_(torch.sign(diff), alpha=l1)
                total += l1 * float(diff.double().abs().sum())
    return total


def grads_finite(params: Sequence[torch.Tensor], piece: int = 1 << 20) -> bool:
    """Whether every gradient entry is finite, checked in pieces of `piece` entries (no full-size copy: the
    float64 norm this replaces made two float64 copies of the largest gradient). Equivalent to a finite float64
    sum of squares, which cannot overflow for finite float32/bfloat16 gradients."""
    for p in params:
        if p.grad is None:
            continue
        flat = p.grad.reshape(-1)
        for s in range(0, flat.numel(), piece):
            if not bool(torch.isfinite(flat[s:s + piece]).all()):
                return False
    return True


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of labels[:, 1:] predicted by logits[:, :-1], over labels ≠ −100 (in float32)."""
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    return torch.nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1), ignore_index=-100
    )


def default_betas(optimizer: str) -> tuple[float, float]:
    """The (β1, β2) an optimizer takes when none are given: Lion's (0.9, 0.99) for "lion" and "mofo-lion", Adam's
    (0.9, 0.999) otherwise."""
    return LION_BETAS if str(optimizer).lower() in ("lion", "mofo-lion") else ADAM_BETAS


def check_optimizer(name: str, filter: str = "momentum", partition: str = "tensor") -> str:
    """The optimizer's name in lower case, after refusing an unknown optimizer, filter or partition, a filter or
    partition other than the defaults for an optimizer that is not MoFO's, and a filter that needs Adam's v with
    MoFO-Lion."""
    key = str(name).lower()
    if key not in OPTIMIZERS:
        raise ParameterError(f"Unknown optimizer {name!r}. Choose one of: {', '.join(OPTIMIZERS)}.")
    if partition not in PARTITIONS:
        raise ParameterError(f"Unknown partition {partition!r}. Choose one of: {', '.join(PARTITIONS)} "
                             "(docs/methods.md#head-partitions).")
    check_filter(filter, "lion" if key == "mofo-lion" else "adam")
    if key not in MOFO_OPTIMIZERS and (filter != FILTERS[0] or partition != PARTITIONS[0]):
        raise ParameterError(f"filter={filter!r} and partition={partition!r} are MoFO's options; optimizer {key!r} "
                             f"updates every entry. Use optimizer {' or '.join(MOFO_OPTIMIZERS)}, or leave them at "
                             f"{FILTERS[0]!r} and {PARTITIONS[0]!r}.")
    return key


def make_optimizer(
    model: torch.nn.Module,
    name: str,
    *,
    lr: float,
    betas: Optional[tuple[float, float]] = None,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    fraction: float = 0.2,
    filter: str = "momentum",
    partition: str = "tensor",
    seed: int = 0,
) -> torch.optim.Optimizer:
    """Build the optimizer `name` over the model's trainable parameters: "adamw", "mofo" (MoFO with its `fraction`,
    `filter` and `partition`, docs/methods.md#mofo-filters, #head-partitions; `seed` seeds random BCD's draws),
    "lion", "mofo-lion" (MoFO's filter on Lion's update, docs/methods.md#lion) or "sgd". `betas` default to the
    optimizer's own (`default_betas`)."""
    key = check_optimizer(name, filter, partition)
    betas = tuple(betas) if betas is not None else default_betas(key)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if key == "adamw":   # foreach=False: the multi-tensor path allocates a temporary the size of all the weights
        return torch.optim.AdamW([p for _, p in named], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                 foreach=False)
    if key == "lion":
        return Lion([p for _, p in named], lr=lr, betas=betas, weight_decay=weight_decay)
    if key in MOFO_OPTIMIZERS:
        unfiltered = unfiltered_parameters(model) & {n for n, _ in named}
        blocks = None
        if partition == "head":
            trained = {n for n, _ in named} - unfiltered
            blocks = {n: b for n, b in head_partitions(model).items() if n in trained}
            if not blocks:
                raise ParameterError("partition='head' found no attention weight among the trained parameters to cut "
                                     "per head (a LoRA adapter's A and B are not cut by heads); use partition "
                                     "'tensor'.")
        return MoFO(named, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fraction=fraction,
                    unfiltered=unfiltered, filter=filter, base="lion" if key == "mofo-lion" else "adam",
                    partitions=blocks, seed=seed)
    return torch.optim.SGD([p for _, p in named], lr=lr, weight_decay=weight_decay)


def usable_examples(examples: Sequence[Any]) -> list[Any]:
    """The examples with at least one loss position after the first token (others carry no signal); a
    ParameterError for an example whose labels and input ids differ in length."""
    out = []
    for ex in examples:
        labels = list(ex.labels)
        if len(labels) != len(ex.input_ids):
            raise ParameterError(
                f"An example has {len(ex.input_ids)} input ids but {len(labels)} labels; "
                "encode it with forgetlab.core.data.encode_pairs or encode_text."
            )
        if any(lab != -100 for lab in labels[1:]):
            out.append(ex)
    return out


class _Batches:
    """Endless shuffled batches of a fixed size: a fresh permutation from a seeded generator is appended
    whenever fewer than a batch of indices remain, so a batch may straddle two epochs (never with a
    repeated example when n ≤ batch_size: such a batch is the whole set)."""

    def __init__(self, n: int, batch_size: int, seed: int):
        self.n = n
        self.batch_size = batch_size
        self.gen = torch.Generator().manual_seed(int(seed))
        self.order: list[int] = []

    def next(self) -> list[int]:
        if len(self.order) < min(self.batch_size, self.n):
            self.order = self.order + torch.randperm(self.n, generator=self.gen).tolist()
        batch, self.order = self.order[: self.batch_size], self.order[self.batch_size :]
        return batch


def _change(names: Sequence[str], params: Sequence[torch.Tensor], anchors: Sequence[torch.Tensor]) -> WeightChange:
    """D(θ, θo) and the moved share (forgetlab.core.taskvectors.weight_change) of parameters and their anchors
    given as parallel lists."""
    return weight_change(list(zip(names, params)), dict(zip(names, anchors)))


def change_record(change: float | WeightChange) -> dict[str, float]:
    """The record of a weight change: {"distance": D} for a number, {"distance": D, "moved": share} for a
    `forgetlab.core.taskvectors.WeightChange`."""
    return change.record() if isinstance(change, WeightChange) else {"distance": float(change)}


def train(
    model: torch.nn.Module,
    examples: Sequence[Any],
    *,
    steps: int,
    batch_size: int = 8,
    lr: float = 1e-3,
    optimizer: str = "adamw",
    weight_decay: float = 0.0,
    fraction: float = 0.2,
    filter: str = "momentum",
    partition: str = "tensor",
    betas: Optional[tuple[float, float]] = None,
    eps: float = 1e-8,
    warmup: int = 0,
    schedule: str = "cosine",
    clip: Optional[float] = 1.0,
    seed: int = 0,
    sfa_p: Optional[float] = None,
    sfa_beta: float = 0.5,
    l1: float = 0.0,
    l2: float = 0.0,
    penalty_anchor: Optional[Mapping[str, torch.Tensor]] = None,
    ewc: Optional[GradPenalty] = None,
    hft: float = 0.0,
    hft_seed: Optional[int] = None,
    eval_every: Optional[int] = None,
    eval_fn: Optional[Callable[[torch.nn.Module, int], dict]] = None,
    record_distance: bool = True,
    distance_fn: Optional[Callable[[], float | WeightChange]] = None,
    rollback: bool = False,
    pad_id: int = 0,
    device: Optional[str | torch.device] = None,
    progress: Progress = None,
) -> TrainResult:
    """Train `model` in place for `steps` optimizer steps on `examples`; return a `TrainResult`.

    Loss: the causal-LM cross-entropy on positions whose label ≠ −100, plus the L1/L2-to-init penalties
    l1·‖θ − θo‖₁ + (l2/2)·‖θ − θo‖² (docs/methods.md#sfa baselines). Optimizer: "adamw", "mofo" (update fraction
    `fraction`, its `filter` and `partition`: docs/methods.md#mofo, #mofo-filters, #head-partitions), "lion",
    "mofo-lion" (docs/methods.md#lion, #mofo-lion) or "sgd"; `betas` default to the optimizer's own (Adam's
    (0.9, 0.999), Lion's (0.9, 0.99)); random BCD draws from a generator seeded with `seed`. Learning rate: `lr`
    times `lr_factor` (linear warm-up over
    `warmup` steps, then cosine decay or constant). Gradients are clipped to norm `clip` (None: no clipping).
    SFA: with `sfa_p` set, θ ← (1 − β)·θ + β·θo after every ⌈p·T⌉-th step and after the last one
    (β = `sfa_beta`). Records (at step 0, every `eval_every` steps, at the end): D(θ, θo) and the share of
    entries with |θ − θo| > 2e-6 ("moved") — `distance_fn()` when given (e.g. streamed from the checkpoint the run
    started from, or a LoRA adapter's merged update; a number records D alone, a `WeightChange` both), else from
    a copy of the starting weights — and `eval_fn(model, step)`, with the model in eval mode. `rollback`: on a
    non-finite loss, restore the last weights that gave a finite loss (keeps a full copy; see the module doc). Batches are drawn from a generator seeded with `seed`; dropout uses
    a forked RNG seeded likewise, so the same call gives the same weights.

    For a sequence of tasks (docs/methods.md#l2-to-init, #ewc, #hft): `penalty_anchor` (parameter name → tensor,
    e.g. the base's weights, possibly a lazy Mapping read tensor by tensor) replaces θo in the L1/L2 penalties
    (SFA still averages with the weights at the start of the run); `ewc` (a `forgetlab.train.ewc.EwcPenalty`)
    adds its gradient beside theirs, its value counted in `penalties`; `hft` > 0 freezes that share of every
    layer's attention and MLP matrices (`forgetlab.train.hft.hft_frozen`, seeded with `hft_seed`, default
    `seed`) for this run, restored after it.
    """
    steps = int(steps)
    if steps < 1:
        raise ParameterError(f"steps must be a positive integer; got {steps}.")
    if int(batch_size) < 1:
        raise ParameterError(f"batch_size must be a positive integer; got {batch_size}.")
    if not (lr > 0 and math.isfinite(lr)):
        raise ParameterError(f"lr must be a positive number; got {lr}.")
    if warmup < 0 or warmup > steps:
        raise ParameterError(f"warmup must lie in [0, steps={steps}]; got {warmup}.")
    if schedule not in SCHEDULES:
        raise ParameterError(f"Unknown schedule {schedule!r}. Choose one of: {', '.join(SCHEDULES)}.")
    check_fraction("fraction", fraction)
    optimizer = check_optimizer(optimizer, filter, partition)
    betas = tuple(betas) if betas is not None else default_betas(optimizer)
    if sfa_p is not None:
        sfa_p = float(sfa_p)
        if not (0.0 < sfa_p <= 1.0):
            raise ParameterError(f"sfa_p must lie in (0, 1]; got {sfa_p}. 0.25 averages 4 times per run.")
        check_fraction("sfa_beta", sfa_beta)
    if not (0 <= l1 < math.inf and 0 <= l2 < math.inf):
        raise ParameterError(f"l1 and l2 must be finite numbers ≥ 0; got l1={l1}, l2={l2}.")
    if not 0 <= weight_decay < math.inf:
        raise ParameterError(f"weight_decay must be a finite number ≥ 0 (0: none); got {weight_decay}.")
    if isinstance(seed, bool) or int(seed) != seed or not 0 <= int(seed) <= 2**63 - 1:
        raise ParameterError(f"seed must be a whole number from 0 to 2**63 − 1 (it seeds torch's generator); got "
                             f"{seed!r}.")
    if eval_every is not None and int(eval_every) < 1:
        raise ParameterError(f"eval_every must be a positive integer or None; got {eval_every}.")
    if len(examples) == 0:
        raise TrainingError("No training data: the example list is empty. Give the task some training pairs.")
    usable = usable_examples(examples)
    if not usable:
        raise TrainingError(
            "No training data with a loss: every example has all its labels set to -100 (no answer tokens). "
            "Check the task's answers or raise max_length so the answers are not cut off."
        )

    if device is not None:
        model.to(device)
    hft = check_fraction("hft", hft)
    if hft_seed is not None and (isinstance(hft_seed, bool) or int(hft_seed) != hft_seed or hft_seed < 0):
        raise ParameterError(f"hft_seed must be a whole number ≥ 0 or None (then `seed` draws HFT's half); got "
                             f"{hft_seed!r}.")
    if ewc is not None and not callable(getattr(ewc, "add_grad_", None)):
        raise ParameterError("ewc must be a forgetlab.train.ewc.EwcPenalty (or None); got "
                             f"{type(ewc).__name__}.")
    frozen = freeze_(model, hft_frozen(model, hft, seed if hft_seed is None else int(hft_seed))) if hft else []
    try:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        names = [n for n, _ in named]
        params = [p for _, p in named]
        if not params:
            raise ParameterError("The model has no trainable parameters (all have requires_grad=False).")
        dev = params[0].device
        if penalty_anchor is not None and (l1 or l2):
            present = set(penalty_anchor)     # its names, without reading a lazy Mapping's tensors
            lacking = [n for n in names if n not in present]
            if lacking:
                raise ParameterError(f"penalty_anchor lacks {len(lacking)} of the {len(names)} trained tensors (e.g. "
                                     f"{lacking[0]!r}); give the anchor weights of the same model, keyed by "
                                     "parameter name.")

        settings = dict(
            steps=steps, batch_size=int(batch_size), lr=float(lr), optimizer=optimizer,
            weight_decay=float(weight_decay), fraction=float(fraction), filter=filter, partition=partition,
            betas=list(betas), eps=float(eps),
            warmup=int(warmup), schedule=schedule, clip=clip, seed=int(seed), sfa_p=sfa_p,
            sfa_beta=float(sfa_beta), l1=float(l1), l2=float(l2), eval_every=eval_every,
            n_examples=len(examples), n_used=len(usable), penalty_anchor=penalty_anchor is not None,
            ewc_lambda=float(ewc.lam) if ewc is not None else 0.0, ewc_tasks=int(ewc.tasks) if ewc is not None else 0,
            hft=hft, hft_seed=(seed if hft_seed is None else int(hft_seed)) if hft else None, hft_frozen=len(frozen),
        )
        result = TrainResult(steps=steps, settings=settings)
        opt = make_optimizer(model, optimizer, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             fraction=fraction, filter=filter, partition=partition, seed=int(seed))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: lr_factor(i, steps, warmup, schedule))

        penalized = bool(l1) or bool(l2)
        need_anchors = (sfa_p is not None or (penalized and penalty_anchor is None)
                        or (record_distance and distance_fn is None))
        anchors = [p.detach().clone() for p in params] if need_anchors else []   # θo, the weights at the start
        last_good = [p.detach().clone() for p in params] if rollback else []     # weights that last gave a finite loss
        period = sfa_interval(steps, sfa_p) if sfa_p is not None else None
        batches = _Batches(len(usable), int(batch_size), seed)
        good_after = [0]                                         # how many steps had been taken by last_good
        was_training = model.training
        start = time.perf_counter()

        def record(step: int) -> None:
            entry: dict[str, Any] = {"step": step}
            if record_distance:
                entry.update(change_record(distance_fn() if distance_fn is not None else   # HFT's frozen: unmoved
                                           _change(names + [n for n, _ in frozen], params + [p for _, p in frozen],
                                                   anchors + [p for _, p in frozen])))
            if eval_fn is not None:
                model.eval()
                with torch.no_grad():
                    extra = eval_fn(model, step) or {}
                entry.update(extra)
            model.train()
            result.history.append(entry)

        def fail(step: int, what: str) -> None:
            with torch.no_grad():
                for p, g in zip(params, last_good):
                    p.copy_(g)
            result.stopped = f"{what} at step {step}"
            result.seconds = time.perf_counter() - start
            model.train(was_training)
            held = (f"The model was restored to the last weights that gave a finite loss (after {good_after[0]} steps)."
                    if rollback else f"The model holds the weights after step {result.completed_steps}.")
            err = TrainingError(
                f"Training stopped: {what} at step {step} of {steps} (lr={lr}, optimizer={optimizer}). {held} "
                "Lower the learning rate, add warm-up, or check the data."
            )
            err.result = result  # type: ignore[attr-defined]
            raise err

        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(seed))
                model.train()
                if eval_every is not None or eval_fn is not None:
                    record(0)
                for i in range(steps):
                    step = i + 1
                    batch = collate([usable[j] for j in batches.next()], pad_id)
                    batch = {k: v.to(dev) for k, v in batch.items()}
                    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
                    loss = causal_lm_loss(out.logits, batch["labels"])
                    if not torch.isfinite(loss):
                        fail(step, "the loss became NaN/inf")
                    with torch.no_grad():
                        for p, g in zip(params, last_good):
                            g.copy_(p)
                    good_after[0] = i
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    penalty = 0.0
                    if penalized:   # θo: the given anchor, read one tensor at a time, or the start's copy
                        penalty = add_penalty_grad_(params, anchors if penalty_anchor is None else
                                                    (penalty_anchor[n] for n in names), l1, l2)
                    if ewc is not None:
                        penalty += ewc.add_grad_(named)
                    if clip is not None:
                        finite = bool(torch.isfinite(torch.nn.utils.clip_grad_norm_(params, float(clip))))
                    else:
                        finite = grads_finite(params)
                    if not finite:
                        fail(step, "the gradient became NaN/inf")
                    result.lrs.append(float(opt.param_groups[0]["lr"]))
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)  # no gradients held through the records and the next forward
                    if period is not None and (step % period == 0 or step == steps):
                        sfa_average_(params, anchors, sfa_beta)
                        result.averaged_at.append(step)
                    result.losses.append(float(loss.detach()))
                    result.penalties.append(float(penalty))
                    result.completed_steps = step
                    if eval_every is not None and (step % int(eval_every) == 0 or step == steps):
                        record(step)
                    elif eval_every is None and eval_fn is not None and step == steps:
                        record(step)
                    report(progress, step / steps, f"step {step}/{steps} · loss {result.losses[-1]:.4f}")
        finally:
            model.train(was_training)
            result.seconds = time.perf_counter() - start
        return result
    finally:
        unfreeze_(frozen)
