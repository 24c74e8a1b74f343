"""KnOTS, ``knots`` (docs/methods.md#knots; Stoica et al., arXiv 2410.19735): merge LoRA adapters in a shared
basis. Per weight that the adapters change, the task updates ΔWt (m×n, the adapters' (α/r)·B·A) are concatenated,
[ΔW1 … ΔWT] = U·S·[V1ᵀ … VTᵀ] (thin SVD, components above the numerical rank tolerance), so every task is
ΔWt = U·S·Vtᵀ with its own coefficients Vtᵀ in the shared basis U·S. The chosen merge (`ties`, `dare_ties`,
`task_arithmetic`, with its parameters) combines the Vtᵀ as task vectors from zero, and θ = θ0 + U·S·merged.
With task_arithmetic this is exactly θ0 + λ·Σt ΔWt. Full fine-tunes are refused."""
from __future__ import annotations

from typing import Sequence

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.methods.common import UNIT, lam_param, seed_param
from forgetlab.merge.methods.dare import dare
from forgetlab.merge.methods.spectral import kept_rank
from forgetlab.merge.methods.ties import ties_combine, trim
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, method, tensor_generator

KNOTS_MERGES = ("ties", "dare_ties", "task_arithmetic")


def aligned(deltas: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(U·S, [V1ᵀ … VTᵀ]) of the concatenated updates, components above the rank tolerance
    S[0]·max(m, T·n)·ε(float32) (numpy's matrix_rank rule)."""
    n = deltas[0].shape[1]
    u, s, vh = torch.linalg.svd(torch.cat([d.to(torch.float32) for d in deltas], dim=1), full_matrices=False)
    r = kept_rank(s, (u.shape[0], vh.shape[1]))
    return u[:, :r] * s[:r], list(torch.split(vh[:r], n, dim=1))


def knots_merge(deltas: Sequence[torch.Tensor], how: str, params: dict, name: str = "") -> torch.Tensor:
    """The merged update U·S·merge(V1ᵀ … VTᵀ) of 2-D updates ΔWt (module docstring)."""
    if all(not bool(d.any()) for d in deltas):
        return torch.zeros_like(deltas[0], dtype=torch.float32)
    us, vs = aligned(deltas)
    lam = float(params["lam"])
    if how == "task_arithmetic":
        merged = torch.stack(vs).sum(dim=0)
    elif how == "ties":
        merged = ties_combine([trim(v, params["keep"]) for v in vs])
    else:
        gens = [tensor_generator(int(params["seed"]), name, i, v.device) for i, v in enumerate(vs)]
        merged = ties_combine([dare(v, params["drop"], g) for v, g in zip(vs, gens)])
    return lam * (us @ merged)


@method("knots", "KnOTS: align LoRA updates in one SVD basis, then merge their coefficients (TIES, DARE-TIES or TA).",
        (ParamSpec("method", "str", "ties", "The merge applied to the per-task coefficients in the shared basis.",
                   choices=KNOTS_MERGES),
         ParamSpec("keep", "float", 0.2, "ties: fraction of each task's coefficients kept (top |v|).", UNIT),
         ParamSpec("drop", "float", 0.9, "dare_ties: probability of dropping each coefficient.", UNIT),
         lam_param(), seed_param()),
        formula="θ = θ0 + λ·U·S·merge(Vtᵀ), [ΔW1 … ΔWT] = U·S·[V1ᵀ … VTᵀ]", memory=WorkingMemory((0.1, 0)),
        title="KnOTS", paper="Stoica et al., Model merging with SVD to tie the KnOTS (arXiv 2410.19735)")
def _knots(job: TensorJob) -> torch.Tensor:
    n = len(job.finetuned)
    if not all(job.is_adapter(i) for i in range(n)):
        raise ParameterError(
            "knots merges LoRA adapters (PEFT folders): it aligns their low-rank updates in one SVD basis, and a "
            "full fine-tune has no adapter update to align. Merge full fine-tunes with tsv, iso_c or ties instead.")
    deltas = job.take_taus()
    if job.base.dim() != 2:
        if any(bool(d.any()) for d in deltas):
            raise ParameterError(f"knots: adapter update of {job.name} is not 2-D; only LoRA weight matrices merge.")
        return job.base
    return job.base.add_(knots_merge(deltas, job.params["method"], job.params, job.name))
