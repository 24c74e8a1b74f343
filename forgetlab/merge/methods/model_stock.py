"""Model Stock (docs/methods.md#model_stock), as mergekit 0.1.5 computes it: with task vectors τt = θt − θ0 of
N ≥ 2 fine-tuned models and cos θ the mean pairwise cosine between them (over the whole flattened tensor, or per
row with `filter_wise`), the merged weights lie on the line between the base and the models' average:
θ = t·θ̄ + (1 − t)·θ0 with t = N·cos θ / (1 + (N − 1)·cos θ) (t = 0 where the denominator vanishes)."""
from __future__ import annotations

import torch

from forgetlab.merge.registry import MergekitSpec, ParamSpec, TensorJob, WorkingMemory, method


def model_stock(base: torch.Tensor, finetuned: list[torch.Tensor], filter_wise: bool = False) -> torch.Tensor:
    """Model Stock of one tensor (mergekit's computation; pairwise norms products clamped at 1e-6)."""
    shape = base.shape
    if filter_wise:
        w0 = base.unsqueeze(0) if base.dim() == 1 else base
        ws = [w.unsqueeze(0) if base.dim() == 1 else w for w in finetuned]
    else:
        w0, ws = base.reshape(-1), [w.reshape(-1) for w in finetuned]
    offsets = [w - w0 for w in ws]
    norms = [torch.linalg.vector_norm(o, dim=-1) for o in offsets]
    cos = []
    for i, a in enumerate(offsets):
        for j in range(i + 1, len(offsets)):
            cos.append(((a * offsets[j]).sum(dim=-1) / (norms[i] * norms[j]).clamp(min=1e-6)).clamp(-1, 1))
    cos_theta = torch.stack(cos).mean(dim=0).unsqueeze(-1)
    n = len(ws)
    den = 1 + (n - 1) * cos_theta
    singular = den.abs() < 1e-6
    t = torch.where(singular, torch.zeros_like(cos_theta),
                    (n * cos_theta) / torch.where(singular, torch.ones_like(den), den))
    average = sum(ws) / n
    return (t * average + (1 - t) * w0).reshape(shape)


@method("model_stock", "Model Stock: move from the base towards the models' average by a ratio set by the "
        "angle between their task vectors.",
        (ParamSpec("filter_wise", "bool", False, "One ratio per row (output filter) instead of one per tensor."),),
        min_models=2, mergekit=MergekitSpec("model_stock"), in_place=False,
        extra={"models_hint": "Model Stock needs the base and at least two fine-tuned models (it measures the "
                              "angle between their task vectors)."},
        formula="θ = t·θ̄ + (1 − t)·θ0, t = N·cos θ / (1 + (N − 1)·cos θ)", memory=WorkingMemory((5.1, 1.0)),
        title="Model Stock", paper="Jang et al., Model Stock (ECCV 2024)")
def _model_stock(job: TensorJob) -> torch.Tensor:
    return model_stock(job.base, job.finetuned, job.params["filter_wise"])
