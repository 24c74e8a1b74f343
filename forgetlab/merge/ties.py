"""TIES pieces (METHODS.md): sign election and disjoint mean over trimmed task vectors, and their composition.

With weights w (default 1, as in the TIES paper) the election and the mean follow mergekit's generalisation:
elected sign = sign(Σt wt·τ̂t) (ties → +), merged = Σt wt·τ̂t·[agree] / Σt wt·[agree] (0 where none agree).
With all weights 1 this is METHODS.md's disjoint mean: the average of the agreeing non-zero entries.
"""
from __future__ import annotations

from typing import Sequence

import torch


def elect_sign(weighted: torch.Tensor) -> torch.Tensor:
    """Elected sign per entry of a stack [N, ...] of (weighted, trimmed) task vectors: +1 where Σ ≥ 0, else −1."""
    total = weighted.sum(dim=0)
    return torch.where(total >= 0, 1.0, -1.0).to(weighted.dtype)


def agreement(stack: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """Boolean [N, ...]: entries whose sign equals the elected sign (zero entries never agree)."""
    return torch.sign(stack) == sign


def disjoint_mean(stack: torch.Tensor, sign: torch.Tensor, weights: Sequence[float] | None = None) -> torch.Tensor:
    """Disjoint mean of a stack [N, ...]: Σ w·τ·[agree] / Σ w·[agree], 0 where no entry agrees."""
    n = stack.shape[0]
    w = torch.ones(n, dtype=stack.dtype, device=stack.device) if weights is None else \
        torch.as_tensor(list(weights), dtype=stack.dtype, device=stack.device)
    w = w.reshape((n,) + (1,) * (stack.dim() - 1))
    weighted = stack * w
    agree = agreement(weighted, sign)
    num = (weighted * agree).sum(dim=0)
    den = (w * agree).sum(dim=0)
    den = torch.where(den == 0, torch.ones_like(den), den)
    return num / den


def ties_combine(trimmed: Sequence[torch.Tensor], weights: Sequence[float] | None = None) -> torch.Tensor:
    """Sign election + disjoint mean of already-trimmed task vectors (returns the merged task vector).

    Equivalent to `disjoint_mean(stack, elect_sign(w·stack), weights)`, computed with fewer temporaries:
    one stacked copy, updated in place.
    """
    stack = torch.stack([t.to(torch.float32) for t in trimmed], dim=0)
    n = stack.shape[0]
    unit = weights is None or all(float(w) == 1.0 for w in weights)
    if not unit:
        w = torch.as_tensor([float(x) for x in weights], dtype=stack.dtype, device=stack.device)
        stack.mul_(w.reshape((n,) + (1,) * (stack.dim() - 1)))  # now w·τ̂
    positive = stack.sum(dim=0) >= 0  # elected sign: + where Σ w·τ̂ ≥ 0
    agree = torch.where(positive, stack > 0, stack < 0)
    stack.mul_(agree)
    num = stack.sum(dim=0)
    if unit:
        den = agree.sum(dim=0, dtype=stack.dtype)
    else:
        den = (agree * w.reshape((n,) + (1,) * (stack.dim() - 1))).sum(dim=0)
    return num / torch.where(den == 0, torch.ones_like(den), den)
