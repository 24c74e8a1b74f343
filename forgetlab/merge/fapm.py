"""FAPM: forgetting-aware pruning of a task vector (METHODS.md; seed fapm-rebuttal.txt).

Per tensor: S = |τ| − mean(|W0|)·|τ|/|W0|. The entries with the largest S are kept so that ⌊ratio·n⌋ entries
are zeroed; no rescale; θ = θ0 + mask ⊙ τ. Where W0 = 0 and τ ≠ 0, S = −∞ (pruned first); where τ = 0
the score is 0 (such entries change nothing whether kept or not). Ablations: "magnitude" (S = |τ|) and
"relative" (S = −|τ|/|W0|, keeps the smallest relative changes). For a LoRA adapter the task vector is
ΔW = (lora_alpha / r)·B·A, pruned exactly like a full task vector.
"""
from __future__ import annotations

import torch

from forgetlab.errors import ParameterError
from forgetlab.merge.sparsify import topk_mask

SCORES = ("fapm", "magnitude", "relative")


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
    s = tau_abs - w0_abs.mean() * rel
    # −∞ from the relative term stays −∞ (|τ| finite); NaN cannot arise since rel has no NaN.
    return s


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
