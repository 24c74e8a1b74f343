"""What the method families share: the parameters every task-vector method names the same way (`lam`,
`weights`, `seed`, `scope`) and adding scaled parts of task vectors to the base in place."""
from __future__ import annotations

import math

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.registry import ParamSpec, TensorJob


UNIT = (0.0, 1.0)
LAM_RANGE = (-10.0, 10.0)


def lam_param(default: float = 1.0) -> ParamSpec:
    """The `lam` parameter: λ scaling the merged task vector."""
    return ParamSpec("lam", "float", default, "Scaling λ of the merged task vector (θ = θ0 + λ·…).", LAM_RANGE)


def weights_param() -> ParamSpec:
    """The `weights` parameter: wt per fine-tuned model (one number for all, or one per model)."""
    return ParamSpec("weights", "float", 1.0, "Weight wt of each fine-tuned model (one number, or one per model).",
                     LAM_RANGE, per_model=True, model_key="weight")


def seed_param() -> ParamSpec:
    """The `seed` parameter of random drop masks."""
    return ParamSpec("seed", "int", 0, "Seed of the random drop masks (same seed, same masks).", (0, 2**63 - 1))


def scope_param(default: str) -> ParamSpec:
    """The `scope` parameter: statistics per tensor or over the whole task vector."""
    return ParamSpec("scope", "str", default, "\"tensor\": statistics per tensor; \"global\": over the whole "
                     "flattened task vector (a first streaming pass).", choices=("tensor", "global"))


def add_scaled(job: TensorJob, parts: list[torch.Tensor], lam: float) -> torch.Tensor:
    """θ0 + λ·Σ wt·partt, accumulated into the base tensor, which the job owns (the engine's reads are
    copies) and which no method reads after its parts are made: no output buffer to allocate."""
    out = job.base
    for part, w in zip(parts, job.params["weights"]):
        out.add_(part, alpha=float(lam) * float(w))
    return out


def normalize_param(default: bool) -> ParamSpec:
    """mergekit's `normalize`: divide the merged task vector by the sum of the weights (of the agreeing models,
    for the sign-electing methods)."""
    return ParamSpec("normalize", "bool", default, "Divide the merged task vector by the sum of the weights (the "
                     "weights of the agreeing entries for TIES-style sign election): a weighted mean instead of a "
                     "sum.")


def rescale_param(default: bool) -> ParamSpec:
    """mergekit's `rescale`: rescale each sparsified task vector so that it keeps its L1 norm."""
    return ParamSpec("rescale", "bool", default, "Rescale each sparsified task vector so that its L1 norm is the "
                     "one it had before sparsification (mergekit's rule).")


L1_EPS = 1e-7  # mergekit's sparsify.rescaled_masked_tensor: norms below this leave the masked tensor as it is


def l1_scale(before: float, after: float) -> float:
    """The factor ‖τ‖₁ / ‖τ̂‖₁ that gives a sparsified task vector τ̂ the L1 norm of τ (1 when either norm is
    below 1e-7, as mergekit's `rescaled_masked_tensor` leaves such tensors unscaled)."""
    if before < L1_EPS or after < L1_EPS:
        return 1.0
    return float(torch.tensor(before, dtype=torch.float32) / torch.tensor(after, dtype=torch.float32))


def l1_norm(t: torch.Tensor) -> float:
    """Σ|t| in float32, as mergekit sums it (`tensor.abs().sum()`)."""
    return float(t.abs().sum())


def check_weight_sum(weights, method: str, switch: str) -> float:
    """Σ wt of weights a method divides by (with `switch` on), refused only where that division is undefined: a
    sum that is exactly 0 (in float32, as mergekit sums them, or in float64) or not finite. The scale of the
    weights does not matter (1e-13 each is an average like any other). Returns the float64 sum."""
    w = [float(x) for x in weights]
    total = math.fsum(w)
    single = float(torch.tensor(w, dtype=torch.float32).sum())
    if total == 0 or single == 0 or not math.isfinite(total) or not math.isfinite(single):
        raise ParameterError(f"{method}: the weights {w} sum to {single if math.isfinite(single) else total}, so "
                             f"dividing by their sum ({switch}: true) is undefined; change a weight so that they do "
                             f"not cancel out, or set {switch}: false.")
    return total


def normalized_lam(lam: float, weights, normalize: bool) -> float:
    """λ, divided by Σ wt when `normalize` (mergekit's divisor, left at 1 when |Σ wt| < 1e-8)."""
    if not normalize:
        return float(lam)
    total = float(torch.tensor([float(w) for w in weights], dtype=torch.float32).sum())
    return float(lam) if abs(total) < 1e-8 else float(lam) / total
