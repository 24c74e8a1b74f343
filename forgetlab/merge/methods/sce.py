"""SCE — Select, Calculate, Erase (docs/methods.md#sce), as mergekit 0.1.5 computes it, per tensor:
1. select: with `select_topk` < 1, keep the entries whose variance across the task vectors is among the top
   ⌊select_topk · (number of entries with nonzero variance)⌋ (the same entries in every task vector);
2. calculate: each model's weight is the mean of its selected τt², divided by their sum (equal weights when that
   sum is below 1e-6);
3. erase: TIES's sign election on Σt τt (ties → +); τ = Σt wt·τt·[agree] / max(Σt wt·[agree], 1e-6)."""
from __future__ import annotations

import torch

from forgetlab.merge.methods.common import UNIT
from forgetlab.merge.registry import ParamSpec, TensorJob, method
from forgetlab.merge.select import topk_mask


def sce_select_mask(stack: torch.Tensor, select_topk: float) -> torch.Tensor:
    """SCE's selection mask (shape of one task vector): the top ⌊select_topk·nnz(var)⌋ entries by the variance
    across models (population variance over the model axis of `stack`)."""
    if select_topk <= 0:
        return torch.zeros(stack.shape[1:], dtype=torch.bool, device=stack.device)
    if select_topk >= 1:
        return torch.ones(stack.shape[1:], dtype=torch.bool, device=stack.device)
    var = torch.var(stack, dim=0, unbiased=False)
    k = int(int(torch.count_nonzero(var)) * select_topk)
    if k == 0:
        return torch.zeros_like(var, dtype=torch.bool)
    return topk_mask(var, k)


def sce_weights(stack: torch.Tensor) -> torch.Tensor:
    """SCE's per-model weights: mean(τt²) / Σs mean(τs²), or 1/N each when that sum is below 1e-6."""
    w = stack.square().reshape(stack.shape[0], -1).mean(dim=1)
    total = float(w.sum())
    if abs(total) < 1e-6:
        return torch.ones_like(w) / w.shape[0]
    return w / total


def sce(base: torch.Tensor, taus: list[torch.Tensor], select_topk: float = 1.0) -> torch.Tensor:
    """θ0 + SCE-merged task vector (see the module docstring)."""
    stack = torch.stack(taus, dim=0)
    if select_topk < 1:
        stack.mul_(sce_select_mask(stack, select_topk))
    positive = stack.sum(dim=0) >= 0
    agree = torch.where(positive, stack > 0, stack < 0)
    w = sce_weights(stack).reshape((-1,) + (1,) * (stack.dim() - 1))
    erased = w * agree
    merged = (stack * erased).sum(dim=0) / erased.sum(dim=0).clamp(min=1e-6)
    return base.add_(merged)


@method("sce", "SCE: select high-variance entries, weight models by their task vectors' energy, erase "
        "minority signs.",
        (ParamSpec("select_topk", "float", 1.0, "Fraction of the entries (by variance across models) kept; 1 "
                   "keeps all.", UNIT),
         ParamSpec("int8_mask", "bool", False, "mergekit's memory option for its masks; the numbers are the "
                   "same either way (accepted so that mergekit recipes carry over).")),
        mergekit="sce",
        formula="θ = θ0 + Σt wt·τ̂t·[agree] / Σt wt·[agree], wt ∝ mean(τ̂t²)")
def _sce(job: TensorJob) -> torch.Tensor:
    return sce(job.base, job.take_taus(), job.params["select_topk"])
