"""Gated two-model merges (docs/methods.md#gated): θ = θ0 + g ⊙ (θ1 − θ0) for the base and ONE fine-tuned model,
with a gate g per entry — mergekit 0.1.5's `nearswap` and `arcee_fusion`, computed as mergekit does.

- nearswap: g = clamp(t / max(|θ1 − θ0|, 1e-6), 0, 1): entries that moved less than t take the fine-tuned value,
  entries that moved far stay near the base.
- arcee_fusion: importance s = |θ1 − θ0| · KL(softmax(θ1) ‖ softmax(θ0)) (softmax and KL along the last axis,
  1e-8 added to both distributions), g = [s ≥ median(s) + 1.5·IQR(s)] with quantiles read off the sorted
  scores at ⌊q·(n − 1)⌋; above 1 000 000 entries mergekit estimates them from 1 000 000 entries drawn with
  replacement (here from the seeded generator of the tensor, `seed`).

CPU kernel of arcee_fusion: the same sample, its three quantiles by `select.kth_largest` (exact, no torch.kthvalue).
"""
from __future__ import annotations

import torch

from forgetlab.merge.methods.common import seed_param
from forgetlab.merge.registry import MergekitSpec, ParamSpec, TensorJob, WorkingMemory, fast_kernel, method
from forgetlab.merge.select import kth_largest

QUANTILE_SAMPLE_SIZE = 1_000_000
ONE_MODEL = ("{name} merges the base with ONE fine-tuned model; list a single model (merge the others first, or "
             "use a method for several models such as ties or della).")


def nearswap(base: torch.Tensor, finetuned: torch.Tensor, t: float) -> torch.Tensor:
    """NearSwap: g·θ1 + (1 − g)·θ0 with g = clamp(t / max(|θ1 − θ0|, 1e-6), 0, 1)."""
    g = (t / (base - finetuned).abs_().clamp_(min=1e-6)).clamp_(0, 1)
    return g * finetuned + (1 - g) * base


def fusion_importance(base: torch.Tensor, finetuned: torch.Tensor) -> torch.Tensor:
    """Arcee Fusion's importance score |θ1 − θ0| · Σ_last p·log(p/q), p = softmax(θ1) + 1e-8, q = softmax(θ0) + 1e-8."""
    p = torch.softmax(finetuned, dim=-1) + 1e-8
    q = torch.softmax(base, dim=-1) + 1e-8
    kl = torch.sum(p * torch.log(p / q), dim=-1, keepdim=True)
    return (finetuned - base).abs_().mul_(kl)


def _fusion_sample(scores: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    flat = scores.reshape(-1)
    if flat.numel() > QUANTILE_SAMPLE_SIZE:
        idx = torch.randint(flat.numel(), (QUANTILE_SAMPLE_SIZE,), generator=generator, device=flat.device)
        flat = flat[idx]
    return flat


def fusion_threshold(scores: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """median + 1.5·(q3 − q1) of the scores, each quantile q the sorted value at ⌊q·(n − 1)⌋ (over a sample of
    QUANTILE_SAMPLE_SIZE entries drawn with replacement when there are more)."""
    flat = _fusion_sample(scores, generator)
    n = flat.numel()
    q1, med, q3 = (torch.kthvalue(flat, int(q * (n - 1)) + 1).values for q in (0.25, 0.5, 0.75))
    return med + 1.5 * (q3 - q1)


def fusion_threshold_cpu(scores: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """`fusion_threshold` of float32 CPU scores without NaN: the same sample and quantiles, each by the exact
    selection `kth_largest` (the j-th smallest of n is the (n − j + 1)-th largest)."""
    flat = _fusion_sample(scores, generator).contiguous()
    n = flat.numel()
    q1, med, q3 = (torch.tensor(kth_largest(flat, n - int(q * (n - 1)))[0], dtype=torch.float32)
                   for q in (0.25, 0.5, 0.75))
    return med + 1.5 * (q3 - q1)


def arcee_fusion(base: torch.Tensor, finetuned: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Arcee Fusion: θ0 + (θ1 − θ0)·[s ≥ median(s) + 1.5·IQR(s)], s = `fusion_importance`."""
    scores = fusion_importance(base, finetuned)
    mask = scores >= fusion_threshold(scores, generator)
    return base + (finetuned - base) * mask


@method("nearswap", "NearSwap: take the fine-tuned value where it moved less than t from the base.",
        (ParamSpec("t", "float", 1e-4, "Distance below which an entry takes the fine-tuned value (mergekit's t; "
                   "it has no default there).", (0.0, 1e3)),),
        max_models=1, mergekit=MergekitSpec("nearswap", required=("t",)), in_place=False,
        extra={"models_hint": ONE_MODEL.format(name="nearswap")},
        formula="θ = g·θ1 + (1 − g)·θ0, g = clamp(t/|θ1 − θ0|, 0, 1)", memory=WorkingMemory((5.1, 0)),
        title="NearSwap", paper="the QuartetAnemoi-70B-t0.0001 model card")
def _nearswap(job: TensorJob) -> torch.Tensor:
    return nearswap(job.base, job.finetuned[0], job.params["t"])


@method("arcee_fusion", "Arcee Fusion: keep the fine-tuned changes whose importance is an outlier.",
        (seed_param(),), max_models=1, mergekit=MergekitSpec("arcee_fusion"), in_place=False,
        extra={"models_hint": ONE_MODEL.format(name="arcee_fusion")},
        formula="θ = θ0 + (θ1 − θ0)·[s ≥ median(s) + 1.5·IQR(s)], s = |θ1 − θ0|·KL(softmax θ1 ‖ softmax θ0)",
        memory=WorkingMemory(fast=(5.4, 0), reference=(5.6, 0)),
        title="Arcee Fusion", paper="mergekit's arcee_fusion method")
def _arcee_fusion(job: TensorJob) -> torch.Tensor:
    return arcee_fusion(job.base, job.finetuned[0], job.generator(0))


@fast_kernel("arcee_fusion")
def _arcee_fusion_fast(job: TensorJob) -> torch.Tensor | None:
    base, ft = job.base, job.finetuned[0]
    scores = fusion_importance(base, ft)
    if not bool(torch.isfinite(scores).all()):
        return None  # the selection takes no NaN
    keep = scores.ge_(fusion_threshold_cpu(scores, job.generator(0)))  # 1.0 / 0.0 in the scores' memory
    return torch.sub(ft, base).mul_(keep).add_(base)  # base + (θ1 − θ0)·[s ≥ threshold], as the reference
