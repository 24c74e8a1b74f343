"""Consensus / TALL masks (METHODS.md).

θMT = θ0 + Σt τt; TALL mask mt = |τt| ≥ λt·|θMT − θt| (θMT − θt = Σs τs − τt, so θ0 cancels);
consensus mask = entries where Σt mt ≥ k; θ = θ0 + α·(Σt τt) ⊙ consensus. Defaults λt = 0.4, k = 2, α = 1.
"""
from __future__ import annotations

from typing import Sequence

import torch


def tall_masks(taus: Sequence[torch.Tensor], lam: float | Sequence[float] = 0.4) -> list[torch.Tensor]:
    """TALL mask per task: mt = |τt| ≥ λt·|Σs τs − τt| (a scalar λ applies to every task)."""
    lams = [float(lam)] * len(taus) if isinstance(lam, (int, float)) else [float(x) for x in lam]
    total = torch.zeros_like(taus[0], dtype=torch.float32)
    for t in taus:
        total.add_(t)
    return [t.abs() >= lt * (total - t).abs() for t, lt in zip(taus, lams)]


def consensus_mask(masks: Sequence[torch.Tensor], k: int = 2) -> torch.Tensor:
    """Entries selected by at least k of the task masks: Σt mt ≥ k."""
    count = torch.zeros_like(masks[0], dtype=torch.int32)
    for m in masks:
        count += m.to(torch.int32)
    return count >= int(k)


def consensus_merge(taus: Sequence[torch.Tensor], lam: float | Sequence[float] = 0.4, k: int = 2,
                    alpha: float = 1.0) -> torch.Tensor:
    """Merged task vector of Consensus merging: α·(Σt τt) ⊙ consensus_mask(tall_masks(τ, λ), k)."""
    mask = consensus_mask(tall_masks(taus, lam), k)
    total = torch.zeros_like(taus[0], dtype=torch.float32)
    for t in taus:
        total.add_(t)
    return alpha * total * mask
