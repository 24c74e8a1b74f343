"""CART, ``cart`` (docs/methods.md#cart; Choi et al., arXiv 2412.12153): task arithmetic centred at the
weight average with rank-reduced centred task vectors. θ̄ = mean of the θt; per 2-D weight
θ = θ̄ + λ·Σt lowrank_k(θt − θ̄), k = max(1, ⌊rank·min(m, n)⌋); other tensors θ̄. Default rank 0.08 (the paper's
≈ 8% that it finds best across its settings), λ = 1."""
from __future__ import annotations

from typing import Sequence

import torch

from forgetlab.merge.methods.common import LAM_RANGE, UNIT
from forgetlab.merge.methods.spectral import is_matrix, low_rank, rank_count
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, method


def cart(thetas: Sequence[torch.Tensor], lam: float, rank: float) -> torch.Tensor:
    """θ̄ + λ·Σt lowrank_k(θt − θ̄) of 2-D weights θt (float32)."""
    mean = torch.stack([t.to(torch.float32) for t in thetas]).mean(dim=0)
    k = rank_count(mean.shape, rank)
    out = mean.clone()
    for t in thetas:
        out.add_(low_rank(t.to(torch.float32) - mean, k), alpha=float(lam))
    return out


@method("cart", "CART: weight average plus rank-reduced task vectors centred at it.",
        (ParamSpec("lam", "float", 1.0, "Scaling λ of the centred low-rank task vectors.", LAM_RANGE),
         ParamSpec("rank", "float", 0.08, "Fraction of min(m, n) kept per centred task vector (paper: ≈ 8%).",
                   UNIT)),
        formula="θ = θ̄ + λ·Σt lowrank_k(θt − θ̄) on 2-D weights; θ̄ elsewhere", in_place=False,
        memory=WorkingMemory((2.1, 1.0)),
        title="CART", paper="Choi et al., Revisiting weight averaging for model merging (arXiv 2412.12153)")
def _cart(job: TensorJob) -> torch.Tensor:
    if is_matrix(job):
        return cart(job.finetuned, job.params["lam"], job.params["rank"])
    return torch.stack(job.finetuned).mean(dim=0)
