"""Model Breadcrumbs (docs/methods.md#breadcrumbs): per tensor, drop the largest γ fraction of τ's entries
(outliers) and the smallest ones, so that exactly ⌊keep·n⌋ survive (keep and γ: one for all models, or one per
model); no rescale; then task arithmetic.

Reference: `breadcrumbs_counts`, `breadcrumbs_mask`, `breadcrumbs`. CPU kernel: `breadcrumbs_` (in place)."""
from __future__ import annotations

import math

import numpy as np
import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.methods.common import (UNIT, add_scaled, l1_norm, l1_scale, lam_param, normalize_param,
                                            normalized_lam, rescale_param, weights_param)
from forgetlab.merge.mergekit_params import gta_params
from forgetlab.merge.registry import MergekitSpec, ParamSpec, TensorJob, WorkingMemory, fast_kernel, method
from forgetlab.merge.select import BLOCK, score_block, as_array, block_ranges, kth_largest, topk_mask


def breadcrumbs_counts(n: int, keep: float, gamma: float) -> tuple[int, int]:
    """(n_top, n_keep) for Breadcrumbs: n_top = ⌊γ·n⌋ largest entries removed, n_keep = ⌊keep·n⌋ kept.

    If keep + γ would exceed 1 after flooring, fewer large entries are removed (mergekit's rule).
    """
    n_keep = int(keep * n) if keep < 1 else n
    n_top = int(gamma * n)
    n_top = min(n_top, n - n_keep)
    return n_top, n_keep


def breadcrumbs_mask(tau: torch.Tensor, keep: float, gamma: float) -> torch.Tensor:
    """Breadcrumbs mask: entries ranked n_top+1 … n_top+n_keep by |τ| (largest γ fraction and the smallest
    entries removed, exactly ⌊keep·n⌋ survive)."""
    n = tau.numel()
    if keep >= 1:
        return torch.ones_like(tau, dtype=torch.bool)
    n_top, n_keep = breadcrumbs_counts(n, keep, gamma)
    mag = tau.abs()
    outer = topk_mask(mag, n_top + n_keep)
    if n_top > 0:
        outer &= ~topk_mask(mag, n_top)
    return outer


def breadcrumbs(tau: torch.Tensor, keep: float = 0.1, gamma: float = 0.01) -> torch.Tensor:
    """Breadcrumbs sparsification of τ (no rescale): τ ⊙ breadcrumbs_mask(τ, keep, γ)."""
    if keep + gamma > 1 + 1e-12:
        raise ParameterError(f"Breadcrumbs needs keep + gamma ≤ 1; got keep={keep}, gamma={gamma}.")
    if keep >= 1:
        return tau
    return tau * breadcrumbs_mask(tau, keep, gamma)


def breadcrumbs_(tau: torch.Tensor, n_top: int, n_keep: int) -> torch.Tensor:
    """Breadcrumbs in place (docs/methods.md): keep the entries ranked n_top + 1 … n_top + n_keep by |τ|, i.e.
    τ·(topk(|τ|, n_top + n_keep) ∧ ¬topk(|τ|, n_top)) exactly as `sparsify.breadcrumbs_mask` (ties at either
    cut broken by storage order, first wins). Without ties at the cuts: one blocked pass keeping
    lo ≤ |τ| < hi; with ties: the same masks built in numpy with the tied entries settled."""
    arr = as_array(tau)
    n = arr.size
    k1, k2 = n_top + n_keep, n_top
    row = int(tau.shape[-1]) if tau.dim() else 1
    if k1 <= 0:
        arr *= np.float32(0)
        return tau
    lo, n_ge1 = (-math.inf, n) if k1 >= n else kth_largest(arr, k1, row=row, absolute=True)
    hi, n_ge2 = (math.inf, 0) if k2 <= 0 else kth_largest(arr, k2, row=row, absolute=True)
    ties1 = k1 < n and n_ge1 > k1 and lo > 0  # ties at a cut of 0 change nothing: those entries are 0
    ties2 = k2 > 0 and n_ge2 > k2 and hi > 0
    if not ties1 and not ties2:
        nb = min(BLOCK, n)
        buf, keep, below = np.empty(nb, np.float32), np.empty(nb, np.bool_), np.empty(nb, np.bool_)
        for s, e in block_ranges(n):
            c = e - s
            a = score_block(arr, True, s, e, buf)
            np.greater_equal(a, np.float32(lo), out=keep[:c])
            np.less(a, np.float32(hi), out=below[:c])
            np.logical_and(keep[:c], below[:c], out=keep[:c])
            blk = arr[s:e]
            np.multiply(blk, keep[:c], out=blk)
        return tau
    a = np.abs(arr)
    outer = np.greater_equal(a, np.float32(lo))
    if ties1:
        tied = np.flatnonzero(a == np.float32(lo))
        outer[tied[k1 - (n_ge1 - tied.size):]] = False
    if k2 > 0:
        inner = np.greater_equal(a, np.float32(hi))
        if ties2:
            tied = np.flatnonzero(a == np.float32(hi))
            inner[tied[k2 - (n_ge2 - tied.size):]] = False
        outer &= ~inner
    np.multiply(arr, outer, out=arr)
    return tau


