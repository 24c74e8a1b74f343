"""Task vectors and the distance D(θ, θ0): the one home of both formulas (docs/methods.md#task-vector, #distance).

- A task vector, per tensor: τ = θt − θ0, or for a LoRA adapter its ΔW = (lora_alpha/r)·B·A exactly (no
  subtraction round-off). `task_vector` gives one tensor's, `iter_task_vector` streams a whole model's.
- The distance over the B tensors ("partitions") whose base norm is not 0:
  D(θ, θ0) = (1/B) Σk ‖θ(k) − θ0(k)‖ / ‖θ0(k)‖. A partition with ‖θ0(k)‖ = 0 has no relative change and is left
  out; where no partition counts, D is undefined and every function here gives NaN (`DistanceSum`).
- The share of entries that moved (docs/methods.md#moved-share): #{|θ − θ0| > threshold} / #entries over the tensors
  present in both, threshold 2e-6 by default (MoFO's Table 5); `moved_share`, and `weight_change` for D and the
  share in one pass.
- Their summaries: the norms of one task vector per tensor (`task_vector_norms`) and the cosines between several
  (`cosine_matrix`), both streamed one tensor at a time.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Iterable, Iterator, Mapping, Optional, Sequence

import pandas as pd
import torch

from forgetlab.core.checkpoints import Checkpoint, LoraCheckpoint
from forgetlab.core.errors import ForgetlabError
from forgetlab.core.progress import Progress, report


def task_vector(base_tensor: torch.Tensor, tuned: Checkpoint, name: str) -> Optional[torch.Tensor]:
    """τ of tensor `name` in float32: a LoRA checkpoint's ΔW exactly, else θt − θ0 (`base_tensor` is θ0); None
    where the fine-tuned checkpoint does not store the tensor (a tied lm_head)."""
    if isinstance(tuned, LoraCheckpoint):
        return tuned.delta(name)
    if name not in tuned:
        return None
    return tuned.read(name) - base_tensor


def iter_task_vector(base: Checkpoint, tuned: Checkpoint, names: Sequence[str] | None = None
                     ) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, θ0, τ) per tensor in float32, one tensor pair in memory at a time; a tensor the fine-tuned
    checkpoint does not store is skipped."""
    for name in names if names is not None else base.names():
        w0 = base.read(name)
        tau = task_vector(w0, tuned, name)
        if tau is not None:
            yield name, w0, tau


@dataclass
class DistanceSum:
    """D(θ, θ0) accumulated partition by partition: `add(‖θ(k) − θ0(k)‖, ‖θ0(k)‖)`, then `value` (NaN when no
    partition had a non-zero base norm)."""

    total: float = 0.0
    count: int = 0

    def add(self, change_norm: float, base_norm: float) -> None:
        """Count one partition (left out when its base norm is 0)."""
        if base_norm > 0:
            self.total += float(change_norm) / float(base_norm)
            self.count += 1

    @property
    def value(self) -> float:
        """The mean relative change over the counted partitions, NaN when none counted."""
        return self.total / self.count if self.count else float("nan")


MOVED_THRESHOLD = 2e-6
"""The change |θ − θ0| above which an entry counts as moved: MoFO's Table 5 (docs/methods.md#moved-share)."""


@dataclass
class MovedCount:
    """The share of entries that moved, accumulated tensor by tensor: `add(θ(k) − θ0(k))`, then `value`, the
    entries with |θ − θ0| > `threshold` over all entries counted (NaN when none was)."""

    threshold: float = MOVED_THRESHOLD
    moved: int = 0
    total: int = 0

    def add(self, change: torch.Tensor, piece: int = 1 << 20) -> None:
        """Count one tensor's entries, and those whose |change| exceeds the threshold (in pieces of `piece`
        entries: no full-size temporary)."""
        flat = change.detach().reshape(-1)
        for start in range(0, flat.numel(), piece):
            self.moved += int(torch.count_nonzero(flat[start:start + piece].abs() > self.threshold))
        self.total += flat.numel()

    def add_unmoved(self, entries: int) -> None:
        """Count `entries` entries that did not change (a tensor known to be untouched, without forming its zero
        change)."""
        self.total += int(entries)

    @property
    def value(self) -> float:
        """moved / total, NaN when no entry was counted."""
        return self.moved / self.total if self.total else float("nan")


@dataclass(frozen=True)
class WeightChange:
    """How far weights moved from θ0: D(θ, θ0) (`distance`) and the share of entries that moved (`moved`,
    docs/methods.md#moved-share)."""

    distance: float
    moved: float

    def record(self) -> dict[str, float]:
        """{"distance": D, "moved": share}: the keys a training record holds them under."""
        return {"distance": float(self.distance), "moved": float(self.moved)}


