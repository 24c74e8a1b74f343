"""FAPM: forgetting-aware pruning of a task vector (docs/methods.md#fapm).

Per tensor: S = |τ| − mean(|W0|)·|τ|/|W0|. The entries with the largest S are kept so that ⌊ratio·n⌋ entries
are zeroed; no rescale; θ = θ0 + mask ⊙ τ. Where W0 = 0 and τ ≠ 0, S = −∞ (pruned first); where τ = 0
the score is 0 (such entries change nothing whether kept or not). Ablations: "magnitude" (S = |τ|) and
"relative" (S = −|τ|/|W0|, keeps the smallest relative changes). For a LoRA adapter the task vector is
ΔW = (lora_alpha / r)·B·A, pruned exactly like a full task vector but with its own default ratio,
ADAPTER_RATIO (the FAPM rebuttal: for LoRA the ratio "needs to be relatively small").

All-zero base tensor (mean(|W0|) = 0, e.g. a zero-initialised bias): the relative term is mean(|W0|)·|τ|/|W0|
= 0·∞, undefined, and would score every changed entry NaN, so that nothing is kept at any ratio below 1.
Such a tensor is scored by magnitude, S = |τ|: with no pre-trained scale to compare against, FAPM's
magnitude term is all that is left of the score (and the paper's magnitude ablation keeps task performance).

Reference: `fapm_scores`, `fapm_mask`, `fapm_prune`. CPU kernels: `fapm_score_into`, `fapm_prune_`.
"""
from __future__ import annotations

import math

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.methods.common import UNIT, add_scaled, lam_param, weights_param
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, fast_kernel, method
from forgetlab.merge.select import block_ranges, keep_top_, topk_mask


SCORES = ("fapm", "magnitude", "relative")


# Default pruning ratio for LoRA adapters. The FAPM rebuttal (seeds/fapm-rebuttal.txt, answer to reviewer
# YFJm, Q2) found that for LoRA "the pruning ratio … needs to be relatively small to avoid significant
# performance degradation in downstream tasks", because ΔW = B·A is low-rank and holds "relatively few
# redundant parameters"; it gives no number in the text (its Table 1 is not reproduced there). forgetlab uses
# 0.5 — the ratio at which, on a rank-r ΔW, half the entries survive — as a moderate default well below the
# 0.9 of full fine-tunes; it is a forgetlab choice, not the paper's, and is shown as such in the app's form.
ADAPTER_RATIO = 0.5


def _relative(tau_abs: torch.Tensor, w0_abs: torch.Tensor) -> torch.Tensor:
    """|τ|/|W0| with +∞ where W0 = 0 and τ ≠ 0, and 0 where τ = 0."""
    rel = tau_abs / w0_abs
    rel = torch.where(tau_abs == 0, torch.zeros_like(rel), rel)
    return torch.where((w0_abs == 0) & (tau_abs != 0), torch.full_like(rel, float("inf")), rel)


def fapm_scores(tau: torch.Tensor, w0: torch.Tensor, score: str = "fapm") -> torch.Tensor:
    """Pruning score per entry: "fapm" S = |τ| − mean(|W0|)·|τ|/|W0|, "magnitude" S = |τ|,
    "relative" S = −|τ|/|W0| (−∞ where W0 = 0 and τ ≠ 0 for "fapm" and "relative")."""
    if score not in SCORES:
        raise ParameterError(f"Unknown FAPM score {score!r}; choose one of {', '.join(SCORES)}.")
    if tau.shape != w0.shape:
        raise ParameterError(f"FAPM: task vector shape {tuple(tau.shape)} differs from base shape {tuple(w0.shape)}.")
    tau_abs = tau.to(torch.float32).abs()
    if score == "magnitude":
        return tau_abs
    w0_abs = w0.to(torch.float32).abs()
    rel = _relative(tau_abs, w0_abs)
    if score == "relative":
        return -rel
    mean0 = w0_abs.mean()
    if not bool(mean0 > 0):  # all-zero base tensor: 0·∞ is undefined, score by magnitude (module docstring)
        return tau_abs
    # mean(|W0|) > 0 and finite: −∞ from the relative term stays −∞ (|τ| finite), and no NaN can arise
    return tau_abs - mean0 * rel


def fapm_mask(tau: torch.Tensor, w0: torch.Tensor, ratio: float = 0.9, score: str = "fapm") -> torch.Tensor:
    """Boolean keep mask (True = keep): the n − ⌊ratio·n⌋ entries with the largest score."""
    if not 0.0 <= float(ratio) <= 1.0:
        raise ParameterError(f"ratio must lie in [0, 1]; got {ratio}. It is the fraction of entries zeroed.")
    n = tau.numel()
    k = n - int(float(ratio) * n)
    if k >= n:
        return torch.ones_like(tau, dtype=torch.bool)
    return topk_mask(fapm_scores(tau, w0, score), k)


