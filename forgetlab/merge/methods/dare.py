"""DARE (docs/methods.md#dare): drop each entry of a task vector with probability p (one for all models, or one per
model as mergekit's per-model density), with masks seeded per (tensor, model)
(`forgetlab.merge.registry.tensor_generator`), rescale the survivors, then either task arithmetic (`dare_linear`)
or TIES's sign election (`dare_ties`).

Both follow mergekit 0.1.5's meaning of these names, defaults included: `rescale` is "l1" (the survivors are
scaled so that the task vector keeps its L1 norm, mergekit's `rescale: true`), "inverse" (× 1/(1 − p), the DARE
paper's rule and forgetlab's DARE before issue 25) or "none"; `normalize` (default false) divides by the
weights' sum — for dare_ties the sum of the agreeing weights, so `normalize: true` is TIES's disjoint mean and
false (mergekit's default) the sum of the agreeing entries. forgetlab's former dare_ties is
`{normalize: true, rescale: inverse}`, its former dare_linear `{rescale: inverse}`.

Reference: `dare_mask`, `dare`. CPU kernel: `dare_` (the same draws block by block, in place)."""
from __future__ import annotations

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.methods.common import (UNIT, add_scaled, l1_scale, lam_param, normalize_param, normalized_lam,
                                            seed_param, weights_param)
from forgetlab.merge.methods.ties import ties_combine, ties_combine_into_
from forgetlab.merge.mergekit_params import gta_params
from forgetlab.merge.registry import MergekitSpec, ParamSpec, TensorJob, WorkingMemory, fast_kernel, method
from forgetlab.merge.select import BLOCK, block_ranges

RESCALES = ("l1", "inverse", "none")


def dare_mask(shape: torch.Size | tuple[int, ...], drop: float, generator: torch.Generator,
              device: str | torch.device = "cpu") -> torch.Tensor:
    """DARE keep mask: each entry survives independently with probability 1 − drop (u ≥ drop, u ~ U[0, 1))."""
    if drop <= 0:
        return torch.ones(shape, dtype=torch.bool, device=device)
    u = torch.rand(shape, generator=generator, device=device)
    return u >= drop


def dare(tau: torch.Tensor, drop: float, generator: torch.Generator, rescale: str = "inverse") -> torch.Tensor:
    """DARE: drop each entry of τ with probability p = `drop` and rescale the survivors: "inverse" × 1/(1 − p),
    "l1" × ‖τ‖₁/‖τ ⊙ m‖₁ (mergekit's rule; unscaled when either norm is below 1e-7), "none" not at all.

    drop = 0 returns τ; drop = 1 returns zeros. The mask comes from `generator` (see `tensor_generator`).
    """
    if not 0.0 <= drop <= 1.0:
        raise ParameterError(f"drop must lie in [0, 1]; got {drop}.")
    if drop <= 0:
        return tau
    if drop >= 1:
        return torch.zeros_like(tau)
    mask = dare_mask(tau.shape, drop, generator, device=tau.device)
    if rescale == "inverse":
        return tau * mask / (1.0 - drop)
    masked = tau * mask
    if rescale == "l1":
        return masked * l1_scale(float(tau.abs().sum()), float(masked.abs().sum()))
    return masked


