"""What the method families share: the parameters every task-vector method names the same way (`lam`,
`weights`, `seed`, `scope`) and adding scaled parts of task vectors to the base in place."""
from __future__ import annotations

import torch

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
