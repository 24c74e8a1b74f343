"""What the spectral merge families share (tsv, iso_c / iso_cts, cart, knots): which tensors count as "2-D"
weights (every 2-D weight except the embeddings and the output head), the orthogonal polar factor, and rank
truncation. SVDs run per tensor on the job's device in float32 (docs/methods.md#spectral-merges).

Directions of (numerically) zero singular value are arbitrary: an SVD returns some orthonormal completion, which
changes with the library and the device. Where a method would give such a direction weight of its own — the polar
factor of a rank-deficient stack (identical or collinear task vectors: `models: [ft1, ft1_copy]`), a flat spectrum
(iso_c, iso_cts) over a low-rank sum — it is dropped (`rank_tolerance`), so that the merged update lies in the span
of the task vectors; on task vectors of full rank nothing changes (the papers' formulas, fusion-bench's results)."""
from __future__ import annotations

import math
import re

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.registry import TensorJob

# token / position embeddings and the output head: 2-D, but rows are vocabulary entries, not a linear map that
# the spectral methods mean; they take the method's rule for "other tensors"
_EMBEDDING_RE = re.compile(r"(?:^|\.)(?:embed_tokens|embed_positions|embeddings?|word_embeddings|position_embeddings|"
                           r"token_type_embeddings|wte|wpe|shared|lm_head|embed_out|output_embeddings)(?:\.|$)")


def is_embedding(name: str) -> bool:
    """Whether tensor `name` belongs to an input embedding or the output head (by its module name)."""
    return bool(_EMBEDDING_RE.search(name))


def is_matrix(job: TensorJob) -> bool:
    """Whether the job's tensor is one of the "2-D" weights of the spectral methods: 2-D and not an embedding
    or the output head."""
    return is_weight_matrix(job.name, job.base)


def is_weight_matrix(name: str, tensor: torch.Tensor) -> bool:
    """`is_matrix` for a tensor and its name outside a job (a global first pass): 2-D and not an embedding or the
    output head."""
    return tensor.dim() == 2 and not is_embedding(name)


def rank_tolerance(s: torch.Tensor, shape, scale: float | None = None) -> float:
    """The singular value at or below which a direction counts as zero: `scale`·max(m, n)·ε(float32), `scale`
    the largest singular value s[0] unless given (numpy's matrix_rank rule; 0 for an empty or zero spectrum)."""
    top = float(s[0]) if scale is None and s.numel() else float(scale or 0.0)
    return top * max(shape) * torch.finfo(torch.float32).eps


def kept_rank(s: torch.Tensor, shape, scale: float | None = None) -> int:
    """How many of the singular values `s` (descending) lie above `rank_tolerance`."""
    return int((s > rank_tolerance(s, shape, scale)).sum())


def polar(a: torch.Tensor) -> torch.Tensor:
    """The orthogonal polar factor of a: with a = P·Σ·Qᵀ (thin SVD), P·Qᵀ. For a rank-deficient a (stacked singular
    vectors of identical or collinear task vectors) the factor is not unique; this one is the partial isometry on
    a's column space, P_r·Q_rᵀ over the r singular values above `rank_tolerance`, so that directions of zero
    singular value contribute nothing. The same as P·Qᵀ when a has full rank."""
    p, s, qh = torch.linalg.svd(a, full_matrices=False)
    r = kept_rank(s, a.shape)
    return p[:, :r] @ qh[:r]


def rank_count(shape, fraction: float) -> int:
    """k = max(1, ⌊fraction·min(m, n)⌋) singular triplets kept of an m×n matrix."""
    return max(1, int(math.floor(min(shape) * float(fraction))))


def low_rank(a: torch.Tensor, k: int) -> torch.Tensor:
    """The best rank-k approximation of a (its top k singular triplets)."""
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    k = min(int(k), s.numel())
    return (u[:, :k] * s[:k]) @ vh[:k]


def refuse_adapters(job: TensorJob, method: str) -> None:
    """Refuse LoRA adapters: their task vector is low-rank by construction, so a method whose point is the
    spectrum of a full fine-tune's τ has nothing of its own to act on."""
    if any(job.is_adapter(i) for i in range(len(job.finetuned))):
        raise ParameterError(
            f"{method} takes full fine-tunes: an adapter's task vector ΔW = (α/r)·B·A is rank r by construction, "
            f"so {method}'s truncation of each τt's spectrum is no choice at all. Merge LoRA adapters with "
            "`knots` (built for them), or merge the adapters into full checkpoints first.")
