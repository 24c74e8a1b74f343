"""MagMax, ``magmax`` (docs/methods.md#magmax; Marczak et al., ECCV 2024, arXiv 2407.06322): per entry, the task-vector
entry of largest magnitude over the models, τ_sel[j] = τ_{t*(j)}[j] with t*(j) = argmax_t |τt[j]|, and
θ = θ0 + λ·τ_sel. Entries of equal magnitude go to the later model (the authors' `merge_max_abs` folds the models
in order with ≥, as fusion-bench 0.2.33 does), so the order of the models in the recipe only matters at ties.
Every floating-point tensor is merged alike (norms and embeddings included); integer buffers are the base's
(the engine copies them)."""
from __future__ import annotations

from typing import Sequence

import torch

from forgetlab.merge.methods.common import lam_param
from forgetlab.merge.registry import TensorJob, WorkingMemory, method


def magmax_select(taus: Sequence[torch.Tensor]) -> torch.Tensor:
    """τ_sel: per entry the τt of largest |τt|, a later τt winning ties; written into `taus[0]` (owned by the
    caller) and returned."""
    selected = taus[0]
    for tau in taus[1:]:
        torch.where(tau.abs() >= selected.abs(), tau, selected, out=selected)
    return selected


@method("magmax", "MagMax: per entry, keep the task-vector entry of largest magnitude over the models.",
        (lam_param(0.5),),
        formula="θ = θ0 + λ·τ_sel, τ_sel[j] = τt[j] with t = argmax_t |τt[j]| (later wins ties)",
        memory=WorkingMemory((3.0, 0)),
        title="MagMax", paper="Marczak et al., MagMax: leveraging model merging for seamless continual learning "
                              "(ECCV 2024)")
def _magmax(job: TensorJob) -> torch.Tensor:
    return job.base.add_(magmax_select(job.take_taus()), alpha=float(job.params["lam"]))