def _shared(theta, theta0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(θ(k) − θ0(k), θ0(k)) in float32 for each tensor present in both, one at a time."""
    items = theta.items() if isinstance(theta, Mapping) else theta
    for name, t in items:
        if name in theta0:
            w0 = theta0[name].detach().float()
            yield t.detach().float().to(w0.device) - w0, w0


def distance(theta: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
             theta0: Mapping[str, torch.Tensor]) -> float:
    """D(θ, θ0) over the tensors present in both (NaN when no shared tensor has a non-zero base norm)."""
    acc = DistanceSum()
    for diff, w0 in _shared(theta, theta0):
        acc.add(float(diff.norm()), float(w0.norm()))
    return acc.value


def weight_change(theta: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                  theta0: Mapping[str, torch.Tensor], threshold: float = MOVED_THRESHOLD) -> WeightChange:
    """D(θ, θ0) and the share of entries with |θ − θ0| > `threshold`, over the tensors present in both, in one
    pass (each NaN where undefined: no shared tensor with a non-zero base norm, no shared entry)."""
    acc, moved = DistanceSum(), MovedCount(float(threshold))
    for diff, w0 in _shared(theta, theta0):
        acc.add(float(diff.norm()), float(w0.norm()))
        moved.add(diff)
    return WeightChange(acc.value, moved.value)


def moved_share(theta: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                theta0: Mapping[str, torch.Tensor], threshold: float = MOVED_THRESHOLD) -> float:
    """The share of entries whose change |θ − θ0| exceeds `threshold` (default 2e-6, MoFO's Table 5), over every
    entry of the tensors present in both (NaN when none is shared)."""
    moved = MovedCount(float(threshold))
    for diff, _ in _shared(theta, theta0):
        moved.add(diff)
    return moved.value


def checkpoint_distance(pool, name: str) -> float:
    """D(θt, θ0) of pool member `name`, streamed from disk (NaN where undefined)."""
    acc = DistanceSum()
    for _, w0, tau in iter_task_vector(pool.base, pool.checkpoint(name)):
        acc.add(float(tau.norm()), float(w0.norm()))
    return acc.value


@dataclass
class TaskVectorNorms:
    """Per-tensor norms of one task vector, with each tensor's place in the model."""

    model: str
    rows: list[dict] = field(default_factory=list)

    def to_frame(self) -> pd.DataFrame:
        """name, layer, module, part, numel, norm (‖τ‖), base_norm (‖θ0‖), relative (‖τ‖/‖θ0‖)."""
        return pd.DataFrame(self.rows, columns=["name", "layer", "module", "part", "numel", "norm",
                                                "base_norm", "relative"])

    def by_level(self) -> pd.DataFrame:
        """Norms per (layer, module): sqrt of the summed squares of its tensors; `other` for the rest.

        A NaN/Inf tensor makes its group's norm NaN/Inf (pandas' default sum would skip the NaN and show 0)."""
        df = self.to_frame()
        df = df.assign(module=df["module"].fillna("other"), layer=df["layer"].fillna(-1).astype(int),
                       sq=df["norm"] ** 2, sq0=df["base_norm"] ** 2)
        g = df.groupby(["layer", "module"], as_index=False)[["sq", "sq0"]].agg(lambda x: x.sum(skipna=False))
        g["norm"] = g["sq"] ** 0.5
        g["relative"] = g["norm"] / g["sq0"].pow(0.5).where(g["sq0"] > 0)
        return g[["layer", "module", "norm", "relative"]]

    @property
    def total(self) -> float:
        """‖τ‖ over the whole model."""
        return math.sqrt(sum(r["norm"] ** 2 for r in self.rows))

    def to_dict(self) -> dict:
        """A JSON-ready dict (`TaskVectorNorms(**d)` rebuilds it)."""
        return asdict(self)


def _anatomy_or_none(pool):
    try:
        return pool.anatomy
    except (ForgetlabError, ImportError):
        return None


def task_vector_norms(pool, name: str, progress: Progress = None) -> TaskVectorNorms:
    """‖τ‖ and ‖θ0‖ of every tensor of model `name`'s task vector, streamed."""
    base, tuned = pool.base, pool.checkpoint(name)
    anatomy = _anatomy_or_none(pool)
    names = base.names()
    out = TaskVectorNorms(name)
    for i, (n, w0, tau) in enumerate(iter_task_vector(base, tuned, names)):
        role = anatomy.role(n) if anatomy is not None else None
        norm, norm0 = float(tau.norm()), float(w0.norm())
        out.rows.append({"name": n, "layer": getattr(role, "layer", None), "module": getattr(role, "module", None),
                         "part": getattr(role, "part", None), "numel": tau.numel(), "norm": norm,
                         "base_norm": norm0, "relative": norm / norm0 if norm0 > 0 else float("nan")})
        report(progress, (i + 1) / len(names), n)
    return out


@dataclass
class CosineMatrix:
    """Cosine similarity between whole task vectors (all tensors flattened into one vector per model)."""

    models: list[str]
    values: list[list[float]]
    norms: list[float]

    def to_frame(self) -> pd.DataFrame:
        """The matrix as a table, models as both index and columns."""
        return pd.DataFrame(self.values, index=self.models, columns=self.models)

    def to_dict(self) -> dict:
        """A JSON-ready dict (`CosineMatrix(**d)` rebuilds it)."""
        return asdict(self)


def cosine_matrix(pool, models: Sequence[str] | None = None, progress: Progress = None) -> CosineMatrix:
    """cos(τi, τj) = ⟨τi, τj⟩ / (‖τi‖‖τj‖) over the flattened task vectors, accumulated tensor by tensor (a tensor
    a fine-tuned checkpoint does not store counts as τ = 0)."""
    models = list(models if models is not None else pool.model_names)
    if not models:
        raise ForgetlabError("The pool has no fine-tuned models, so there are no task vectors to compare.")
    k = len(models)
    gram = torch.zeros(k, k, dtype=torch.float64)
    names = pool.base.names()
    ckpts = [pool.checkpoint(m) for m in models]
    for step, name in enumerate(names):
        w0 = pool.base.read(name)
        taus = [task_vector(w0, c, name) for c in ckpts]
        stack = torch.stack([(t if t is not None else torch.zeros_like(w0)).reshape(-1) for t in taus]).double()
        gram += stack @ stack.T
        report(progress, (step + 1) / len(names), name)
    norms = gram.diagonal().sqrt()
    denom = torch.outer(norms, norms)
    cos = torch.where(denom > 0, gram / denom.clamp_min(1e-300), torch.zeros_like(gram))
    cos = torch.where(torch.isnan(gram), gram, cos)  # a NaN/Inf task vector has no cosine: NaN, not 0
    return CosineMatrix(models, cos.tolist(), norms.tolist())
