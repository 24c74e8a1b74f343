"""Submodule-linearity merging, ``slwm`` (docs/methods.md#slwm).

For every submodule k (a decoder layer; or its attention and its MLP; or each attention head and the MLP) and
tasks t = 1..T, with Δt(x) = f_k(x; θ0 + τt) − f_k(x; θ0) on samples x of task t's probe data (inputs captured
once, from fine-tuned model t by default, and held fixed), the weights a = (a1..aT) minimise
Σt Σx∈Dt ‖Σj aj·Δj(x) − Δt(x)‖². Closed form: G a = b with Gij = Σt Σx ⟨Δi(x), Δj(x)⟩ and
bi = Σt Σx ⟨Δi(x), Δt(x)⟩, solved as (G + ρ·(tr G / T)·I) a = b (``ridge`` ρ, relative to G's scale).
Merged: θk = θ0,k + Σj aj·τj,k. Parameters outside every submodule (embeddings, final norm, lm_head; layer norms
at the ``attn_mlp`` / ``head_mlp`` levels; the output-projection bias and q/k norms at ``head_mlp``) use task
arithmetic with λ = 1/T. At ``head_mlp`` under grouped-query attention a key/value head's rows take the mean of
the weights of the query heads that read them. A submodule that no task changed gets 1/T.

The coefficients are per-tensor maps of shape (T, …) broadcastable to the tensor (a scalar per task for whole
tensors; per row or column for head slices). They plug into the merge registry as method ``slwm``, whose
`prepare` hook computes them from a model pool.
"""
from __future__ import annotations

import contextlib
from collections import ChainMap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import torch

from forgetlab.core.checkpoints import SafetensorsCheckpoint, load_model
from forgetlab.core.submodules import (CAPTURES, capture_inputs,
                                          check_head_decomposition, check_same_structure, encode_samples, param_dict,
                                          run_submodule, select_pairs)
from forgetlab.core.anatomy import Anatomy
from forgetlab.core.errors import IncompatibleModelsError, ParameterError
from forgetlab.core.progress import Progress, report, scaled
from forgetlab.merge.api import merge_state_dicts
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, method
from forgetlab.merge.working_copy import WorkingCopy, stored_params

SLWM_LEVELS = ("layer", "attn_mlp", "head_mlp")
DEFAULT_LEVEL = "attn_mlp"
DEFAULT_SAMPLES = 30
DEFAULT_RIDGE = 1e-4
_GROUP_SAMPLES = 32   # probe pairs whose submodule inputs are held at once when θt are read from checkpoints


