"""TIES-merging (docs/methods.md#ties): trim each task vector to its top `keep` fraction by |τ| (one fraction for
all models or one per model, mergekit's per-model density; per tensor, or with one threshold over the whole task
vector for scope="global"), elect a sign per entry, and average the entries that agree with it (the disjoint mean). With weights w (default 1) the election and the mean follow
mergekit's generalisation: elected sign = sign(Σt wt·τ̂t) (ties → +), merged = Σt wt·τ̂t·[agree] /
Σt wt·[agree] (0 where none agree). `dare_ties` (forgetlab.merge.methods.dare) uses the same election.

Reference: `trim`, `elect_sign`, `agreement`, `disjoint_mean`, `ties_combine`. CPU kernel: `ties_combine_into_`
(the same trim, election and mean block by block, in place). Global statistics: `TiesGlobalCollector`."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from forgetlab.merge.methods.common import (UNIT, l1_norm, l1_scale, lam_param, normalize_param, rescale_param,
                                            scope_param, weights_param)
from forgetlab.merge.mergekit_params import gta_params
from forgetlab.merge.registry import MergekitSpec, ParamSpec, TensorJob, WorkingMemory, fast_kernel, method
from forgetlab.merge.select import BLOCK, RadixSelect, block_ranges, keep_count, threshold_mask, top_cut_, topk_mask


def magnitude_mask(tau: torch.Tensor, keep: float) -> torch.Tensor:
    """TIES trim mask: the top-k entries of |τ| with k = keep_count(numel, keep)."""
    return topk_mask(tau.abs(), keep_count(tau.numel(), keep))


def trim(tau: torch.Tensor, keep: float) -> torch.Tensor:
    """TIES trim: τ with all but its top keep fraction of entries (by |τ|) set to 0; no rescale."""
    if keep >= 1:
        return tau
    return tau * magnitude_mask(tau, keep)


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


def ties_combine(trimmed: Sequence[torch.Tensor], weights: Sequence[float] | None = None,
                 normalize: bool = True) -> torch.Tensor:
    """Sign election + disjoint mean of already-trimmed task vectors (returns the merged task vector).

    Equivalent to `disjoint_mean(stack, elect_sign(w·stack), weights)`, computed with fewer temporaries:
    one stacked copy, updated in place. `normalize=False` (mergekit's option) returns the sum of the agreeing
    entries, Σ wt·τ̂t·[agree], instead of the mean.
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
    if not normalize:
        return num
    if unit:
        den = agree.sum(dim=0, dtype=stack.dtype)
    else:
        den = (agree * w.reshape((n,) + (1,) * (stack.dim() - 1))).sum(dim=0)
    return num / torch.where(den == 0, torch.ones_like(den), den)


def sum_rows(T: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = T[0] + T[1] + … in that order (the order in which `stack.sum(dim=0)` adds; a strided
    torch.sum over dim 0 of a block measured ~3× slower than these adds)."""
    if T.shape[0] == 1:
        return out.copy_(T[0])
    torch.add(T[0], T[1], out=out)
    for r in range(2, T.shape[0]):
        out.add_(T[r])
    return out


def ties_combine_into_(out: torch.Tensor, taus: Sequence[torch.Tensor], weights: Sequence[float] | None,
                       lam: float, cuts: Sequence[float | None] | None = None,
                       scales: Sequence[float] | None = None, normalize: bool = True) -> torch.Tensor:
    """out += λ·disjoint_mean(sign_elect(trim(τt))) in place, block by block (docs/methods.md#ties; mergekit's
    weighted form, see forgetlab.merge.ties). `taus` are left as they are.

    Trim: with `cuts`, model t keeps the entries with |τt| ≥ cuts[t] (the exact k-th largest |τt| from
    `kth_largest`, or a global threshold; +∞ keeps nothing, None everything) — τ̂t = τt·[|τt| ≥ cut], as
    `τ * mask` in the reference (ties at a cut must have been settled by the caller, see `settle_ties_`).
    Per entry, with v_t = wt·τ̂t: S = Σt v_t, elected sign σ = +1 where S ≥ 0 else −1; u_t = max(σ·v_t, 0)
    is |v_t| where its sign agrees and 0 elsewhere, so the agreeing sum is σ·Σt u_t (the same terms summed
    over the model axis of a stacked block, as `ties.ties_combine` sums its stack: bit-identical) and the
    agreeing weight Σt wt·sign(u_t); merged = σ·Σ u / that weight (1 where it is 0: nothing agrees, Σ u = 0).
    `scales` (mergekit's L1 `rescale`) multiplies each τ̂t before the weights (the divisor keeps the plain wt);
    `normalize=False` keeps the sum σ·Σ u (mergekit's option).
    """
    flat = [t.reshape(-1) for t in taus]
    o = out.reshape(-1)
    n_models = len(flat)
    w = [1.0] * n_models if weights is None else [float(x) for x in weights]
    wn = w if scales is None else [x * float(s) for x, s in zip(w, scales)]  # weights of the numerator
    unit = all(x == 1.0 for x in w)
    size = o.numel()
    nb = min(BLOCK, size)
    T = torch.empty((n_models, nb), dtype=torch.float32)
    S, sg, num, den = (torch.empty(nb, dtype=torch.float32) for _ in range(4))
    # |τ| ≥ cut ⇔ |τ| > the float just below cut: hardshrink(τ, that) keeps exactly the entries the cut keeps, in
    # one op (abs + compare + multiply took three); a dropped entry is +0 where `τ * mask` gives −0 for τ < 0
    # (the same value: the merged entry is then 0 either way).
    shrink = None if cuts is None else [None if c is None else float(np.nextafter(np.float32(c), np.float32(-np.inf)))
                                        for c in cuts]
    trim = shrink is not None and any(c is not None for c in shrink)
    wcol = None if unit else torch.tensor([[x] for x in w], dtype=torch.float32)
    ncol = wcol if scales is None else (None if all(x == 1.0 for x in wn)
                                        else torch.tensor([[x] for x in wn], dtype=torch.float32))
    for s, e in block_ranges(size):
        c = e - s
        T_, S_, sg_, num_, den_ = T[:, :c], S[:c], sg[:c], num[:c], den[:c]
        blocks = [t[s:e] for t in flat]
        if trim:
            for j, b in enumerate(blocks):
                if shrink[j] is None:
                    T_[j].copy_(b)
                else:
                    torch.ops.aten.hardshrink.out(b, shrink[j], out=T_[j])  # τ̂ = τ·[|τ| ≥ cut]
        else:
            for j, b in enumerate(blocks):
                T_[j].copy_(b)
        if ncol is not None:
            T_.mul_(ncol)
        sum_rows(T_, S_)
        torch.ge(S_, 0, out=sg_)
        sg_.mul_(2).sub_(1)  # σ = ±1
        T_.mul_(sg_).clamp_min_(0)  # u
        sum_rows(T_, num_)
        if not normalize:
            num_.mul_(sg_)
            if lam != 1:
                num_.mul_(lam)
            o[s:e].add_(num_)
            continue
        T_.sign_()  # [agree]
        if wcol is not None:
            T_.mul_(wcol)
        sum_rows(T_, den_)
        if unit:
            den_.clamp_min_(1)  # a count: 0 → 1
        else:
            den_.add_(torch.eq(den_, 0, out=S_))
        num_.div_(den_).mul_(sg_)
        if lam != 1:
            num_.mul_(lam)
        o[s:e].add_(num_)
    return out


class TiesGlobalCollector:
    """Global TIES trimming thresholds: per task, the exact k-th largest |τt| over the whole task vector,
    k = keep_count(total entries, keep_t) (`keep`: one fraction, or one per task). Two passes (RadixSelect)."""

    passes = 2

    def __init__(self, n_tasks: int, total: int, keep: float | Sequence[float]):
        keeps = keep if isinstance(keep, (list, tuple)) else [keep] * n_tasks
        self.selects = [RadixSelect(keep_count(total, k)) for k in keeps]

    def add(self, pass_index, name, base, taus):
        for sel, tau in zip(self.selects, taus):
            sel.add(tau.abs())

    def end_pass(self, pass_index):
        for sel in self.selects:
            sel.advance()

    def result(self) -> list[float | None]:
        return [sel.value for sel in self.selects]


def _ties_trimmed(job: TensorJob) -> list[torch.Tensor]:
    keeps, taus = job.params["keep"], job.take_taus()
    before = [l1_norm(tau) for tau in taus] if job.params.get("rescale") else None
    if job.params["scope"] == "global":
        out = [tau.mul_(threshold_mask(tau.abs(), thr)) for tau, thr in zip(taus, job.stats)]
    else:
        out = [tau if keep >= 1 else tau.mul_(magnitude_mask(tau, keep)) for tau, keep in zip(taus, keeps)]
    if before is not None:  # mergekit leaves a tensor it does not sparsify (density ≥ 1) as it is
        for tau, b, keep in zip(out, before, keeps):
            if keep < 1:
                tau.mul_(l1_scale(b, l1_norm(tau)))
    return out


@method("ties", "TIES: trim each task vector, elect signs, average the agreeing entries.",
        (ParamSpec("keep", "float", 0.2, "Fraction of each task vector's entries kept (top |τ|); one number, or "
                   "one per model (mergekit's per-model density).", UNIT, per_model=True, model_key="keep"),
         lam_param(), scope_param("tensor"), weights_param(), normalize_param(True), rescale_param(False)),
        mergekit=MergekitSpec("ties", params=gta_params(normalize=True, rescale=False, density="keep")),
        collector=lambda n, total, p: TiesGlobalCollector(n, total, p["keep"]),
        global_when=lambda p: p.get("scope") == "global",
        formula="θ = θ0 + λ·disjoint_mean(sign_elect(trim(τt, keep))) (a sum of the agreeing entries without "
                "normalize)", memory=WorkingMemory(fast=(0.4, 0), reference=(6.6, 1.5)),
        title="TIES", paper="Yadav et al., TIES-Merging (NeurIPS 2023)")
def _ties(job: TensorJob) -> torch.Tensor:
    p = job.params
    merged = ties_combine(_ties_trimmed(job), p["weights"], p["normalize"])  # torch.kthvalue, no copies to the CPU
    return job.base + p["lam"] * merged


@fast_kernel("ties")
def _ties_fast(job: TensorJob) -> torch.Tensor | None:
    # the same trim, election and disjoint mean, in place: exact selection instead of a sort, numpy masks,
    # blocks that stay in cache; the result is written into the base the job owns
    p = job.params
    keeps = p["keep"]
    if p["rescale"] and any(k < 1 for k in keeps):
        return None  # the reference computes the L1 norms of the trimmed task vectors
    taus = job.take_taus()
    if p["scope"] == "global":
        cuts = [math.inf if thr is None else thr for thr in job.stats]
    elif any(k < 1 for k in keeps):
        n = job.base.numel()
        cuts = [None if k >= 1 else top_cut_(tau, keep_count(n, k)) for tau, k in zip(taus, keeps)]
    else:
        cuts = None
    return ties_combine_into_(job.base, taus, p["weights"], p["lam"], cuts, normalize=p["normalize"])
