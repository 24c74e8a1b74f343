"""DARE (docs/methods.md#dare): drop each entry of a task vector with probability p and rescale the survivors
by 1/(1 − p), with masks seeded per (tensor, model) (`forgetlab.merge.registry.tensor_generator`), then either
task arithmetic (`dare_linear`) or TIES's sign election and disjoint mean (`dare_ties`).

Reference: `dare_mask`, `dare`. CPU kernel: `dare_` (the same draws block by block, in place)."""
from __future__ import annotations

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.methods.common import UNIT, add_scaled, lam_param, seed_param, weights_param
from forgetlab.merge.methods.ties import ties_combine, ties_combine_into_
from forgetlab.merge.registry import ParamSpec, TensorJob, fast_kernel, method
from forgetlab.merge.select import BLOCK, block_ranges


def dare_mask(shape: torch.Size | tuple[int, ...], drop: float, generator: torch.Generator,
              device: str | torch.device = "cpu") -> torch.Tensor:
    """DARE keep mask: each entry survives independently with probability 1 − drop (u ≥ drop, u ~ U[0, 1))."""
    if drop <= 0:
        return torch.ones(shape, dtype=torch.bool, device=device)
    u = torch.rand(shape, generator=generator, device=device)
    return u >= drop


def dare(tau: torch.Tensor, drop: float, generator: torch.Generator) -> torch.Tensor:
    """DARE: drop each entry of τ with probability p = `drop`, rescale survivors by 1/(1 − p).

    drop = 0 returns τ; drop = 1 returns zeros. The mask comes from `generator` (see `tensor_generator`).
    """
    if not 0.0 <= drop <= 1.0:
        raise ParameterError(f"drop must lie in [0, 1]; got {drop}.")
    if drop <= 0:
        return tau
    if drop >= 1:
        return torch.zeros_like(tau)
    mask = dare_mask(tau.shape, drop, generator, device=tau.device)
    return tau * mask / (1.0 - drop)


def dare_(tau: torch.Tensor, drop: float, generator: torch.Generator) -> torch.Tensor:
    """DARE in place (docs/methods.md): τ·[u ≥ p]/(1 − p) with u ~ U[0, 1) drawn from `generator` block by block —
    the same draws, in the same order, as `sparsify.dare_mask` makes for the whole tensor, so the same mask
    (the test compares them); the mask is a float block, not a bool tensor of the whole size."""
    flat = tau.reshape(-1)
    if drop <= 0:
        return tau
    if drop >= 1:
        return flat.mul_(0).reshape(tau.shape)
    u = torch.empty(min(BLOCK, flat.numel()), dtype=torch.float32)
    scale = 1.0 - drop
    for s, e in block_ranges(flat.numel()):
        u_ = u[: e - s]
        torch.rand(e - s, generator=generator, out=u_)
        torch.ge(u_, drop, out=u_)
        flat[s:e].mul_(u_).div_(scale)
    return tau


def _dare_parts(job: TensorJob) -> list[torch.Tensor]:
    return [dare(tau, job.params["drop"], job.generator(i)) for i, tau in enumerate(job.take_taus())]


def _dare_parts_fast(job: TensorJob) -> list[torch.Tensor]:
    return [dare_(tau, job.params["drop"], job.generator(i)) for i, tau in enumerate(job.take_taus())]


@method("dare_linear", "DARE: randomly drop task-vector entries, rescale, then task arithmetic.",
        (ParamSpec("drop", "float", 0.9, "Probability p of dropping each entry; survivors × 1/(1 − p).", UNIT),
         lam_param(), weights_param(), seed_param()),
        mergekit="dare_linear", formula="θ = θ0 + λ·Σ wt·dare(τt, p)")
def _dare_linear(job: TensorJob) -> torch.Tensor:
    return add_scaled(job, _dare_parts(job), job.params["lam"])


@fast_kernel("dare_linear")
def _dare_linear_fast(job: TensorJob) -> torch.Tensor:
    return add_scaled(job, _dare_parts_fast(job), job.params["lam"])


@method("dare_ties", "DARE then TIES sign election and disjoint mean.",
        (ParamSpec("drop", "float", 0.9, "Probability p of dropping each entry; survivors × 1/(1 − p).", UNIT),
         lam_param(), weights_param(), seed_param()),
        mergekit="dare_ties",
        formula="θ = θ0 + λ·disjoint_mean(sign_elect(dare(τt, p)))")
def _dare_ties(job: TensorJob) -> torch.Tensor:
    return job.base + job.params["lam"] * ties_combine(_dare_parts(job), job.params["weights"])


@fast_kernel("dare_ties")
def _dare_ties_fast(job: TensorJob) -> torch.Tensor:
    return ties_combine_into_(job.base, _dare_parts_fast(job), job.params["weights"], job.params["lam"])