def solve_weights(G: np.ndarray, b: np.ndarray, ridge: float = DEFAULT_RIDGE) -> tuple[np.ndarray, bool]:
    """Solve (G + ρ·(tr G / T)·I) a = b. Returns (a, fallback): a = 1/T when G is zero (no task changed the
    submodule), with fallback True."""
    G = np.asarray(G, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    T = G.shape[0]
    tr = float(np.trace(G))
    if not np.isfinite(tr) or tr <= 0.0:
        return np.full(T, 1.0 / T), True
    A = G + ridge * (tr / T) * np.eye(T)
    try:
        a = np.linalg.solve(A, b)
    except np.linalg.LinAlgError:
        a = np.linalg.lstsq(A, b, rcond=None)[0]
    return a, False


@dataclass
class _Acc:
    G: np.ndarray
    b: np.ndarray
    count: int = 0


@dataclass
class SubmoduleWeights:
    """The weights a chosen for one submodule (``kind`` is "layer", "attn", "mlp" or "head")."""

    layer: int
    kind: str
    head: Optional[int]
    weights: np.ndarray
    fallback: bool
    gram: np.ndarray

    @property
    def label(self) -> str:
        """e.g. ``layer 3 attn`` or ``layer 3 head 5``."""
        if self.kind == "layer":
            return f"layer {self.layer}"
        if self.kind == "head":
            return f"layer {self.layer} head {self.head}"
        return f"layer {self.layer} {self.kind}"

    def to_dict(self) -> dict:
        """The submodule's weights and Gram matrix as plain lists (a saved run's results.json)."""
        return {"layer": self.layer, "kind": self.kind, "head": self.head, "weights": np.asarray(self.weights).tolist(),
                "fallback": bool(self.fallback), "gram": np.asarray(self.gram).tolist()}

    @classmethod
    def from_dict(cls, d) -> "SubmoduleWeights":
        """The submodule's weights `to_dict` saved."""
        return cls(int(d["layer"]), d["kind"], d["head"], np.asarray(d["weights"], dtype=np.float64),
                   bool(d["fallback"]), np.asarray(d["gram"], dtype=np.float64))


@dataclass
class SlwmWeights:
    """The per-submodule weights of submodule-linearity merging and the tensors they apply to."""

    level: str
    tasks: list[str]
    models: list[str]
    samples: int
    ridge: float
    capture: str
    submodules: list[SubmoduleWeights]
    anatomy: Anatomy = field(repr=False, default=None)
    shapes: dict = field(repr=False, default_factory=dict)
    seed: Optional[int] = None     # the seed of the probe draw (None: each task's first `samples` probe pairs)

    def to_frame(self) -> pd.DataFrame:
        """The weights table: one row per submodule (submodule, layer, module, head, fallback), one column per
        task (named after the task; its model in `models`)."""
        rows = []
        for s in self.submodules:
            row = {"submodule": s.label, "layer": s.layer, "module": s.kind, "head": s.head,
                   "fallback": s.fallback}
            for t, w in zip(self.tasks, s.weights):
                row[t] = float(w)
            rows.append(row)
        df = pd.DataFrame(rows)
        if len(df):
            df["head"] = df["head"].astype("Int64")
        return df

    def to_dict(self) -> dict:
        """The weights and what they were computed from (a saved run's results.json); the model's anatomy and
        tensor shapes are left out, so a loaded copy has a table but no `coefficients`."""
        return {"level": self.level, "tasks": list(self.tasks), "models": list(self.models), "samples": self.samples,
                "ridge": self.ridge, "capture": self.capture, "seed": self.seed,
                "submodules": [s.to_dict() for s in self.submodules]}

    @classmethod
    def from_dict(cls, d) -> "SlwmWeights":
        """The weights `to_dict` saved (without anatomy and shapes)."""
        return cls(d["level"], list(d["tasks"]), list(d["models"]), int(d["samples"]), float(d["ridge"]),
                   d["capture"], [SubmoduleWeights.from_dict(s) for s in d["submodules"]], seed=d.get("seed"))

    def coefficients(self) -> dict[str, torch.Tensor]:
        """Per-tensor coefficient maps (T, …) broadcastable to each tensor: θ = θ0 + Σj coef[j]·τj."""
        an, T = self.anatomy, len(self.models)
        ta = torch.full((T,), 1.0 / T)
        out: dict[str, torch.Tensor] = {}

        def scalar(w, ndim):
            return torch.as_tensor(w, dtype=torch.float32).reshape((T,) + (1,) * ndim)

        for name, shape in self.shapes.items():
            out[name] = scalar(ta, len(shape))
        heads: dict[int, dict[int, np.ndarray]] = {}
        for s in self.submodules:
            if s.kind == "head":
                heads.setdefault(s.layer, {})[s.head] = s.weights
                continue
            names = an.params_of(s.kind, layer=s.layer)
            for n in names:
                if n in self.shapes:
                    out[n] = scalar(s.weights, len(self.shapes[n]))
        for layer, hw in heads.items():
            # along-dimension maps, initialised to 1/T; head slices overwrite their rows / columns
            maps: dict[str, torch.Tensor] = {}
            group: dict[tuple, list] = {}
            for h, w in hw.items():
                for sl in an.head_slices(layer, h):
                    group.setdefault((sl.name, sl.dim, sl.start, sl.stop), []).append(w)
            for (name, dim, start, stop), ws in group.items():
                if name not in self.shapes:
                    continue
                shape = self.shapes[name]
                if name not in maps:
                    maps[name] = torch.full((T, shape[dim]), 1.0 / T)
                maps[name][:, start:stop] = torch.as_tensor(np.mean(ws, axis=0), dtype=torch.float32)[:, None]
                dims = [1] * len(shape)
                dims[dim] = shape[dim]
                out[name] = maps[name].reshape((T,) + tuple(dims))
        return out


def _resolve(pool_or_models, tasks, models, device):
    """(base, [finetuned], tokenizer, [pairs per task], task names, model names, template)."""
    if isinstance(pool_or_models, (tuple, list)):
        if len(pool_or_models) != 4:
            raise ParameterError("Pass a ModelPool or a (base_model, [finetuned_models], tokenizer, "
                                 "[pairs per task]) tuple.")
        base, fts, tok, pairs = pool_or_models
        fts, pairs = list(fts), list(pairs)
        if len(fts) != len(pairs):
            raise ParameterError(f"{len(fts)} fine-tuned models but {len(pairs)} probe sets; give one per model.")
        tasks = list(tasks) if tasks else [f"task{i + 1}" for i in range(len(fts))]
        return base, fts, tok, pairs, tasks, list(models or tasks), None
    pool = pool_or_models
    tasks, models = _pool_tasks(pool, tasks, models)
    base = pool.load("base", device=device)
    fts = [pool.load(m, device=device) for m in models]
    pairs = [pool.probes.tasks[t].probe for t in tasks]
    return base, fts, pool.tokenizer, pairs, tasks, models, getattr(pool.probes, "template", None)


def _pool_tasks(pool, tasks, models) -> tuple[list[str], list[str]]:
    """(tasks, models) of a pool, one task per model (models default to those named like the pool's tasks)."""
    if models is None and tasks is None:
        models = [m for m in pool.model_names if m in pool.probes.tasks] or pool.model_names
    if models is None:
        models = []
        for t in tasks:
            if t not in pool.model_names:
                raise ParameterError(f"No model of the pool is named like task {t!r}; pass models= (one per task) "
                                     f"from {', '.join(pool.model_names)}.")
            models.append(t)
    models = list(models)
    if tasks is None:
        tasks = list(models)
    tasks = list(tasks)
    if len(tasks) != len(models):
        raise ParameterError(f"{len(models)} models but {len(tasks)} tasks; give one task per model.")
    for t in tasks:
        pool.probes.task(t)
    return tasks, models


def _weight_inputs(pool_or_models, tasks, models, device, stack):
    """(working copy of the base, [θt mapping per model], tokenizer, [pairs per task], tasks, models, template,
    lazy). From a pool, the working copy is the base loaded afresh and θ0 and the θt are read from the
    checkpoints when asked (`stored_params`, lazy True), so no fine-tuned model is loaded; a checkpoint that
    cannot be read so is borrowed whole from the pool into `stack` (an ExitStack) for the length of the job."""
    if isinstance(pool_or_models, (tuple, list)):
        base, fts, tok, pairs, tasks, models, template = _resolve(pool_or_models, tasks, models, device)
        for m, ft in zip(models, fts):
            check_same_structure(base, ft, m)
        return WorkingCopy.of(base), [param_dict(ft) for ft in fts], tok, pairs, tasks, models, template, False

    pool = pool_or_models
    tasks, models = _pool_tasks(pool, tasks, models)
    base_ck = pool.checkpoint("base")
    work, lazy = None, False
    if type(base_ck) is SafetensorsCheckpoint:
        own = load_model(base_ck, device=device or "cpu", dtype=torch.float32)
        theta0 = stored_params(base_ck, own, device=next(own.parameters()).device)
        if theta0 is not None:
            work, lazy = WorkingCopy(own, theta0), True
    if work is None:
        work = WorkingCopy.of(stack.enter_context(pool.borrow("base", device)))
    dev = next(work.model.parameters()).device
    base_an = Anatomy.from_model(work.model)
    targets = []
    for m in models:
        ckpt = pool.checkpoint(m)
        theta = stored_params(ckpt, work.model, device=dev) if lazy else None
        if theta is None:
            ft = stack.enter_context(pool.borrow(m, device))
            check_same_structure(work.model, ft, m)
            theta = param_dict(ft)
        else:
            an = Anatomy.from_config(ckpt.config)
            if not base_an.same_structure(an):
                raise IncompatibleModelsError(f"The base ({base_an.describe()}) and {m} ({an.describe()}) differ "
                                              "in structure.")
        targets.append(theta)
    pairs = [pool.probes.tasks[t].probe for t in tasks]
    return work, targets, pool.tokenizer, pairs, tasks, models, getattr(pool.probes, "template", None), lazy


def _masked_flat(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[b, s, h] → [n_real·h]; [b, n, s, h] → [n, n_real·h] (heads kept apart)."""
    if x.dim() == 3:
        return x[mask].reshape(-1).double()
    return x.permute(1, 0, 2, 3)[:, mask].reshape(x.shape[1], -1).double()


def slwm_weights(pool_or_models, tasks: Optional[Sequence[str]] = None, *, models: Optional[Sequence[str]] = None,
                 level: str = DEFAULT_LEVEL, samples: Optional[int] = DEFAULT_SAMPLES, ridge: float = DEFAULT_RIDGE,
                 capture: str = "finetuned", batch_size: int = 8, max_length: int = 128,
                 device: Optional[str] = None, seed: Optional[int] = None, progress: Progress = None) -> SlwmWeights:
    """The closed-form weights of submodule-linearity merging (module docstring) for every submodule of a level.

    ``pool_or_models``: a ModelPool (models default to those named like the pool's tasks) or a
    ``(base, [finetuned], tokenizer, [probe pairs per task])`` tuple. ``samples`` probe pairs per task: the first
    ones, or — with a ``seed`` — drawn at random, task t's with seed ``seed + t`` (`select_pairs`,
    docs/methods.md#probe-draws).
    """
    if level not in SLWM_LEVELS:
        raise ParameterError(f"slwm level must be one of {', '.join(SLWM_LEVELS)}; got {level!r}.")
    if capture not in CAPTURES:
        raise ParameterError(f"capture must be one of {', '.join(CAPTURES)}; got {capture!r}.")
    if not (ridge >= 0):
        raise ParameterError(f"ridge must be ≥ 0; got {ridge}.")
    with contextlib.ExitStack() as stack:
        work, targets, tok, pairs, tasks, models, template, lazy = _weight_inputs(pool_or_models, tasks, models,
                                                                                  device, stack)
        return _solve_all(work, targets, tok, pairs, tasks, models, template, lazy, level, samples, ridge, capture,
                          batch_size, max_length, progress, seed)


def _solve_all(work, targets, tok, pairs, tasks, models, template, lazy, level, samples, ridge, capture,
               batch_size, max_length, progress, seed=None) -> SlwmWeights:
    """slwm_weights' accumulation and solve on a working copy of the base and the θt mappings `targets`.

    The batches of a task are taken in groups (one batch, or about `_GROUP_SAMPLES` probe pairs when the θt are
    read from checkpoints, `lazy`): the group's submodule inputs are captured, then layer by layer every θt's
    layer is read once for the whole group. Each accumulator still adds the batches in their order, so the
    grouping changes no number."""
    if not targets:
        raise ParameterError("slwm needs at least one fine-tuned model.")
    anatomy = Anatomy.from_model(work.model)
    chosen = [select_pairs(p, samples, t, None if seed is None else seed + k)
              for k, (p, t) in enumerate(zip(pairs, tasks))]
    T = len(targets)
    kinds = {"layer": ("layer",), "attn_mlp": ("attn", "mlp"), "head_mlp": ("head", "mlp")}[level]
    dev = next(work.model.parameters()).device
    L = anatomy.num_layers
    accs: dict[tuple, _Acc] = {}
    for i in range(L):
        for k in kinds:
            for h in (range(anatomy.num_heads) if k == "head" else [None]):
                accs[(i, k, h)] = _Acc(np.zeros((T, T)), np.zeros(T))
    encs = [encode_samples(tok, p, max_length=max_length, template=template) for p in chosen]
    per_group = max(1, _GROUP_SAMPLES // max(1, batch_size)) if lazy else 1
    groups = []
    for t, e in enumerate(encs):
        spans = [(a, min(a + batch_size, len(e))) for a in range(0, len(e), batch_size)]
        groups += [(t, spans[g:g + per_group]) for g in range(0, len(spans), per_group)]
    total = max(1, sum(len(sp) for _, sp in groups) * L)
    step = 0
    checked = False
    with torch.no_grad():
        for t, spans in groups:
            work.lerp(targets[t], 1.0 if capture == "finetuned" else 0.0)
            batches = []
            for a, b in spans:
                chunk = encs[t].chunk(a, b)
                ids, mask = chunk.input_ids.to(dev), chunk.mask().to(dev)
                caps, _ = capture_inputs(work.model, anatomy, ids, range(L))
                batches.append((a, b, mask, caps))
            for i in range(L):
                names = anatomy.params_of("layer", layer=i)
                layer, theta0 = targets, work.base
                if lazy:        # layer i of θ0 and of every θt read once for the group, not once per batch
                    layer = [{n: tg[n] for n in names} for tg in targets]
                    work.base = ChainMap({n: theta0[n] for n in names}, theta0)
                for a, b, mask, caps in batches:
                    work.lerp(layer[0], 0.0, names)
                    f0 = {k: run_submodule(work, anatomy, i, k, caps[i]) for k in kinds}
                    if "head" in kinds and not checked:
                        check_head_decomposition(work, anatomy, i, caps[i], f0["head"])
                        checked = True
                    deltas = {k: [] for k in kinds}
                    for j in range(T):
                        work.lerp(layer[j], 1.0, names)
                        for k in kinds:
                            deltas[k].append(_masked_flat(run_submodule(work, anatomy, i, k, caps[i]) - f0[k], mask))
                    for k in kinds:
                        D = torch.stack(deltas[k])  # [T, M] or [T, heads, M]
                        if k == "head":
                            gram = torch.einsum("inm,jnm->nij", D, D).numpy()
                            for h in range(anatomy.num_heads):
                                acc = accs[(i, k, h)]
                                acc.G += gram[h]
                                acc.b += gram[h][:, t]
                                acc.count += b - a
                        else:
                            gram = (D @ D.T).numpy()
                            acc = accs[(i, k, None)]
                            acc.G += gram
                            acc.b += gram[:, t]
                            acc.count += b - a
                    step += 1
                    report(progress, step / total, f"task {tasks[t]}: layer {i}")
                work.base = theta0
                del layer
            del batches
    subs = []
    for (i, k, h), acc in accs.items():
        w, fb = solve_weights(acc.G, acc.b, ridge)
        subs.append(SubmoduleWeights(i, k, h, w, fb, acc.G))
    shapes = {n: tuple(p.shape) for n, p in work.model.named_parameters(remove_duplicate=False)}
    report(progress, 1.0, "weights solved")
    return SlwmWeights(level, tasks, models, len(chosen[0]), float(ridge), capture, subs, anatomy, shapes, seed)


# ====================================================================================== registry

class PreparedCoefficients(dict):
    """The per-tensor coefficient maps of slwm, with the weights it chose (`weights`, a SlwmWeights)."""

    weights: Optional[SlwmWeights] = None


def pool_names_for(pool, refs: Sequence[str], method: str = "slwm") -> list[str]:
    """The pool names of a recipe's models `refs` (a name, or a path the pool's checkpoint points at), for a pool
    method (`method`, named in the ParameterError for a model the pool does not hold: its probe data is needed)."""
    out = []
    for ref in refs:
        if ref in pool.model_names:
            out.append(ref)
            continue
        found = None
        for n in pool.model_names:
            ck = pool.checkpoint(n)
            for cand in (getattr(ck, "ref", None), getattr(ck, "path", None)):
                try:
                    if cand is not None and Path(str(cand)).resolve() == Path(str(ref)).resolve():
                        found = n
                except OSError:
                    pass
        if found is None:
            raise ParameterError(f"{method}: model {ref!r} is not a member of the pool ({', '.join(pool.model_names)}); "
                                 f"{method} needs its task's probe data. Add it to the pool file, or merge models "
                                 "of the pool.")
        out.append(found)
    return out


def prepare_slwm(ctx) -> PreparedCoefficients:
    """The registry's prepare hook: solve the weights on the pool's probe data and return coefficient maps."""
    p = ctx.params
    names = pool_names_for(ctx.pool, ctx.model_names, "slwm")
    tasks = [t.strip() for t in str(p.get("tasks") or "").split(",") if t.strip()] or None
    weights = slwm_weights(ctx.pool, tasks, models=names, level=p["level"], samples=int(p["samples"]),
                           ridge=float(p["ridge"]), capture=p["capture"], progress=ctx.progress)
    out = PreparedCoefficients(weights.coefficients())
    out.weights = weights
    return out


def slwm_prepare_memory(model: int, n_models: int, linear_inputs: int) -> dict[str, int]:
    """slwm's prepare phase on the CPU, in bytes (`WorkingMemory.prepare`; `model`: the model's float32 bytes): the
    working copy, the layers read from the checkpoints and the forward passes (2.3 model sizes measured by
    bench/prepare_memory.py on a 42M Llama, rounded up; the forward passes' share shrinks with the model)."""
    return {"working copy, layers read and forward passes": int(2.4 * model)}


@method("slwm", "Submodule-linearity merging: per-submodule task weights solved in closed form on probe data.",
        (ParamSpec("level", "str", DEFAULT_LEVEL, "Submodules: decoder layers, attention + MLP, or heads + MLP.",
                   choices=SLWM_LEVELS),
         ParamSpec("samples", "int", DEFAULT_SAMPLES, "Probe samples per task used to fit the weights.", (1, 100000)),
         ParamSpec("ridge", "float", DEFAULT_RIDGE, "Ridge ρ (relative to tr G / T) added to G for stability.",
                   (0.0, 1000.0)),
         ParamSpec("capture", "str", "finetuned", "Whose forward pass gives the submodule inputs: task t's "
                   "fine-tuned model or the base.", choices=CAPTURES),
         ParamSpec("tasks", "str", "", "Task of each model, comma-separated in model order (default: the task "
                   "named like the model).")),
        min_models=1, prepare=prepare_slwm, needs_pool=True,
        formula="θk = θ0,k + Σj aj·τj,k with G a = b per submodule k; λ = 1/T elsewhere",
        memory=WorkingMemory((4.9, 0.6), prepare=slwm_prepare_memory),
        title="submodule-linearity merging",
        paper="Dai et al., Leveraging Submodule Linearity Enhances Task Arithmetic Performance in LLMs (ICLR 2025)")
def _slwm(job: TensorJob) -> torch.Tensor:
    """θ = θ0 + Σj coef[j]·τj with the prepared coefficient map (task arithmetic λ = 1/T where none)."""
    T = len(job.finetuned)
    coef = job.prepared
    if coef is None:
        coef = torch.full((T,) + (1,) * job.base.dim(), 1.0 / T)
    coef = coef.to(device=job.base.device, dtype=job.base.dtype)
    out = job.base.clone()
    for j, tau in enumerate(job.taus):
        out.add_(coef[j] * tau)
    return out


def slwm_merge(pool_or_models, tasks: Optional[Sequence[str]] = None, level: str = DEFAULT_LEVEL,
               samples: Optional[int] = DEFAULT_SAMPLES, ridge: float = DEFAULT_RIDGE, *,
               models: Optional[Sequence[str]] = None, capture: str = "finetuned",
               progress: Progress = None) -> tuple[dict[str, torch.Tensor], pd.DataFrame]:
    """Submodule-linearity merge in memory: returns (merged state dict, weights table submodule × task)."""
    weights = slwm_weights(pool_or_models, tasks, models=models, level=level, samples=samples, ridge=ridge,
                           capture=capture, progress=scaled(progress, 0.0, 0.8))
    base, fts, *_ = _resolve(pool_or_models, weights.tasks, weights.models, None)
    base_sd = {k: v.detach() for k, v in base.state_dict().items()}
    ft_sds = [{k: v.detach() for k, v in ft.state_dict().items()} for ft in fts]
    merged = merge_state_dicts("slwm", base_sd, ft_sds, prepared=weights.coefficients(),
                               config=getattr(base, "config", None), progress=scaled(progress, 0.8, 1.0),
                               level=level, samples=samples or 1, ridge=ridge, capture=capture)
    return merged, weights.to_frame()

