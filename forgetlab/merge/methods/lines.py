"""LiNeS, ``lines`` (docs/methods.md#lines; Wang et al., arXiv 2410.17146): layer-increasing network scaling of
the merged task vector, θ = θ0 + λ(ℓ)·Σt wt·τt with λ(ℓ) = α + β·(ℓ − 1)/(L − 1) for the 1-based decoder layer ℓ
of L; the embeddings count as ℓ = 1 and the final norm and the output head as ℓ = L (the authors' code scales
everything outside the residual blocks by α; the issue puts the head with the last layer). Shallow layers stay
close to θ0 (general features), deep ones take more of the task vectors."""
from __future__ import annotations

import torch

from forgetlab.merge.layers import FIRST, LAST
from forgetlab.merge.methods.common import LAM_RANGE, weights_param
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, method


def lines_scale(layer, num_layers: int, alpha: float, beta: float) -> float:
    """λ(ℓ) = α + β·(ℓ − 1)/(L − 1) for a layer position (0-based int, FIRST or LAST; `forgetlab.merge.layers`);
    with L = 1 every tensor gets α."""
    if num_layers <= 1:
        return float(alpha)
    if layer is None or layer == FIRST:
        depth = 0.0
    elif layer == LAST:
        depth = 1.0
    else:
        depth = min(max(int(layer), 0), num_layers - 1) / (num_layers - 1)
    return float(alpha) + float(beta) * depth


@method("lines", "LiNeS: task arithmetic scaled linearly with depth, from α at the first layer to α + β at the last.",
        (ParamSpec("alpha", "float", 0.5, "λ of the first layer and the embeddings. The paper's multi-task setting "
                   "uses α = 1/T for a sum of T task vectors (0.5 for two).", LAM_RANGE),
         ParamSpec("beta", "float", 0.5, "Increase of λ from the first to the last layer (the paper tunes β in "
                   "(0, 1]).", LAM_RANGE),
         weights_param()),
        needs_layers=True, formula="θ = θ0 + (α + β·(ℓ − 1)/(L − 1))·Σt wt·τt",
        extra={"search_scalars": ("alpha", "beta")}, memory=WorkingMemory((0.4, 0)),
        title="LiNeS", paper="Wang et al., LiNeS (arXiv 2410.17146)")
def _lines(job: TensorJob) -> torch.Tensor:
    lam = lines_scale(job.layer, job.num_layers, job.params["alpha"], job.params["beta"])
    out = job.base
    for tau, w in zip(job.take_taus(), job.params["weights"]):
        out.add_(tau, alpha=lam * float(w))
    return out
