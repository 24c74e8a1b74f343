"""TSV-Merge, ``tsv`` (docs/methods.md#tsv; Gargiulo et al., arXiv 2412.00081): per 2-D weight, the top
k = max(1, ⌊keep·min(m, n)⌋) singular triplets of each task vector τt are concatenated over the tasks; the
concatenated U and V are replaced by their orthogonal polar factors (decorrelating the tasks' singular
vectors), and merged = U⊥·diag(S)·V⊥ᵀ; θ = θ0 + α·merged. Other tensors: θ0 + α·Σt τt (the paper defaults
to task arithmetic there). keep = 0 (the default) means 1/T, the paper's choice. Triplets of zero singular value
(a τt of rank below k) are left out, and the polar factors are taken on the stacks' column spaces
(`spectral.polar`): identical or collinear task vectors then merge inside their span."""
from __future__ import annotations

from typing import Sequence

import torch

from forgetlab.merge.methods.common import LAM_RANGE, UNIT
from forgetlab.merge.methods.spectral import is_matrix, kept_rank, polar, rank_count, refuse_adapters
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, method


def resolved_keep(keep: float, n_tasks: int) -> float:
    """keep = 0 stands for 1/T."""
    return 1.0 / max(1, n_tasks) if float(keep) <= 0 else float(keep)


def tsv_merge(taus: Sequence[torch.Tensor], keep: float) -> torch.Tensor:
    """The TSV-M merged task vector of 2-D task vectors (module docstring), float32 on their device."""
    us, ss, vhs = [], [], []
    for tau in taus:
        u, s, vh = torch.linalg.svd(tau.to(torch.float32), full_matrices=False)
        k = min(rank_count(tau.shape, keep), kept_rank(s, tau.shape))   # no arbitrary zero-σ directions
        us.append(u[:, :k])
        ss.append(s[:k])
        vhs.append(vh[:k])
    u, s, vh = torch.cat(us, dim=1), torch.cat(ss), torch.cat(vhs, dim=0)
    if not s.numel():                                                    # every τt is zero
        return torch.zeros(taus[0].shape, dtype=torch.float32, device=taus[0].device)
    return (polar(u) * s) @ polar(vh)


def _check(params: dict, n: int) -> None:
    if n:
        params["keep"] = resolved_keep(params["keep"], n)


@method("tsv", "TSV-Merge: top singular vectors of each task vector, decorrelated by orthogonal polar factors.",
        (ParamSpec("alpha", "float", 1.0, "Scaling α of the merged task vector (θ = θ0 + α·merged).", LAM_RANGE),
         ParamSpec("keep", "float", 0.0, "Fraction of each τt's rank kept per 2-D weight: k = max(1, "
                   "⌊keep·min(m, n)⌋); 0 means 1/T (the paper's choice).", UNIT)),
        check=_check, formula="θ = θ0 + α·U⊥·diag(S)·V⊥ᵀ of the concatenated top-k SVDs of τt",
        memory=WorkingMemory((0.7, 0)),
        title="TSV-Merge", paper="Gargiulo et al., Task singular vectors (arXiv 2412.00081)")
def _tsv(job: TensorJob) -> torch.Tensor:
    refuse_adapters(job, "tsv")
    alpha = float(job.params["alpha"])
    taus = job.take_taus()
    if is_matrix(job):
        merged = tsv_merge(taus, resolved_keep(job.params["keep"], len(taus)))
        return job.base.add_(merged, alpha=alpha)
    out = job.base
    for tau in taus:
        out.add_(tau, alpha=alpha)
    return out
