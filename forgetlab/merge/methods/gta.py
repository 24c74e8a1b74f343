"""mergekit's generalized task arithmetic for the methods it adds on top of forgetlab's own task-vector family
(docs/methods.md#gta): `della`, `della_linear` and `breadcrumbs_ties`, with mergekit 0.1.5's parameter names,
defaults and numerics. Per tensor:

1. sparsify each τt with its own density (and epsilon or gamma): DELLA's MAGPRUNE (random, rank-dependent keep
   probabilities) or Breadcrumbs' outlier-and-small cut; with `rescale`, the survivors are scaled so that their
   L1 norm equals τt's (mergekit's rescale; the DELLA paper divides each survivor by its keep probability);
2. weight: vt = wt·τ̂t;
3. with consensus (della, breadcrumbs_ties), TIES's sign election on Σ vt, keeping the agreeing entries; the
   divisor is Σ wt over the agreeing entries (1 where none agree); without (della_linear), Σt wt (1 if ~0);
4. with `normalize`, divide by the divisor; times λ; add to θ0.

CPU kernels (`fast_kernel`): `della_magprune_` (MAGPRUNE in place, rows ranked by a sort of unique integer keys),
`outliers_prune_` (Breadcrumbs' cut in place, `breadcrumbs.breadcrumbs_`) and the blocked combines
(`ties.ties_combine_into_`, `linear_combine_into_`): the same numbers as the reference, block by block.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.methods.breadcrumbs import (
    breadcrumbs_,
    breadcrumbs_counts,
    breadcrumbs_mask,
)
from forgetlab.merge.methods.common import (
    UNIT,
    l1_norm,
    l1_scale,
    lam_param,
    seed_param,
    weights_param,
)
from forgetlab.merge.methods.ties import sum_rows, ties_combine_into_
from forgetlab.merge.registry import MergekitSpec, ParamSpec, TensorJob, WorkingMemory, fast_kernel, method
from forgetlab.merge.select import BLOCK, as_array, block_ranges


def rescale_l1(tau: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """mergekit's rescale of a masked task vector, in place: masked·(|τ|₁ / |masked|₁) (`common.l1_scale`)."""
    return masked.mul_(l1_scale(l1_norm(tau), l1_norm(masked)))


def magprune_keep_probs(n: int, density: float, epsilon: float, device: str | torch.device = "cpu") -> torch.Tensor:
    """DELLA's keep probabilities by rank, as mergekit computes them: in a row of n entries ranked by |τ| from the
    smallest (rank 0) to the largest (rank n − 1), p = (density − ε) + 2ε·rank/(n − 1) (density − ε for n = 1)."""
    rank = torch.arange(n, dtype=torch.float32, device=device)
    return rank.mul_(2 * epsilon / max(n - 1, 1)).add_(density - epsilon)


def della_magprune(tau: torch.Tensor, density: float, epsilon: float, rescale: bool,
                   generator: torch.Generator) -> torch.Tensor:
    """MAGPRUNE: along each row (the second axis; a 1-D tensor is one row, as in mergekit) keep each entry with
    the probability of its rank (`magprune_keep_probs`), drawn from `generator`; then `rescale_l1` when asked.
    density ≥ 1 returns τ, density ≤ 0 zeros. The draws are made in rank order and scattered back (one sort,
    no probability tensor of the full size). Entries of equal |τ| are ranked in storage order (a stable sort), so
    that the ranks, hence the mask, do not depend on the sort's implementation."""
    if density >= 1:
        return tau
    if density <= 0:
        return torch.zeros_like(tau)
    t = tau if tau.dim() >= 2 else tau.unsqueeze(0)
    n = t.shape[1]
    order = torch.argsort(t.abs(), dim=1, stable=True)
    shape = [1] * t.dim()
    shape[1] = n
    probs = magprune_keep_probs(n, density, epsilon, t.device).reshape(shape)
    kept_by_rank = torch.rand(t.shape, generator=generator, device=t.device) < probs
    mask = torch.empty(t.shape, dtype=torch.bool, device=t.device).scatter_(1, order, kept_by_rank)
    masked = tau * mask.reshape(tau.shape)
    return rescale_l1(tau, masked) if rescale else masked


