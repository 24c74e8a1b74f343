"""SCE — Select, Calculate, Erase (docs/methods.md#sce), as mergekit 0.1.5 computes it, per tensor:
1. select: with `select_topk` < 1, keep the entries whose variance across the task vectors is among the top
   ⌊select_topk · (number of entries with nonzero variance)⌋ (the same entries in every task vector);
2. calculate: each model's weight is the mean of its selected τt², divided by their sum (equal weights when that
   sum is below 1e-6);
3. erase: TIES's sign election on Σt τt (ties → +); τ = Σt wt·τt·[agree] / max(Σt wt·[agree], 1e-6).

CPU kernel: `sce_into_` — the same numbers block by block in place (the variance into one buffer, the exact k-th
largest variance by `select.kth_largest` instead of a stacked copy and a full selection)."""
from __future__ import annotations

import numpy as np
import torch

from forgetlab.merge.methods.common import UNIT
from forgetlab.merge.methods.ties import sum_rows
from forgetlab.merge.registry import MergekitSpec, MkParam, ParamSpec, TensorJob, WorkingMemory, fast_kernel, method
from forgetlab.merge.select import BLOCK, as_array, block_ranges, kth_largest, topk_mask


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
    return _normalized(stack.square().reshape(stack.shape[0], -1).mean(dim=1))


def _normalized(w: torch.Tensor) -> torch.Tensor:
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


# Sub-blocks for the float64 variance: four float64 buffers of this size stay in the core's cache.
VAR_BLOCK = 1 << 13


def _variance_into(taus: list[torch.Tensor], var: np.ndarray) -> None:
    """Population variance across the flat task vectors, in the bits torch.var gives over their stack on the
    CPU: Welford's update in float64, model by model, then m2 / N. numpy on small blocks (torch.var itself takes
    ~40 ns per entry on such a short axis; per-call overhead and cache misses decide the rest)."""
    arrays = [as_array(t) for t in taus]
    n = var.size
    nb = min(VAR_BLOCK, n)
    mean, m2, x, d = (np.empty(nb, np.float64) for _ in range(4))
    for s in range(0, n, nb):
        c = min(n, s + nb) - s
        mean_, m2_, x_, d_ = mean[:c], m2[:c], x[:c], d[:c]
        mean_[:] = arrays[0][s:s + c]
        m2_.fill(0)
        for i, a in enumerate(arrays[1:], start=2):
            x_[:] = a[s:s + c]
            np.subtract(x_, mean_, out=d_)  # δ = x − mean
            np.add(mean_, d_ / i, out=mean_)
            np.subtract(x_, mean_, out=x_)  # x − new mean
            np.multiply(d_, x_, out=d_)
            np.add(m2_, d_, out=m2_)
        np.divide(m2_, len(arrays), out=m2_)
        var[s:s + c] = m2_


def _select_(taus: list[torch.Tensor], select_topk: float, var: torch.Tensor) -> None:
    """`sce_select_mask` applied in place to the flat task vectors: the variance into `var` (`_variance_into`),
    the cut by `kth_largest` (ties: the first in storage order)."""
    n = var.numel()
    v = as_array(var)
    _variance_into(taus, v)
    k = int(np.count_nonzero(v.view(np.uint32)) * select_topk)  # the bits: a variance is never −0
    if k == 0:
        for t in taus:
            t.mul_(0)
        return
    cut, n_ge = kth_largest(v, k)  # k ≤ nnz: cut > 0
    if n_ge > k:  # drop the tied entries after the first k − #(> cut) (variances are ≥ 0: −1 is below any cut)
        tied = np.flatnonzero(v == np.float32(cut))
        v[tied[k - (n_ge - tied.size):]] = -1
    keep = np.empty(min(BLOCK, n), np.bool_)
    for s, e in block_ranges(n):
        kp = keep[: e - s]
        np.greater_equal(v[s:e], np.float32(cut), out=kp)
        for t in taus:
            blk = as_array(t)[s:e]
            np.multiply(blk, kp, out=blk)


