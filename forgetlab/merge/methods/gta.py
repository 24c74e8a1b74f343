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
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.methods.breadcrumbs import breadcrumbs_mask
from forgetlab.merge.methods.common import UNIT, l1_norm, l1_scale, lam_param, seed_param, weights_param
from forgetlab.merge.registry import ParamSpec, TensorJob, method


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
    no probability tensor of the full size)."""
    if density >= 1:
        return tau
    if density <= 0:
        return torch.zeros_like(tau)
    t = tau if tau.dim() >= 2 else tau.unsqueeze(0)
    n = t.shape[1]
    order = torch.argsort(t.abs(), dim=1)
    shape = [1] * t.dim()
    shape[1] = n
    probs = magprune_keep_probs(n, density, epsilon, t.device).reshape(shape)
    kept_by_rank = torch.rand(t.shape, generator=generator, device=t.device) < probs
    mask = torch.empty(t.shape, dtype=torch.bool, device=t.device).scatter_(1, order, kept_by_rank)
    masked = tau * mask.reshape(tau.shape)
    return rescale_l1(tau, masked) if rescale else masked


def outliers_prune(tau: torch.Tensor, density: float, gamma: float, rescale: bool) -> torch.Tensor:
    """Breadcrumbs' sparsification as mergekit's magnitude_outliers: keep ⌊density·n⌋ entries after removing the
    ⌊gamma·n⌋ largest |τ| (fewer if needed to keep that many); then `rescale_l1` when asked. density ≥ 1 returns τ."""
    if density >= 1:
        return tau
    masked = tau * breadcrumbs_mask(tau, density, gamma)
    return rescale_l1(tau, masked) if rescale else masked


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
        _della_params(True), check=_check_della, mergekit="della",
        formula="θ = θ0 + λ·Σt wt·magprune(τt)·[agree] / Σt wt·[agree]")
def _della(job: TensorJob) -> torch.Tensor:
    return _merge(job, _della_parts, consensus=True)


@method("della_linear", "DELLA without sign election: MAGPRUNE each task vector, then add them.",
        _della_params(False), check=_check_della, mergekit="della_linear",
        formula="θ = θ0 + λ·Σt wt·magprune(τt)")
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
        mergekit="breadcrumbs_ties",
        formula="θ = θ0 + λ·Σt wt·breadcrumbs(τt)·[agree]")
def _breadcrumbs_ties(job: TensorJob) -> torch.Tensor:
    return _merge(job, _breadcrumbs_parts, consensus=True)
