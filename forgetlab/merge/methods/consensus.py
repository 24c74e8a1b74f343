"""Consensus merging with TALL masks (docs/methods.md#consensus): θMT = θ0 + Σt τt; TALL mask
mt = |τt| ≥ λt·|θMT − θt| (θMT − θt = Σs τs − τt, so θ0 cancels); consensus mask = entries where Σt mt ≥ k;
θ = θ0 + α·(Σt τt) ⊙ consensus. Defaults λt = 0.4, k = 2, α = 1.

Reference: `tall_masks`, `consensus_mask`, `consensus_merge`. CPU kernel: `consensus_into_`."""
from __future__ import annotations

from typing import Sequence

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.methods.common import UNIT
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, fast_kernel, method
from forgetlab.merge.select import BLOCK, block_ranges


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


def consensus_into_(out: torch.Tensor, taus: Sequence[torch.Tensor], lams: Sequence[float], k: int,
                    alpha: float) -> torch.Tensor:
    """out += α·(Σt τt) ⊙ [Σt mt ≥ k] in place, mt = |τt| ≥ λt·|Σs τs − τt| (docs/methods.md#consensus / TALL
    masks), block by block with float masks; the same operations in the same order as
    `consensus.consensus_merge` (total = 0 + τ1 + τ2 + …, masks counted as 1.0/0.0)."""
    flat = [t.reshape(-1) for t in taus]
    o = out.reshape(-1)
    nb = min(BLOCK, o.numel())
    tot, d, m, cnt = (torch.empty(nb, dtype=torch.float32) for _ in range(4))
    for s, e in block_ranges(o.numel()):
        c = e - s
        tot_, d_, m_, cnt_ = tot[:c], d[:c], m[:c], cnt[:c]
        blocks = [t[s:e] for t in flat]
        tot_.zero_()
        for b in blocks:
            tot_.add_(b)
        cnt_.zero_()
        for b, lt in zip(blocks, lams):
            torch.sub(tot_, b, out=d_).abs_().mul_(float(lt))
            torch.abs(b, out=m_)
            torch.ge(m_, d_, out=m_)
            cnt_.add_(m_)
        torch.ge(cnt_, int(k), out=cnt_)
        tot_.mul_(alpha).mul_(cnt_)
        o[s:e].add_(tot_)
    return out


def _check_consensus(params: dict, n: int) -> None:
    if n and params["k"] > n:
        raise ParameterError(f"consensus: k={params['k']} exceeds the {n} fine-tuned models, so no entry could "
                             f"ever be kept; choose k between 1 and {n}.")


@method("consensus", "Consensus / TALL masks: keep the entries that at least k tasks find important.",
        (ParamSpec("lam", "float", 0.4, "TALL-mask threshold λt: mt = |τt| ≥ λt·|θMT − θt| (one or per "
                   "model).", (0.0, 100.0), per_model=True, model_key="lam"),
         ParamSpec("k", "int", 2, "Minimum number of task masks that must select an entry.", (1, 1000)),
         ParamSpec("alpha", "float", 1.0, "Scaling α of the masked sum of task vectors.", UNIT)),
        check=_check_consensus,
        formula="θ = θ0 + α·(Σt τt) ⊙ [Σt mt ≥ k]", memory=WorkingMemory(fast=(0.4, 0), reference=(5.4, 0.3)),
        title="Consensus (TALL masks)",
        paper="Wang et al., Localizing task information for improved model merging and compression (ICML 2024)")
def _consensus(job: TensorJob) -> torch.Tensor:
    p = job.params
    return job.base + consensus_merge(job.take_taus(), p["lam"], p["k"], p["alpha"])


@fast_kernel("consensus")
def _consensus_fast(job: TensorJob) -> torch.Tensor:
    p = job.params
    taus = job.take_taus()
    lams = [float(p["lam"])] * len(taus) if isinstance(p["lam"], (int, float)) else p["lam"]
    return consensus_into_(job.base, taus, lams, p["k"], p["alpha"])
