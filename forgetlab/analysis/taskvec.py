"""Task vectors τt = θt − θ0 (or ΔW = (lora_alpha/r)·B·A for an adapter), streamed tensor by tensor.

Their norms per tensor and per level (layer × attn/mlp), the cosine-similarity matrix between task vectors,
and the distance D(θ, θ0) = (1/B) Σk ‖θ(k) − θ0(k)‖ / ‖θ0(k)‖ over the B tensors ("partitions",
docs/methods.md#distance). Partitions whose base norm is 0 are left out of D (their relative change is undefined).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Optional, Sequence

import pandas as pd
import torch

from forgetlab.analysis.protocol import Analysis, list_results, load_result, pool_source, register
from forgetlab.core.checkpoints import Checkpoint, LoraCheckpoint
from forgetlab.core.errors import ForgetlabError
from forgetlab.core.errors import ParameterError
from forgetlab.core.progress import Progress, report, scaled


def iter_task_vector(base: Checkpoint, tuned: Checkpoint, names: Sequence[str] | None = None
                     ) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, θ0, τ) per tensor in float32, one tensor pair in memory at a time.

    For a LoRA checkpoint τ is its ΔW exactly (no subtraction round-off); a tensor the fine-tuned file does
    not store (a tied lm_head) is skipped.
    """
    for name in names if names is not None else base.names():
        w0 = base.read(name)
        if isinstance(tuned, LoraCheckpoint):
            tau = tuned.delta(name)
        elif name in tuned:
            tau = tuned.read(name) - w0
        else:
            continue
        yield name, w0, tau


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
        return asdict(self)


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


def _anatomy_or_none(pool):
    try:
        return pool.anatomy
    except (ForgetlabError, ImportError):
        return None


@dataclass
class CosineMatrix:
    """Cosine similarity between whole task vectors (all tensors flattened into one vector per model)."""

    models: list[str]
    values: list[list[float]]
    norms: list[float]

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.values, index=self.models, columns=self.models)

    def to_dict(self) -> dict:
        return asdict(self)


def cosine_matrix(pool, models: Sequence[str] | None = None, progress: Progress = None) -> CosineMatrix:
    """cos(τi, τj) = ⟨τi, τj⟩ / (‖τi‖‖τj‖) over the flattened task vectors, accumulated tensor by tensor."""
    models = list(models if models is not None else pool.model_names)
    if not models:
        raise ForgetlabError("The pool has no fine-tuned models, so there are no task vectors to compare.")
    k = len(models)
    gram = torch.zeros(k, k, dtype=torch.float64)
    names = pool.base.names()
    ckpts = [pool.checkpoint(m) for m in models]
    for step, name in enumerate(names):
        w0 = pool.base.read(name)
        taus = []
        for c in ckpts:
            if isinstance(c, LoraCheckpoint):
                taus.append(c.delta(name).reshape(-1))
            elif name in c:
                taus.append((c.read(name) - w0).reshape(-1))
            else:
                taus.append(torch.zeros(w0.numel()))
        stack = torch.stack(taus).double()
        gram += stack @ stack.T
        report(progress, (step + 1) / len(names), name)
    norms = gram.diagonal().sqrt()
    denom = torch.outer(norms, norms)
    cos = torch.where(denom > 0, gram / denom.clamp_min(1e-300), torch.zeros_like(gram))
    cos = torch.where(torch.isnan(gram), gram, cos)  # a NaN/Inf task vector has no cosine: NaN, not 0
    return CosineMatrix(models, cos.tolist(), norms.tolist())


def distance(theta: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
             theta0: Mapping[str, torch.Tensor]) -> float:
    """D(θ, θ0) = (1/B) Σk ‖θ(k) − θ0(k)‖ / ‖θ0(k)‖ over the tensors k present in both (docs/methods.md#distance)."""
    items = theta.items() if isinstance(theta, Mapping) else theta
    total, count = 0.0, 0
    for name, t in items:
        if name not in theta0:
            continue
        w0 = theta0[name].detach().float()
        n0 = float(w0.norm())
        if n0 == 0:
            continue
        total += float((t.detach().float().to(w0.device) - w0).norm()) / n0
        count += 1
    if count == 0:
        raise ForgetlabError("D(θ, θ0) needs at least one tensor shared by both models with a non-zero base norm.")
    return total / count


