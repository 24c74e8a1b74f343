"""Spherical interpolation family (docs/methods.md#spherical): mergekit 0.1.5's `slerp`, `nuslerp`, `multislerp`
and `karcher`, with mergekit's parameters, defaults and numerics (mergekit's code is followed where it differs
from the papers, for parity; tests/test_merge_mergekit_methods.py compares them with mergekit's own functions).

- slerp: the base and ONE fine-tuned model, the angle between the two whole tensors (flattened); nearly
  parallel tensors (|cos| > 0.9995) fall back to linear interpolation.
- nuslerp: two fine-tuned models, t = w2 / (w1 + w2); with the base (`use_base`) the task vectors are
  interpolated and the base added back; row-wise, column-wise or flattened.
- multislerp: barycentric interpolation of N task vectors (or models) on the hypersphere, through the tangent
  space at their weighted mean, scaled back to their weighted mean norm.
- karcher: the Karcher (Riemannian) mean of the fine-tuned models' directions, iterated, scaled by their mean norm.

CPU kernels (`fast_kernel`, float32 on the CPU, with the base): `nuslerp` of the flattened tensors and `multislerp`
work on the task vectors in place with a few scratch tensors; the same operations in the same order, so the
reference's bits.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.methods.common import UNIT, check_weight_sum, weights_param
from forgetlab.merge.registry import MergekitSpec, ParamSpec, TensorJob, WorkingMemory, fast_kernel, method


def slerp(t: float, v0: torch.Tensor, v1: torch.Tensor, dot_threshold: float = 0.9995,
          eps: float = 1e-8) -> torch.Tensor:
    """mergekit's SLERP of two whole tensors: with cos θ = ⟨v0/|v0|, v1/|v1|⟩ (a norm ≤ eps counts as 1),
    θ(t) = sin((1 − t)θ)/sin θ · v0 + sin(tθ)/sin θ · v1, or (1 − t)·v0 + t·v1 where |cos θ| > dot_threshold.
    The coefficients multiply the raw tensors (not their unit vectors). Returns a new tensor."""
    a = v0.reshape(-1)
    b = v1.reshape(-1)
    if a.numel() == 0:
        return v0.clone()
    na = torch.linalg.vector_norm(a)
    nb = torch.linalg.vector_norm(b)
    na = torch.where(na > eps, na, 1.0)
    nb = torch.where(nb > eps, nb, 1.0)
    dot = float((torch.dot(a, b) / na / nb).clamp(-1, 1))
    if abs(dot) > dot_threshold:
        ca, cb = 1.0 - t, t
    else:
        theta = math.acos(dot)
        s = math.sin(theta)
        ca, cb = math.sin((1 - t) * theta) / s, math.sin(t * theta) / s
    return torch.add(v0 * ca, v1, alpha=cb)


def _unit_rows(x: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=eps)


def nuslerp(t: float, v0: torch.Tensor, v1: torch.Tensor, row_wise: bool = False, flatten: bool = True,
            eps: float = 1e-8) -> torch.Tensor:
    """mergekit's NuSLERP of two tensors: SLERP of each row (vectors along the last axis; along the first with
    `row_wise`, i.e. mergekit's dim=0), or of the flattened tensors with `flatten`. A pair with
    1 − cos²θ ≤ eps² is interpolated linearly."""
    shape = v0.shape
    if flatten:
        v0, v1 = v0.reshape(-1), v1.reshape(-1)
    elif row_wise:
        v0, v1 = v0.transpose(0, -1), v1.transpose(0, -1)
    cos = torch.sum(_unit_rows(v0) * _unit_rows(v1), dim=-1, keepdim=True).clamp(-1, 1)
    colinear = (1 - cos.square()) <= eps ** 2
    theta = torch.acos(torch.where(colinear, 0, cos))
    sin = torch.sin(theta)
    out = (torch.sin((1 - t) * theta) * v0 + torch.sin(t * theta) * v1) / sin
    out = torch.where(colinear, (1 - t) * v0 + t * v1, out)
    if row_wise and not flatten:
        out = out.transpose(0, -1)
    return out.reshape(shape)


def nuslerp_t(weights: Sequence[float]) -> float:
    """NuSLERP's t from the two models' weights: w2 / (w1 + w2), or 0.5 when |w1 + w2| < 1e-6."""
    total = float(weights[0]) + float(weights[1])
    return 0.5 if abs(total) < 1e-6 else float(weights[1]) / total


def multislerp(tensors: Sequence[torch.Tensor], weights: Sequence[float], base: torch.Tensor | None = None,
               normalize_weights: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """mergekit's Multi-SLERP: with vt = θt − θ0 (or θt without a base), unit ut = vt/(|vt| + eps) and weights
    wt (divided by their sum with `normalize_weights`): m = Σ wt·ut / |Σ wt·ut|; tangent g = Σ wt·(ut − ⟨ut, m⟩m);
    result = (m·cos|g| + g·sin|g|/|g|)·Σ wt·|vt| (|g| + eps in both places), plus θ0. One tensor returns itself;
    two tensors whose weighted unit mean vanishes are interpolated linearly; more are refused."""
    if len(tensors) == 1:
        return tensors[0]
    stack = torch.stack(list(tensors), dim=0)
    if base is not None:
        stack -= base
    flat = stack.view(stack.shape[0], -1)
    w = torch.tensor([float(x) for x in weights], dtype=stack.dtype, device=stack.device)
    if normalize_weights:
        w = w / w.sum()
    norms = torch.linalg.vector_norm(flat, dim=-1, keepdim=True)
    units = flat / (norms + eps)
    mean = (units * w.view(-1, 1)).sum(0)
    mean_norm = torch.linalg.vector_norm(mean)
    if mean_norm < eps:
        if stack.shape[0] == 2:
            res = (stack[0] * w[0] + stack[1] * w[1]).view(stack.shape[1:])
            return res + base if base is not None else res
        raise ParameterError(
            "multislerp: the weighted mean of the models' directions is zero for a tensor (antipodal task vectors "
            "whose weights balance out exactly); change the weights.")
    mean = mean / mean_norm
    dots = (units * mean).sum(-1, keepdim=True)
    tangent = ((units - dots * mean) * w.view(-1, 1)).sum(0)
    tn = torch.linalg.vector_norm(tangent) + eps
    result = mean * torch.cos(tn) + tangent * (torch.sin(tn) / tn)
    result = (result * (norms.squeeze(-1) * w).sum()).view(stack.shape[1:])
    return result + base if base is not None else result


def karcher_mean(tensors: Sequence[torch.Tensor], alphas: Sequence[float], max_iter: int = 10,
                 tol: float = 1e-5) -> torch.Tensor:
    """mergekit's weighted Karcher mean on the unit hypersphere: directions ut = θt/|θt| (norms ≤ tol left out),
    start at the normalised weighted mean, then at most `max_iter` Riemannian gradient steps
    g = Σ αt·θt/sin θt·(ut − cos θt·m) (θt = arccos⟨m, ut⟩; terms with θt < tol skipped), m ← cos|g|·m +
    sin|g|·g/|g|, renormalised, stopping when |g| < tol; the result is (Σ αt·|θt|)·m."""
    if len(tensors) == 1:
        return tensors[0]
    norms = [torch.linalg.vector_norm(t) for t in tensors]
    units = [torch.zeros_like(t) if float(n) == 0.0 else t / n for t, n in zip(tensors, norms)]
    valid = [i for i, n in enumerate(norms) if float(n) > tol]
    if not valid:
        return torch.zeros_like(tensors[0])
    a_sum = sum(alphas[i] for i in valid)
    a_norm = [alphas[i] / a_sum for i in valid]
    units_v = [units[i] for i in valid]
    mean = torch.zeros_like(units_v[0])
    for a, u in zip(a_norm, units_v):
        mean += a * u
    mn = torch.linalg.vector_norm(mean)
    mean = units_v[0].clone() if float(mn) < tol else mean / mn
    for _ in range(max_iter):
        tangent = torch.zeros_like(mean)
        for a, u in zip(a_norm, units_v):
            dot = torch.clamp(torch.dot(mean.flatten(), u.flatten()), -1.0, 1.0)
            theta = torch.arccos(dot)
            if float(theta) < tol:
                continue
            tangent += a * (theta / torch.sin(theta)) * (u - dot * mean)
        tn = torch.linalg.vector_norm(tangent)
        if float(tn) < tol:
            break
        mean = torch.cos(tn) * mean + torch.sin(tn) * (tangent / tn)
        un = torch.linalg.vector_norm(mean)
        if float(un) > tol:
            mean = mean / un
    scale = sum(a * n for a, n in zip(alphas, norms))
    return scale * mean


def _t_param(help_text: str) -> ParamSpec:
    return ParamSpec("t", "float", 0.5, help_text, UNIT)


def _use_base_param() -> ParamSpec:
    return ParamSpec("use_base", "bool", True, "Interpolate the task vectors θt − θ0 and add the base back "
                     "(mergekit with base_model); false: interpolate the models' weights themselves (mergekit "
                     "without base_model).")


@method("slerp", "SLERP: spherical interpolation between the base and one fine-tuned model.",
        (_t_param("t = 0 gives the base, t = 1 the fine-tuned model (mergekit's t; it has no default there)."),),
        max_models=1, mergekit=MergekitSpec("slerp", required=("t",)), in_place=False,
        extra={"models_hint": "SLERP interpolates the base and ONE fine-tuned model; for several models use "
                              "multislerp or karcher, for two nuslerp."},
        formula="θ = sin((1−t)Ω)/sin Ω·θ0 + sin(tΩ)/sin Ω·θ1, cos Ω = ⟨θ0, θ1⟩/(|θ0||θ1|)",
        memory=WorkingMemory((3.1, 0)),
        title="SLERP", paper="Shoemake, Animating rotation with quaternion curves (SIGGRAPH 1985)")
def _slerp(job: TensorJob) -> torch.Tensor:
    return slerp(job.params["t"], job.base, job.finetuned[0])


@method("nuslerp", "NuSLERP: spherical interpolation of two fine-tuned models (their task vectors), "
        "flattened or row by row.",
        (weights_param(), ParamSpec("nuslerp_flatten", "bool", True, "Interpolate the flattened tensors (one "
                                    "angle per tensor)."),
         ParamSpec("nuslerp_row_wise", "bool", False, "With nuslerp_flatten false: one angle per column vector "
                   "(mergekit's dim 0) instead of per row; ignored when flattening, as in mergekit."),
         _use_base_param()),
        min_models=2, max_models=2,
        mergekit=MergekitSpec("nuslerp", base="optional", required=("weight",)),
        in_place=False, base_input=lambda p: p["use_base"],
        extra={"models_hint": "NuSLERP interpolates exactly two fine-tuned models; for more use multislerp."},
        formula="θ = θ0 + slerp(w2/(w1+w2), τ1, τ2)", memory=WorkingMemory(fast=(3.1, 0), reference=(7.1, 0)),
        title="NuSLERP", paper="mergekit's nuslerp method")
def _nuslerp(job: TensorJob) -> torch.Tensor:
    p = job.params
    t = nuslerp_t(p["weights"])
    a, b = job.finetuned
    if p["use_base"]:
        out = nuslerp(t, a - job.base, b - job.base, p["nuslerp_row_wise"], p["nuslerp_flatten"])
        return out.add_(job.base)
    return nuslerp(t, a, b, p["nuslerp_row_wise"], p["nuslerp_flatten"])


def _check_multislerp(params: dict, n: int) -> None:
    if params["normalize_weights"]:
        check_weight_sum(params["weights"], "multislerp", "normalize_weights")


@method("multislerp", "Multi-SLERP: barycentric spherical interpolation of several task vectors.",
        (weights_param(), ParamSpec("normalize_weights", "bool", True, "Divide the weights by their sum."),
         ParamSpec("eps", "float", 1e-8, "Small constant added to norms.", (0.0, 1.0)), _use_base_param()),
        check=_check_multislerp,
        mergekit=MergekitSpec("multislerp", base="optional", required=("weight",)),
        in_place=False, base_input=lambda p: p["use_base"],
        formula="θ = θ0 + exp_m(Σ wt·log_m(ut))·Σ wt·|τt|", memory=WorkingMemory(fast=(5.1, 0), reference=(2.0, 4.1)),
        title="Multi-SLERP", paper="Goddard, Multi-SLERP (blog post, 2025)")
def _multislerp(job: TensorJob) -> torch.Tensor:
    p = job.params
    if len(job.finetuned) == 1:
        return job.finetuned[0].clone()  # the method only reads the job's tensors (in_place=False)
    return multislerp(job.finetuned, p["weights"], job.base if p["use_base"] else None,
                      p["normalize_weights"], p["eps"])


@method("karcher", "Karcher mean: the Riemannian mean of the fine-tuned models on the hypersphere, scaled "
        "by their mean norm.",
        (ParamSpec("max_iter", "int", 10, "Most gradient steps per tensor.", (1, 1000)),
         ParamSpec("tol", "float", 1e-5, "Stop when the tangent step is shorter than this.", (0.0, 1.0))),
        mergekit=MergekitSpec("karcher", base="ignored"), in_place=False, base_input=False,
        formula="θ = (1/N·Σ|θt|)·argmin_m Σ arccos²⟨m, θt/|θt|⟩", memory=WorkingMemory((6.1, 1.0)),
        title="Karcher mean", paper="mergekit's karcher method")
def _karcher(job: TensorJob) -> torch.Tensor:
    n = len(job.finetuned)
    out = karcher_mean(job.finetuned, [1.0 / n] * n, job.params["max_iter"], job.params["tol"])
    return out.clone() if n == 1 else out


@fast_kernel("multislerp")
def _multislerp_fast(job: TensorJob) -> torch.Tensor | None:
    """`multislerp` with the base (N ≥ 2): the task vectors made in place and three scratch tensors instead of
    the reference's stack and its N-row temporaries; the unit vectors replace the task vectors once the mean
    direction is known not to vanish (the linear fallback needs the task vectors). The same float32 operations
    in the same order as the reference, so the same bits (tests/test_merge_mergekit_kernels.py). None (the
    reference) for one model or use_base false."""
    p = job.params
    n = len(job.finetuned)
    if n == 1 or not p["use_base"]:
        return None
    taus = job.take_taus()
    w = torch.tensor([float(x) for x in p["weights"]], dtype=taus[0].dtype)
    if p["normalize_weights"]:
        w = w / w.sum()
    eps = p["eps"]
    norms = torch.stack([torch.linalg.vector_norm(t) for t in taus])
    tmp, tmp2 = torch.empty_like(taus[0]), torch.empty_like(taus[0])
    mean = torch.zeros_like(taus[0])
    for i, tau in enumerate(taus):
        torch.div(tau, norms[i] + eps, out=tmp)
        mean += tmp.mul_(w[i])
    mean_norm = torch.linalg.vector_norm(mean)
    if mean_norm < eps:
        if n == 2:
            return (taus[0] * w[0] + taus[1] * w[1]) + job.base
        raise ParameterError(
            "multislerp: the weighted mean of the models' directions is zero for a tensor (antipodal task vectors "
            "whose weights balance out exactly); change the weights.")
    mean /= mean_norm
    units = [tau.div_(norms[i] + eps) for i, tau in enumerate(taus)]  # the task vectors are no longer needed
    # The reference reduces rows of an (N, M) tensor; a lone 1-D sum adds in another order, a row seen twice
    # (a stride-0 view) takes the rows' path, so the same bits.
    dots = [torch.mul(u, mean, out=tmp2).view(1, -1).expand(2, -1).sum(-1)[0] for u in units]
    tangent = torch.zeros_like(mean)
    for i, u in enumerate(units):
        torch.sub(u, torch.mul(mean, dots[i], out=tmp2), out=tmp).mul_(w[i])
        tangent += tmp
    tn = torch.linalg.vector_norm(tangent) + eps
    result = mean.mul_(torch.cos(tn)).add_(tangent.mul_(torch.sin(tn) / tn))
    return result.mul_((norms * w).sum()).add_(job.base)


@fast_kernel("nuslerp")
def _nuslerp_fast(job: TensorJob) -> torch.Tensor | None:
    """`nuslerp` of the flattened task vectors (the default): the task vectors made in place, two scratch tensors,
    and only the branch the (single) angle selects, where the reference's torch.where computes both. The same
    float32 operations in the same order, so the same bits. None (the reference) for rows or use_base false."""
    p = job.params
    if not (p["use_base"] and p["nuslerp_flatten"]):
        return None
    t = nuslerp_t(p["weights"])
    v0, v1 = (x.reshape(-1) for x in job.take_taus())
    u0, u1 = torch.empty_like(v0), torch.empty_like(v0)
    eps_row = 1e-7  # _unit_rows' clamp
    torch.div(v0, torch.linalg.vector_norm(v0, dim=-1, keepdim=True).clamp(min=eps_row), out=u0)
    torch.div(v1, torch.linalg.vector_norm(v1, dim=-1, keepdim=True).clamp(min=eps_row), out=u1)
    cos = torch.sum(u0.mul_(u1), dim=-1, keepdim=True).clamp(-1, 1)
    colinear = (1 - cos.square()) <= 1e-8 ** 2
    if bool(colinear):
        out = torch.mul(v0, 1 - t, out=u0).add_(torch.mul(v1, t, out=u1))
    else:
        theta = torch.acos(cos)
        out = torch.mul(v0, torch.sin((1 - t) * theta), out=u0)
        out.add_(torch.mul(v1, torch.sin(t * theta), out=u1)).div_(torch.sin(theta))
    return out.reshape(job.base.shape).add_(job.base)