def dare_(tau: torch.Tensor, drop: float, generator: torch.Generator, rescale: str = "inverse") -> torch.Tensor:
    """DARE in place (docs/methods.md): τ·[u ≥ p] with u ~ U[0, 1) drawn from `generator` block by block — the
    same draws, in the same order, as `dare_mask` makes for the whole tensor, so the same mask (the test compares
    them); the mask is a float block, not a bool tensor of the whole size. Survivors rescaled as in `dare`."""
    flat = tau.reshape(-1)
    if drop <= 0:
        return tau
    if drop >= 1:
        return flat.mul_(0).reshape(tau.shape)
    u = torch.empty(min(BLOCK, flat.numel()), dtype=torch.float32)
    scale = 1.0 - drop
    before = after = 0.0
    for s, e in block_ranges(flat.numel()):
        u_ = u[: e - s]
        torch.rand(e - s, generator=generator, out=u_)
        torch.ge(u_, drop, out=u_)
        blk = flat[s:e]
        if rescale == "inverse":
            blk.mul_(u_).div_(scale)
            continue
        if rescale == "l1":
            before += float(blk.abs().sum(dtype=torch.float64))
        blk.mul_(u_)
        if rescale == "l1":
            after += float(blk.abs().sum(dtype=torch.float64))
    if rescale == "l1":
        factor = l1_scale(before, after)
        if factor != 1.0:
            flat.mul_(factor)
    return tau


def _dare_parts(job: TensorJob) -> list[torch.Tensor]:
    p = job.params
    return [dare(tau, drop, job.generator(i), p["rescale"])
            for i, (tau, drop) in enumerate(zip(job.take_taus(), p["drop"]))]


def _dare_parts_fast(job: TensorJob) -> list[torch.Tensor]:
    p = job.params
    return [dare_(tau, drop, job.generator(i), p["rescale"])
            for i, (tau, drop) in enumerate(zip(job.take_taus(), p["drop"]))]


def _params() -> tuple[ParamSpec, ...]:
    return (ParamSpec("drop", "float", 0.9, "Probability p of dropping each entry (mergekit's 1 − density); one "
                      "number, or one per model.", UNIT, per_model=True, model_key="drop"),
            lam_param(), weights_param(), seed_param(),
            ParamSpec("rescale", "str", "l1", "How the survivors are rescaled: \"l1\" keeps the task vector's L1 "
                      "norm (mergekit's rescale: true), \"inverse\" × 1/(1 − p) (the DARE paper), \"none\" "
                      "(mergekit's rescale: false).", choices=RESCALES))


@method("dare_linear", "DARE: randomly drop task-vector entries, rescale, then task arithmetic.",
        (*_params(), normalize_param(False)),
        mergekit=MergekitSpec("dare_linear", params=gta_params(normalize=False, rescale=True, density="drop")),
        formula="θ = θ0 + λ·Σ wt·dare(τt, p) (/ Σ wt with normalize)",
        memory=WorkingMemory(fast=(0.4, 0), reference=(1.4, 1.0)),
        title="DARE", paper="Yu et al., Language models are Super Mario (ICML 2024)")
def _dare_linear(job: TensorJob) -> torch.Tensor:
    p = job.params
    return add_scaled(job, _dare_parts(job), normalized_lam(p["lam"], p["weights"], p["normalize"]))


@fast_kernel("dare_linear")
def _dare_linear_fast(job: TensorJob) -> torch.Tensor:
    p = job.params
    return add_scaled(job, _dare_parts_fast(job), normalized_lam(p["lam"], p["weights"], p["normalize"]))


@method("dare_ties", "DARE then TIES sign election; the sum of the agreeing entries (their mean with normalize).",
        (*_params(), normalize_param(False)),
        mergekit=MergekitSpec("dare_ties", params=gta_params(normalize=False, rescale=True, density="drop")),
        formula="θ = θ0 + λ·Σ wt·dare(τt, p)·[agree] (/ Σ wt·[agree] with normalize)",
        memory=WorkingMemory(fast=(0.4, 0), reference=(4.4, 2.3)),
        title="DARE-TIES", paper="Yu et al., Language models are Super Mario (ICML 2024)")
def _dare_ties(job: TensorJob) -> torch.Tensor:
    p = job.params
    return job.base + p["lam"] * ties_combine(_dare_parts(job), p["weights"], p["normalize"])


@fast_kernel("dare_ties")
def _dare_ties_fast(job: TensorJob) -> torch.Tensor:
    p = job.params
    return ties_combine_into_(job.base, _dare_parts_fast(job), p["weights"], p["lam"], normalize=p["normalize"])
