"""Task arithmetic (docs/methods.md#task_arithmetic): θ = θ0 + λ·Σt wt·τt."""
from __future__ import annotations

import torch

from forgetlab.merge.methods.common import add_scaled, lam_param, weights_param
from forgetlab.merge.registry import TensorJob, method


@method("task_arithmetic", "Task arithmetic: add the weighted sum of task vectors to the base.",
        (lam_param(), weights_param()),
        mergekit="task_arithmetic",
        formula="θ = θ0 + λ·Σ wt·τt")
def _task_arithmetic(job: TensorJob) -> torch.Tensor:
    return add_scaled(job, job.take_taus(), job.params["lam"])
