"""Dataless Localize-and-Stitch, ``localize_stitch`` (docs/methods.md#localize_stitch; He et al., arXiv
2408.13656): localise each task in the top `keep` fraction of its task vector by |τt| (one threshold over the
whole model with scope="global", the authors' choice; or per tensor), then stitch: where several tasks claim
an entry their task vectors are averaged, θ = θ0 + Σt mt⊙τt / max(1, Σt mt). Default keep 0.05 (the authors'
dataless script, `sparsity = 5e-2`). The global thresholds come from a streaming first pass: the exact k-th
largest |τt| per task (`TiesGlobalCollector`)."""
from __future__ import annotations

from typing import Sequence

import torch

from forgetlab.merge.methods.common import UNIT, scope_param
from forgetlab.merge.methods.ties import TiesGlobalCollector, magnitude_mask
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, method
from forgetlab.merge.select import threshold_mask


def stitch(base: torch.Tensor, taus: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """θ0 + Σt mt⊙τt / max(1, Σt mt), written into `base`."""
    num = torch.zeros_like(base)
    count = torch.zeros_like(base)
    for tau, m in zip(taus, masks):
        num.add_(tau * m)
        count.add_(m.to(base.dtype))
    return base.add_(num.div_(count.clamp_min_(1)))


@method("localize_stitch", "Localize-and-Stitch (dataless): keep each task's largest entries, average where they overlap.",
        (ParamSpec("keep", "float", 0.05, "Fraction of each task vector's entries localised (top |τt|); the "
                   "authors' dataless default 0.05.", UNIT),
         scope_param("global")),
        collector=lambda n, total, p: TiesGlobalCollector(n, total, p["keep"]),
        global_when=lambda p: p.get("scope") == "global",
        formula="θ = θ0 + Σt mt⊙τt / max(1, Σt mt), mt = top-keep |τt|",
        memory=WorkingMemory(fast=(5.4, 0), reference=(4.5, 0.4)),
        title="Localize-and-Stitch", paper="He et al., Localize-and-Stitch (arXiv 2408.13656)")
def _localize_stitch(job: TensorJob) -> torch.Tensor:
    taus = job.take_taus()
    if job.params["scope"] == "global":
        masks = [threshold_mask(tau.abs(), thr) for tau, thr in zip(taus, job.stats)]
    else:
        masks = [magnitude_mask(tau, job.params["keep"]) for tau in taus]
    return stitch(job.base, taus, masks)