def della_magprune_(tau: torch.Tensor, density: float, epsilon: float, rescale: bool,
                    generator: torch.Generator) -> torch.Tensor:
    """`della_magprune` in place on a contiguous float32 CPU tensor of 1 or 2 dimensions: the same draws (from
    `generator`, a block of rows at a time, in the order in which `torch.rand` draws them for the whole tensor)
    and the same mask. A row is ranked by sorting int64 keys (bits of |τ|) · 2^b + column, which are unique, so
    any sort gives the stable order (numpy's vectorised sort, several times faster than an argsort)."""
    if density >= 1:
        return tau
    if density <= 0:
        return tau.mul_(0)
    before = l1_norm(tau) if rescale else 0.0
    rows, n = (1, tau.numel()) if tau.dim() == 1 else tuple(tau.shape)
    arr = as_array(tau).reshape(rows, n)
    probs = magprune_keep_probs(n, density, epsilon).numpy()
    shift = max(1, (n - 1).bit_length())
    cols = np.arange(n, dtype=np.int64)
    rb = min(rows, max(1, BLOCK // n))
    u = torch.empty((rb, n), dtype=torch.float32)
    keys, kept, mask = np.empty((rb, n), np.int64), np.empty((rb, n), np.bool_), np.empty((rb, n), np.bool_)
    offsets = (np.arange(rb, dtype=np.int64) * n)[:, None]
    for r0 in range(0, rows, rb):
        c = min(rows, r0 + rb) - r0
        u_, k, kp, m, blk = u[:c], keys[:c], kept[:c], mask[:c], arr[r0:r0 + c]
        torch.rand((c, n), generator=generator, out=u_)
        np.less(u_.numpy(), probs, out=kp)  # kept, by rank
        np.bitwise_and(blk.view(np.int32), np.int32(0x7FFFFFFF), out=k, casting="unsafe")  # |τ| as ordered ints
        np.left_shift(k, shift, out=k)
        np.bitwise_or(k, cols, out=k)
        k.sort(axis=1)
        np.bitwise_and(k, (1 << shift) - 1, out=k)  # the column of each rank
        k += offsets[:c]
        m.reshape(-1)[k.reshape(-1)] = kp.reshape(-1)
        np.multiply(blk, m, out=blk)
    if rescale:
        tau.mul_(l1_scale(before, l1_norm(tau)))
    return tau


def outliers_prune(tau: torch.Tensor, density: float, gamma: float, rescale: bool) -> torch.Tensor:
    """Breadcrumbs' sparsification as mergekit's magnitude_outliers: keep ⌊density·n⌋ entries after removing the
    ⌊gamma·n⌋ largest |τ| (fewer if needed to keep that many); then `rescale_l1` when asked. density ≥ 1 returns τ."""
    if density >= 1:
        return tau
    masked = tau * breadcrumbs_mask(tau, density, gamma)
    return rescale_l1(tau, masked) if rescale else masked


def outliers_prune_(tau: torch.Tensor, density: float, gamma: float, rescale: bool) -> torch.Tensor:
    """`outliers_prune` in place on a contiguous float32 CPU tensor (`breadcrumbs.breadcrumbs_`: exact
    selection, no sort)."""
    if density >= 1:
        return tau
    before = l1_norm(tau) if rescale else 0.0
    n_top, n_keep = breadcrumbs_counts(tau.numel(), density, gamma)
    breadcrumbs_(tau, n_top, n_keep)
    if rescale:
        tau.mul_(l1_scale(before, l1_norm(tau)))
    return tau


def linear_combine_into_(out: torch.Tensor, parts: Sequence[torch.Tensor], weights: Sequence[float],
                         normalize: bool, lam: float) -> torch.Tensor:
    """`gta_combine` without consensus, block by block into `out`: out += λ·(Σt wt·partt) / divisor, the terms
    added in model order as `stack.sum(dim=0)` adds them."""
    flat = [t.reshape(-1) for t in parts]
    o = out.reshape(-1)
    w = [float(x) for x in weights]
    total = float(sum(w))
    divisor = (1.0 if abs(total) < 1e-8 else total) if normalize else None
    nb = min(BLOCK, o.numel())
    T, acc = torch.empty((len(flat), nb), dtype=torch.float32), torch.empty(nb, dtype=torch.float32)
    for s, e in block_ranges(o.numel()):
        c = e - s
        T_, acc_ = T[:, :c], acc[:c]
        for j, t in enumerate(flat):
            torch.mul(t[s:e], w[j], out=T_[j])
        sum_rows(T_, acc_)
        if divisor is not None:
            acc_ /= divisor
        if lam != 1:
            acc_ *= lam
        o[s:e].add_(acc_)
    return out


def gta_combine(base: torch.Tensor, parts: Sequence[torch.Tensor], weights: Sequence[float], consensus: bool,
                normalize: bool, lam: float) -> torch.Tensor:
    """θ0 + λ·(Σt wt·τ̂t·[agree]) / divisor (see the module docstring), into `base` in place."""
    stack = torch.stack(list(parts), dim=0)
    w = torch.tensor([float(x) for x in weights], dtype=stack.dtype, device=stack.device)
    w = w.reshape((-1,) + (1,) * (stack.dim() - 1))
    stack.mul_(w)
    if consensus:
        positive = stack.sum(dim=0) >= 0
        agree = torch.where(positive, stack > 0, stack < 0)
        mixed = (stack * agree).sum(dim=0)
        if normalize:
            divisor = (w * agree).sum(dim=0)
            mixed /= torch.where(divisor == 0, torch.ones_like(divisor), divisor)
    else:
        mixed = stack.sum(dim=0)
        if normalize:
            total = float(sum(float(x) for x in weights))
            mixed /= 1.0 if abs(total) < 1e-8 else total
    if lam != 1:
        mixed *= lam
    return base.add_(mixed)


def _density_param() -> ParamSpec:
    return ParamSpec("density", "float", 1.0, "Fraction of each task vector's entries kept (one number, or one "
                     "per model); 1 keeps all.", UNIT, per_model=True, model_key="density")


def _normalize_param(default: bool) -> ParamSpec:
    return ParamSpec("normalize", "bool", default, "Divide the merged task vector by the sum of the weights (of "
                     "the agreeing models, with sign consensus).")


def _rescale_param(default: bool) -> ParamSpec:
    return ParamSpec("rescale", "bool", default, "Scale each pruned task vector back to its L1 norm.")


def _int8_param() -> ParamSpec:
    return ParamSpec("int8_mask", "bool", False, "mergekit's memory option for its masks; the numbers are the "
                     "same either way (accepted so that mergekit recipes carry over).")


def _check_della(params: dict, n: int) -> None:
    for i, (d, e) in enumerate(zip(params["density"], params["epsilon"])):
        if 0 < d < 1 and not (d - e > 0 and d + e < 1):
            raise ParameterError(f"DELLA needs density ± epsilon inside (0, 1); model {i + 1} has density {d} and "
                                 f"epsilon {e}. Lower epsilon below min(density, 1 − density).")


def _della_params(normalize: bool) -> tuple[ParamSpec, ...]:
    return (weights_param(), _density_param(),
            ParamSpec("epsilon", "float", 0.15, "Spread ε of DELLA's keep probabilities: density ± ε from the "
                      "smallest to the largest |τ| of a row (one number, or one per model).", UNIT,
                      per_model=True, model_key="epsilon"),
            lam_param(), _normalize_param(normalize), _rescale_param(True), _int8_param(),
            seed_param())


def _della_parts(job: TensorJob) -> list[torch.Tensor]:
    p = job.params
    return [della_magprune(tau, d, e, p["rescale"], job.generator(i))
            for i, (tau, d, e) in enumerate(zip(job.take_taus(), p["density"], p["epsilon"]))]


def _merge(job: TensorJob, parts: Callable[[TensorJob], list[torch.Tensor]], consensus: bool) -> torch.Tensor:
    p = job.params
    return gta_combine(job.base, parts(job), p["weights"], consensus, p["normalize"], p["lam"])


@method("della", "DELLA: random magnitude-ranked pruning (MAGPRUNE) of each task vector, then TIES's sign "
        "election.",
        _della_params(True), check=_check_della, mergekit=MergekitSpec("della", required=("weight",), int8_mask=True),
        formula="θ = θ0 + λ·Σt wt·magprune(τt)·[agree] / Σt wt·[agree]",
        memory=WorkingMemory(fast=(0.4, 0), reference=(5.0, 2.1)),
        title="DELLA", paper="Deep et al., DELLA-Merging (arXiv 2406.11617)")
def _della(job: TensorJob) -> torch.Tensor:
    return _merge(job, _della_parts, consensus=True)


@method("della_linear", "DELLA without sign election: MAGPRUNE each task vector, then add them.",
        _della_params(False), check=_check_della,
        mergekit=MergekitSpec("della_linear", required=("weight",), int8_mask=True),
        formula="θ = θ0 + λ·Σt wt·magprune(τt)", memory=WorkingMemory(fast=(0.4, 0), reference=(1.1, 1.0)),
        title="DELLA (linear)", paper="Deep et al., DELLA-Merging (arXiv 2406.11617)")
def _della_linear(job: TensorJob) -> torch.Tensor:
    return _merge(job, _della_parts, consensus=False)


def _breadcrumbs_parts(job: TensorJob) -> list[torch.Tensor]:
    p = job.params
    return [outliers_prune(tau, d, g, p["rescale"])
            for tau, d, g in zip(job.take_taus(), p["density"], p["gamma"])]


@method("breadcrumbs_ties", "Model Breadcrumbs with TIES: drop each task vector's largest outliers and smallest "
        "entries, then TIES's sign election.",
        (weights_param(), _density_param(),
         ParamSpec("gamma", "float", 0.01, "Fraction of largest-|τ| entries removed (one number, or one per "
                   "model).", UNIT, per_model=True, model_key="gamma"),
         lam_param(), _normalize_param(False), _rescale_param(False), _int8_param()),
        mergekit=MergekitSpec("breadcrumbs_ties", required=("weight",), int8_mask=True),
        formula="θ = θ0 + λ·Σt wt·breadcrumbs(τt)·[agree]", memory=WorkingMemory(fast=(0.4, 0), reference=(3.2, 2.4)),
        title="Breadcrumbs-TIES", paper="Davari & Belilovsky, Model Breadcrumbs (ECCV 2024), with TIES's sign election")
def _breadcrumbs_ties(job: TensorJob) -> torch.Tensor:
    return _merge(job, _breadcrumbs_parts, consensus=True)


def _fast_parts(job: TensorJob, prune: Callable[[torch.Tensor, int], torch.Tensor]) -> list[torch.Tensor]:
    return [prune(tau, i) for i, tau in enumerate(job.take_taus())]


def _fast_merge(job: TensorJob, prune: Callable[[torch.Tensor, int], torch.Tensor], consensus: bool) -> torch.Tensor:
    p = job.params
    parts = _fast_parts(job, prune)
    if consensus:
        return ties_combine_into_(job.base, parts, p["weights"], p["lam"], normalize=p["normalize"])
    return linear_combine_into_(job.base, parts, p["weights"], p["normalize"], p["lam"])


def _della_prune(job: TensorJob) -> Callable[[torch.Tensor, int], torch.Tensor]:
    p = job.params
    return lambda tau, i: della_magprune_(tau, p["density"][i], p["epsilon"][i], p["rescale"], job.generator(i))


@fast_kernel("della")
def _della_fast(job: TensorJob) -> torch.Tensor | None:
    if job.base.dim() not in (1, 2):
        return None  # the reference ranks along the second axis of any shape; the kernel knows rows only
    return _fast_merge(job, _della_prune(job), consensus=True)


@fast_kernel("della_linear")
def _della_linear_fast(job: TensorJob) -> torch.Tensor | None:
    if job.base.dim() not in (1, 2):
        return None
    return _fast_merge(job, _della_prune(job), consensus=False)


@fast_kernel("breadcrumbs_ties")
def _breadcrumbs_ties_fast(job: TensorJob) -> torch.Tensor | None:
    p = job.params
    return _fast_merge(job, lambda tau, i: outliers_prune_(tau, p["density"][i], p["gamma"][i], p["rescale"]),
                       consensus=True)