def _check_breadcrumbs(params: dict, n: int) -> None:
    m = max(len(v) if isinstance(v, list) else 1 for v in (params["keep"], params["gamma"]))
    keeps, gammas = (v if isinstance(v, list) else [v] * m for v in (params["keep"], params["gamma"]))
    for i, (keep, gamma) in enumerate(zip(keeps, gammas)):
        if keep + gamma > 1 + 1e-12:
            who = f" for model {i + 1}" if len({*keeps}) > 1 or len({*gammas}) > 1 else ""
            raise ParameterError(f"breadcrumbs needs keep + gamma ≤ 1; got keep={keep}, gamma={gamma}{who}. Lower "
                                 "one of them.")


@method("breadcrumbs", "Model Breadcrumbs: drop the largest outliers and the smallest entries, then add.",
        (ParamSpec("keep", "float", 0.1, "Fraction of entries kept per tensor (keep + gamma ≤ 1); one number, or "
                   "one per model.", UNIT, per_model=True, model_key="keep"),
         ParamSpec("gamma", "float", 0.01, "Fraction of largest-magnitude entries removed per tensor; one number, "
                   "or one per model.", UNIT, per_model=True, model_key="gamma"),
         lam_param(), weights_param(), normalize_param(False), rescale_param(False)),
        check=_check_breadcrumbs,
        mergekit=MergekitSpec("breadcrumbs",
                              params=gta_params(normalize=False, rescale=False, density="keep", gamma=True)),
        formula="θ = θ0 + λ·Σ wt·breadcrumbs(τt, keep, γ) (/ Σ wt with normalize)",
        memory=WorkingMemory(fast=(1.9, 0), reference=(3.1, 0.9)),
        title="Model Breadcrumbs", paper="Davari & Belilovsky, Model Breadcrumbs (ECCV 2024)")
def _breadcrumbs(job: TensorJob) -> torch.Tensor:
    p = job.params
    parts = []
    for tau, keep, gamma in zip(job.take_taus(), p["keep"], p["gamma"]):
        part = breadcrumbs(tau, keep, gamma)
        if p["rescale"] and keep < 1:  # mergekit's L1 rescale of the sparsified task vector
            part = part * l1_scale(l1_norm(tau), l1_norm(part))
        parts.append(part)
    return add_scaled(job, parts, normalized_lam(p["lam"], p["weights"], p["normalize"]))


@fast_kernel("breadcrumbs")
def _breadcrumbs_fast(job: TensorJob) -> torch.Tensor | None:
    p = job.params
    if any(keep >= 1 for keep in p["keep"]) or p["rescale"]:
        return None
    taus = job.take_taus()
    parts = []
    for tau, keep, gamma in zip(taus, p["keep"], p["gamma"]):
        if keep + gamma > 1 + 1e-12:
            breadcrumbs(tau, keep, gamma)  # raises the same message
        parts.append(breadcrumbs_(tau, *breadcrumbs_counts(job.base.numel(), keep, gamma)))
    lam = normalized_lam(p["lam"], p["weights"], p["normalize"])
    return add_scaled(job, parts, lam)