def _energies(taus: list[torch.Tensor], buf: torch.Tensor) -> torch.Tensor:
    """mean(τt²) per model, as `stack.square().reshape(N, -1).mean(dim=1)` computes it: two rows at a time (torch
    sums the rows of a matrix in another order than a single vector; a row of a 2-row matrix as of an N-row one)."""
    out = []
    for i in range(0, len(taus), 2):
        pair = taus[i:i + 2]
        for r in range(2):
            torch.square(pair[min(r, len(pair) - 1)], out=buf[r])
        out.extend(buf.mean(dim=1)[: len(pair)])
    return torch.stack(out)


def sce_into_(base: torch.Tensor, taus: list[torch.Tensor], select_topk: float = 1.0) -> torch.Tensor:
    """`sce` in place, block by block, on contiguous float32 CPU tensors: `base` receives the merge, `taus` are
    masked in place. Memory: two tensors of the size of one task vector (the variance, then the squares)."""
    flat = [t.reshape(-1) for t in taus]
    n = base.numel()
    nb = min(BLOCK, n)
    T = torch.empty((len(flat), nb), dtype=torch.float32)
    buf = torch.empty((2, n), dtype=torch.float32)
    if select_topk < 1:
        _select_(flat, select_topk, buf[0])
    w = _normalized(_energies(flat, buf))
    del buf
    wcol = w.reshape(-1, 1)
    o = base.reshape(-1)
    S, num, den = (torch.empty(nb, dtype=torch.float32) for _ in range(3))
    A = torch.empty_like(T)
    for s, e in block_ranges(n):
        c = e - s
        T_, A_, S_, num_, den_ = T[:, :c], A[:, :c], S[:c], num[:c], den[:c]
        for j, t in enumerate(flat):
            T_[j].copy_(t[s:e])
        sum_rows(T_, S_)
        torch.ge(S_, 0, out=S_)
        S_.mul_(2).sub_(1)  # the elected sign σ = ±1
        torch.mul(T_, S_, out=A_)
        torch.gt(A_, 0, out=A_)  # [agree]
        A_.mul_(wcol)  # erased = wt·[agree]
        sum_rows(A_, den_)
        T_.mul_(A_)
        sum_rows(T_, num_)
        num_.div_(den_.clamp_min_(1e-6))
        o[s:e].add_(num_)
    return base


# published configs give sce a per-model weight, which mergekit's sce does not read: accepted, with a notice
SCE_MERGEKIT = MergekitSpec("sce", int8_mask=True, ignored=(
    MkParam("weight", None, True, False, 1.0, ignored="SCE weighs each model by the mean square of its selected "
                                                       "task vector"),))


@method("sce", "SCE: select high-variance entries, weight models by their task vectors' energy, erase "
        "minority signs.",
        (ParamSpec("select_topk", "float", 1.0, "Fraction of the entries (by variance across models) kept; 1 "
                   "keeps all.", UNIT),
         ParamSpec("int8_mask", "bool", False, "mergekit's memory option for its masks; the numbers are the "
                   "same either way (accepted so that mergekit recipes carry over).")),
        mergekit=SCE_MERGEKIT,
        formula="θ = θ0 + Σt wt·τ̂t·[agree] / Σt wt·[agree], wt ∝ mean(τ̂t²)",
        memory=WorkingMemory(fast=(2.2, 0), reference=(1.4, 3.3)),
        title="SCE", paper="Wan et al., FuseChat (arXiv 2408.07990)")
def _sce(job: TensorJob) -> torch.Tensor:
    return sce(job.base, job.take_taus(), job.params["select_topk"])


@fast_kernel("sce")
def _sce_fast(job: TensorJob) -> torch.Tensor:
    return sce_into_(job.base, job.take_taus(), job.params["select_topk"])
