"""OPCM, orthogonal projection continual merging, ``opcm`` (docs/methods.md#opcm; Tang et al., arXiv 2501.09522):
the models are merged one after the other in the recipe's order, each new task vector projected away from the
subspace the merged task vector already occupies, and the merged task vector rescaled to the mean norm of the
task vectors.

Per 2-D weight (`spectral.is_weight_matrix`), with the running sum U (U1 = τ1) and its SVD U = P·S·Qᵀ of rank r:
X = P_rᵀ·τt·Q_r; the projection removes P_r·X̃·Q_rᵀ from τt, X̃ holding X's diagonal and its top-left k×k block,
k the number of leading singular values whose cumulative share of Σ s stays ≤ alpha; then U ← U + that. Other
tensors: U ← U + τt. After the last model, θ = θ0 + (mean_t ‖τt‖ / ‖U‖)·U with the norms over the whole model
(one global first pass: `OPCMCollector`). That is fusion-bench 0.2.33's `OPCM` (the authors' code): its per-step
λt rescalings leave the projections unchanged (they depend on U's singular vectors only), so the result is the
last step's. One model gives θ1 itself.

Directions of zero singular value of U are arbitrary (`spectral`): the diagonal is zeroed only over the r nonzero
ones, so a tensor where U is still zero (a weight none of the earlier fine-tunes changed) takes τt whole; fusion-bench
zeroes τt's diagonal in whatever basis its SVD returns there."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from forgetlab.merge.methods.spectral import is_weight_matrix, kept_rank
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, method

ALPHA = 0.5  # fusion-bench's opcm.yaml / opcm_general.yaml


def split_rank(s: torch.Tensor, alpha: float) -> int:
    """k: how many of the singular values `s` (descending, nonzero) lead with a cumulative share of their sum at
    most `alpha` (fusion-bench's argmax of cumsum(s)/Σ s > alpha; alpha = 1 gives all of them)."""
    if not s.numel():
        return 0
    c = torch.cumsum(s.to(torch.float64), 0)
    return int((c / c[-1] <= float(alpha)).sum())


def opcm_project(merged: torch.Tensor, tau: torch.Tensor, alpha: float) -> torch.Tensor:
    """τ projected away from the 2-D merged task vector `merged` (module docstring): τ − P_r·X̃·Q_rᵀ. A new tensor."""
    p, s, qh = torch.linalg.svd(merged, full_matrices=False)
    r = kept_rank(s, merged.shape)
    if r == 0:
        return tau.clone()
    p, qh = p[:, :r], qh[:r]
    x = p.T @ tau @ qh.T
    k = split_rank(s[:r], alpha)
    removed = torch.diag_embed(torch.diagonal(x))
    removed[:k, :k] = x[:k, :k]
    return tau - p @ removed @ qh


def opcm_sum(name: str, taus: Sequence[torch.Tensor], alpha: float) -> torch.Tensor:
    """The running sum U of tensor `name` after the last task vector: τ1 plus each later τt projected away from U
    where the tensor is a 2-D weight, plus τt itself elsewhere. Written into `taus[0]` (owned by the caller)."""
    total = taus[0]
    matrix = is_weight_matrix(name, total)
    for tau in taus[1:]:
        total.add_(opcm_project(total, tau, alpha) if matrix else tau)
    return total


@dataclass(frozen=True)
class OPCMStats:
    """The global norms: ‖τt‖ of each model and ‖U‖ of the unscaled merged task vector, over every tensor."""

    task_norms: tuple[float, ...]
    merged_norm: float

    @property
    def scale(self) -> float:
        """mean_t ‖τt‖ / ‖U‖ (0 when U is zero: every task vector was zero)."""
        if self.merged_norm == 0:
            return 0.0
        return sum(self.task_norms) / len(self.task_norms) / self.merged_norm


class OPCMCollector:
    """One pass over every tensor: Σ ‖τt‖² per model and Σ ‖U‖² (U computed per tensor as the merge does)."""

    passes = 1

    def __init__(self, n_tasks: int, alpha: float):
        self.squares = [0.0] * n_tasks
        self.merged = 0.0
        self.alpha = alpha

    def add(self, pass_index, name, base, taus):
        """Add one tensor's ‖τt‖² and ‖U‖² (U built from a copy: the task vectors stay as given)."""
        for t, tau in enumerate(taus):
            self.squares[t] += float(torch.linalg.vector_norm(tau)) ** 2
        total = opcm_sum(name, [taus[0].clone(), *taus[1:]], self.alpha)
        self.merged += float(torch.linalg.vector_norm(total)) ** 2

    def end_pass(self, pass_index):
        """Nothing to do between passes (there is one)."""

    def result(self) -> OPCMStats:
        """The global norms, square roots of the sums."""
        return OPCMStats(tuple(math.sqrt(q) for q in self.squares), math.sqrt(self.merged))


@method("opcm", "OPCM: merge the models in order, each task vector projected away from the merged one's top "
                "singular directions.",
        (ParamSpec("alpha", "float", ALPHA, "Share of the merged task vector's spectrum (cumulative singular values) "
                   "whose block of directions each new task vector is cleared of, beside every (u_i, v_i) pair; "
                   "fusion-bench's default 0.5.", (0.0, 1.0)),),
        collector=lambda n, total, p: OPCMCollector(n, float(p["alpha"])),
        formula="U = τ1 + Σt≥2 P_U(τt) in order; θ = θ0 + (mean ‖τt‖ / ‖U‖)·U",
        memory=WorkingMemory((1.3, 0)),
        title="OPCM", paper="Tang et al., Merging models on the fly without retraining: a sequential approach to "
                            "scalable continual model merging (arXiv 2501.09522)")
def _opcm(job: TensorJob) -> torch.Tensor:
    if len(job.finetuned) == 1:                  # the first model is the merge (fusion-bench's starting point)
        return job.finetuned[0]
    total = opcm_sum(job.name, job.take_taus(), float(job.params["alpha"]))
    return job.base.add_(total, alpha=job.stats.scale)
