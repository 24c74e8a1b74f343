"""Isotropic merging (docs/methods.md#iso_c; Marczak et al., arXiv 2502.04959).

- ``iso_c``: per 2-D weight, M = Σt τt = U·S·Vᵀ is replaced by σ̄·U·Vᵀ, σ̄ the mean of all min(m, n) singular
  values (a flat spectrum: every direction of the common subspace scaled alike); θ = θ0 + α·that.
- ``iso_cts``: a common subspace (the top k_c left singular vectors of Σt τt, k_c ≈ common·min(m, n)) plus, for
  each task, the top directions of τt with the common subspace projected out, (min(m, n) − k_c)/T of them;
  the concatenated U and V are orthogonalised (polar factors) and the spectrum flattened to its mean.
  Sizes as the authors' code (fusion-bench's iso_cts): k_c = int(min·common), the task-specific total rounded
  to a multiple of T.
Other tensors: θ0 + α·Σt τt.

σ̄ is the mean of the singular values the formula picks, zeros included; a direction whose singular value is
(numerically) zero is arbitrary and gets no σ̄ of its own (`spectral.rank_tolerance`): a low-rank sum, a τt inside
the common subspace, identical or collinear task vectors merge inside the span of the τt (on full-rank task
vectors nothing changes: fusion-bench's results)."""
from __future__ import annotations

from typing import Sequence

import torch

from forgetlab.merge.methods.common import LAM_RANGE, UNIT
from forgetlab.merge.methods.spectral import is_matrix, kept_rank, polar
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, method


def iso_c(taus: Sequence[torch.Tensor]) -> torch.Tensor:
    """σ̄·U·Vᵀ of M = Σt τt (float32)."""
    m = taus[0].to(torch.float32).clone()
    for tau in taus[1:]:
        m.add_(tau)
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    r = kept_rank(s, m.shape)
    return s.mean() * (u[:, :r] @ vh[:r])


def iso_cts_sizes(r: int, n_tasks: int, common: float) -> tuple[int, int]:
    """(k_c, per-task directions) for rank r = min(m, n): k_c = int(r·common), then the task-specific total
    round((r − k_c)/T)·T and k_c = r − that total (clamped to [0, r])."""
    kc = int(r * float(common))
    total = round((r - kc) / n_tasks) * n_tasks
    total = min(max(total, 0), r)
    return r - total, total // n_tasks


def iso_cts(taus: Sequence[torch.Tensor], common: float) -> torch.Tensor:
    """The Iso-CTS merged task vector of 2-D task vectors (module docstring)."""
    taus = [t.to(torch.float32) for t in taus]
    total = taus[0].clone()
    for tau in taus[1:]:
        total.add_(tau)
    r = min(total.shape)
    kc, per = iso_cts_sizes(r, len(taus), common)
    u, s, vh = torch.linalg.svd(total, full_matrices=False)
    sc = s[:kc]
    kc = min(kc, kept_rank(s, total.shape))        # σ̄ counts every value; only nonzero ones bring a direction
    uc, vhc = u[:, :kc], vh[:kc]
    us, ss, vhs = [], [], []
    for tau in taus:
        if per == 0:
            break
        ts = tau - uc @ (uc.T @ tau)
        ut, st, vht = torch.linalg.svd(ts, full_matrices=False)
        k = min(per, kept_rank(st, ts.shape, scale=float(tau.norm())))   # what is left of τt may be ~0
        us.append(ut[:, :k])
        ss.append(st[:per])
        vhs.append(vht[:k])
    u_all = torch.cat(us + [uc], dim=1)
    s_all = torch.cat(ss + [sc])
    vh_all = torch.cat(vhs + [vhc], dim=0)
    if not u_all.shape[1]:                          # every τt is zero
        return torch.zeros(total.shape, dtype=torch.float32, device=total.device)
    return s_all.mean() * (polar(u_all) @ polar(vh_all))


def _other(job: TensorJob, alpha: float) -> torch.Tensor:
    out = job.base
    for tau in job.take_taus():
        out.add_(tau, alpha=alpha)
    return out


@method("iso_c", "Iso-C: flatten the spectrum of the summed task vectors (isotropic merging in the common subspace).",
        (ParamSpec("alpha", "float", 1.0, "Scaling α (θ = θ0 + α·σ̄·U·Vᵀ); fusion-bench's default 1.", LAM_RANGE),),
        formula="θ = θ0 + α·σ̄·U·Vᵀ with Σt τt = U·S·Vᵀ", memory=WorkingMemory((0.6, 0)),
        title="Iso-C", paper="Marczak et al., No task left behind (arXiv 2502.04959)")
def _iso_c(job: TensorJob) -> torch.Tensor:
    alpha = float(job.params["alpha"])
    if is_matrix(job):
        return job.base.add_(iso_c(job.take_taus()), alpha=alpha)
    return _other(job, alpha)


@method("iso_cts", "Iso-CTS: isotropic merging in the common and task-specific subspaces.",
        (ParamSpec("alpha", "float", 1.0, "Scaling α of the merged task vector; fusion-bench's default 1.",
                   LAM_RANGE),
         ParamSpec("common", "float", 0.8, "Share of the rank given to the common subspace of Σt τt "
                   "(fusion-bench's default 0.8).", UNIT)),
        formula="θ = θ0 + α·σ̄·U⊥·V⊥ᵀ over the common + task-specific directions",
        memory=WorkingMemory(fast=(0.9, 0), reference=(0.1, 0.4)),
        title="Iso-CTS", paper="Marczak et al., No task left behind (arXiv 2502.04959)")
def _iso_cts(job: TensorJob) -> torch.Tensor:
    alpha = float(job.params["alpha"])
    if is_matrix(job):
        return job.base.add_(iso_cts(job.take_taus(), job.params["common"]), alpha=alpha)
    return _other(job, alpha)