def fapm_prune(tau: torch.Tensor, w0: torch.Tensor, ratio: float = 0.9, score: str = "fapm") -> torch.Tensor:
    """Pruned task vector mask ⊙ τ (ratio 0 returns τ, ratio 1 returns zeros)."""
    if float(ratio) <= 0:
        return tau
    return tau * fapm_mask(tau, w0, ratio, score)


def fapm_score_into(score: torch.Tensor, tau: torch.Tensor, w0_abs: torch.Tensor, mean0: float | None,
                    kind: str) -> torch.Tensor:
    """FAPM's pruning score of τ into `score` (docs/methods.md#fapm; the rules of `fapm.fapm_scores`), block by
    block without torch.where: "fapm" S = |τ| − mean(|W0|)·|τ|/|W0|, "relative" S = −|τ|/|W0|, "magnitude"
    S = |τ|; `mean0` = mean(|W0|), None for an all-zero base (then "fapm" scores by magnitude). |τ|/|W0| is
    +∞ where W0 = 0 and τ ≠ 0 by itself; the one NaN, 0/0 where τ = 0 and W0 = 0, is the reference's 0."""
    flat, w, sc = tau.reshape(-1), w0_abs.reshape(-1), score.reshape(-1)
    if kind == "magnitude" or (kind == "fapm" and mean0 is None):
        return torch.abs(flat, out=sc).reshape(score.shape)
    inf = math.inf
    for s, e in block_ranges(flat.numel()):
        b, sc_ = flat[s:e], sc[s:e]
        torch.abs(b, out=sc_)
        if kind == "relative":
            sc_.div_(w[s:e]).neg_()
        else:
            rel = torch.div(sc_, w[s:e])
            sc_.sub_(rel.mul_(mean0))
        torch.nan_to_num_(sc_, nan=0.0, posinf=inf, neginf=-inf)
    return score


def fapm_prune_(tau: torch.Tensor, w0_abs: torch.Tensor, mean0: float | None, ratio: float, kind: str,
                score: torch.Tensor) -> torch.Tensor:
    """FAPM pruning in place: keep the n − ⌊ratio·n⌋ entries of τ with the largest score (exact selection,
    ties by storage order as `sparsify.topk_mask`), zero the rest (`fapm.fapm_prune`). `score` is scratch of
    τ's size."""
    if float(ratio) <= 0:
        return tau
    n = tau.numel()
    k = n - int(float(ratio) * n)
    if k >= n:
        return tau
    if kind == "magnitude" or (kind == "fapm" and mean0 is None):
        return keep_top_(tau, k)
    return keep_top_(tau, k, fapm_score_into(score, tau, w0_abs, mean0, kind))


def _ratios(job: TensorJob) -> list[float]:
    p = job.params
    return [p["adapter_ratio"] if job.is_adapter(i) else p["ratio"] for i in range(len(job.finetuned))]


@method("fapm", "FAPM: prune each task vector by forgetting-aware scores, then add (task arithmetic).",
        (ParamSpec("ratio", "float", 0.9, "Pruning ratio: fraction of each tensor's task-vector entries "
                   "zeroed (full fine-tunes; 0.9 as in the FAPM paper).", UNIT),
         ParamSpec("adapter_ratio", "float", ADAPTER_RATIO, "Pruning ratio for LoRA adapters' ΔW = B·A. The "
                   "FAPM rebuttal says it \"needs to be relatively small\" for LoRA (low-rank ΔW has few "
                   "redundant entries) but gives no number; 0.5 is forgetlab's choice.", UNIT),
         ParamSpec("score", "str", "fapm", "\"fapm\": |τ| − mean|W0|·|τ|/|W0|; ablations \"magnitude\" "
                   "(|τ|) and \"relative\" (−|τ|/|W0|).", choices=SCORES),
         lam_param(), weights_param()),
        formula="θ = θ0 + λ·Σ wt·mask_t ⊙ τt", memory=WorkingMemory(fast=(2.2, 0), reference=(5.8, 1.3)),
        title="FAPM", paper="the FAPM paper (forgetting-aware pruning metric)")
def _fapm(job: TensorJob) -> torch.Tensor:
    p = job.params
    ratios = _ratios(job)
    parts = [fapm_prune(tau, job.base, r, p["score"]) for tau, r in zip(job.take_taus(), ratios)]
    return add_scaled(job, parts, p["lam"])


@fast_kernel("fapm")
def _fapm_fast(job: TensorJob) -> torch.Tensor:
    # the scores of fapm_scores block by block, exact selection, pruned in place
    p = job.params
    ratios = _ratios(job)
    taus = job.take_taus()
    w0_abs = job.base.abs()
    mean0 = w0_abs.mean()
    mean0 = float(mean0) if bool(mean0 > 0) else None  # all-zero base tensor: magnitude (module docstring)
    score = torch.empty_like(w0_abs)
    parts = [fapm_prune_(tau, w0_abs, mean0, r, p["score"], score) for tau, r in zip(taus, ratios)]
    return add_scaled(job, parts, p["lam"])