def checkpoint_distance(pool, name: str) -> float:
    """D(θt, θ0) for a pool member, streamed from disk."""
    total, count = 0.0, 0
    for _, w0, tau in iter_task_vector(pool.base, pool.checkpoint(name)):
        n0 = float(w0.norm())
        if n0 > 0:
            total += float(tau.norm()) / n0
            count += 1
    return total / max(1, count)


# ------------------------------------------------------------------------------------------ the verbs


@dataclass
class TaskvecSettings:
    """Which task vectors to measure: the norms of each of `models` (default: every fine-tuned model of the
    pool) and, with `cosines`, the cosine matrix between them."""

    models: Optional[Sequence[str]] = None
    cosines: bool = True


@dataclass
class TaskvecResult:
    """The norms of several task vectors and, optionally, their cosines."""

    norms: list[TaskVectorNorms]
    cosine: Optional[CosineMatrix] = None

    def to_frame(self) -> pd.DataFrame:
        """One row per (model, tensor): the norms tables stacked."""
        frames = [n.to_frame().assign(model=n.model) for n in self.norms]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def to_dict(self) -> dict:
        return {"norms": [n.to_dict() for n in self.norms],
                "cosine": self.cosine.to_dict() if self.cosine is not None else None}

    @classmethod
    def from_dict(cls, d: Mapping) -> "TaskvecResult":
        """Rebuild an object saved with `to_dict`."""
        cos = d.get("cosine")
        return cls([TaskVectorNorms(n["model"], list(n.get("rows", []))) for n in d.get("norms", [])],
                   CosineMatrix(**cos) if cos else None)


def check_settings(settings: TaskvecSettings, pool=None) -> None:
    """Refuse an empty or unknown choice of models (with the pool) without reading a tensor."""
    if settings.models is not None and not list(settings.models):
        raise ParameterError("Choose at least one fine-tuned model whose task vector to measure.")
    if pool is not None:
        missing = [m for m in (settings.models or []) if m not in pool.model_names]
        if missing:
            raise ParameterError(f"The pool has no fine-tuned model {missing[0]!r}; its models are: "
                                 f"{', '.join(pool.model_names) or 'none'}.")
        if settings.models is None and not pool.model_names:
            raise ForgetlabError("The pool has no fine-tuned models, so there are no task vectors to measure.")


def run_settings(pool, settings: TaskvecSettings, progress: Progress = None, executor=None) -> TaskvecResult:
    """`task_vector_norms` of every chosen model, then `cosine_matrix` (streamed; `executor` is not used)."""
    models = list(settings.models if settings.models is not None else pool.model_names)
    steps = len(models) + (1 if settings.cosines else 0)
    norms = [task_vector_norms(pool, m, progress=scaled(progress, i / steps, (i + 1) / steps))
             for i, m in enumerate(models)]
    cos = cosine_matrix(pool, models, progress=scaled(progress, len(models) / steps, 1.0)) if settings.cosines else None
    return TaskvecResult(norms, cos)


def save_taskvec(result: TaskvecResult, home_path=None, pool=None) -> Path:
    """Save task-vector norms (and cosines) under the workspace's runs/ (kind `taskvec`)."""
    from forgetlab.core.workspace import save_run

    recipe = {"pool": pool_source(pool), "models": [n.model for n in result.norms],
              "cosines": result.cosine is not None}
    return save_run("taskvec", recipe, result.to_dict(), frame=result.to_frame(), home_path=home_path)


def load_taskvec(path) -> TaskvecResult:
    """Reopen task-vector norms saved by `save_taskvec`."""
    return load_result(path, "taskvec", TaskvecResult, "task-vector norms")


def list_taskvec(home_path=None) -> list:
    """Saved task-vector runs (`forgetlab.core.workspace.SavedRun`s, newest first)."""
    return list_results(home_path, "taskvec")


ANALYSIS = register(Analysis("taskvec", TaskvecSettings, check_settings, run_settings, save_taskvec, load_taskvec,
                             list_taskvec))
