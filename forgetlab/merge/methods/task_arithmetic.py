"""Task arithmetic (docs/methods.md#task_arithmetic): θ = θ0 + λ·Σt wt·τt, or with mergekit's `normalize`
θ = θ0 + λ·Σt wt·τt / Σt wt."""
from __future__ import annotations

import torch

from forgetlab.merge.methods.common import add_scaled, lam_param, normalize_param, normalized_lam, weights_param
from forgetlab.merge.mergekit_params import gta_params
from forgetlab.merge.registry import MergekitSpec, TensorJob, WorkingMemory, method


@method("task_arithmetic", "Task arithmetic: add the weighted sum of task vectors to the base.",
        (lam_param(), weights_param(), normalize_param(False)),
        mergekit=MergekitSpec("task_arithmetic", params=gta_params(normalize=False, rescale=False, density=None)),
        formula="θ = θ0 + λ·Σ wt·τt (/ Σ wt with normalize)", memory=WorkingMemory((0.4, 0)),
        title="task arithmetic", paper="Ilharco et al., Editing models with task arithmetic (ICLR 2023)")
def _task_arithmetic(job: TensorJob) -> torch.Tensor:
    p = job.params
    return add_scaled(job, job.take_taus(), normalized_lam(p["lam"], p["weights"], p["normalize"]))
