"""Sparsifiers of a task vector τ: small pure functions, one job each (METHODS.md, task-vector family).

- `keep_count(n, keep)`: how many of n entries a keep fraction keeps (mergekit's rule: ⌊keep·n⌋, at least 1
  when keep > 0).
- `topk_mask(scores, k)`: exactly the k largest scores (ties at the cut broken by position, first wins).
- `magnitude_mask` / `trim`: TIES trimming, the top-k keep fraction of τ by |τ|.
- `dare_mask` / `dare`: DARE, drop each entry with probability p, rescale survivors by 1/(1 − p).
- `breadcrumbs_mask` / `breadcrumbs`: zero the largest γ fraction and the smallest entries so that exactly
  ⌊keep·n⌋ survive; no rescale.
- `threshold_mask`: entries whose score reaches a threshold (global-scope trimming uses it with a threshold
  computed over the whole task vector).
"""
from __future__ import annotations

import hashlib
import math

import torch

from forgetlab.core.errors import ParameterError


def keep_count(n: int, keep: float) -> int:
    """Entries kept out of `n` for a keep fraction: 0 if keep ≤ 0, n if keep ≥ 1, else max(1, ⌊keep·n⌋)."""
    if n <= 0 or keep <= 0:
        return 0
    if keep >= 1:
        return n
    return max(1, int(keep * n))


def kth_largest_value(values: torch.Tensor, k: int) -> torch.Tensor:
    """Exact k-th largest entry of a flat float tensor (1 ≤ k ≤ n), as a 0-d tensor.

    Large tensors avoid a full selection: a strided sample of ~65k entries brackets the target rank with a
    margin of 4/√(sample), the bracket is checked by counting (the k-th largest lies in [lo, hi] iff
    #(> hi) < k ≤ #(≥ lo)), and only the entries inside it go to torch.kthvalue. When the check fails (odd
    distributions, many ties) the whole tensor goes to torch.kthvalue. Either way the result is exact.
    """
    n = values.numel()
    if n <= (1 << 20):
        return torch.kthvalue(values, n - k + 1).values
    step = max(1, n // 65536)
    sample = values[::step]
    s = sample.numel()
    q = 1.0 - k / n
    margin = 4.0 / math.sqrt(s)
    ordered = torch.sort(sample).values
    lo = ordered[max(0, int(math.floor((q - margin) * (s - 1))))]
    hi = ordered[min(s - 1, int(math.ceil((q + margin) * (s - 1))))]
    above = int(torch.count_nonzero(values > hi))
    inside = values[(values >= lo) & (values <= hi)]
    rank = k - above
    if 0 < rank <= inside.numel():
        return torch.kthvalue(inside, inside.numel() - rank + 1).values
    return torch.kthvalue(values, n - k + 1).values


def topk_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask (shape of `scores`) selecting exactly the `k` largest scores.

    The cut is the exact k-th largest value (`kth_largest_value`); entries at or above it are kept, and if
    several entries equal the cut, they are kept in storage order until k are selected, so the result is
    deterministic and nested in k.
    """
    flat = scores.reshape(-1)
    n = flat.numel()
    if k <= 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    if k >= n:
        return torch.ones_like(scores, dtype=torch.bool)
    work = flat if flat.dtype in (torch.float32, torch.float64) else flat.float()
    cut = kth_largest_value(work, k)
    mask = work >= cut
    if int(torch.count_nonzero(mask)) != k:  # ties at the cut: keep the first ones in storage order
        mask = work > cut
        missing = k - int(torch.count_nonzero(mask))
        idx = (work == cut).nonzero().reshape(-1)[:missing]
        mask[idx] = True
    return mask.reshape(scores.shape)


def threshold_mask(scores: torch.Tensor, threshold: float | None) -> torch.Tensor:
    """Entries with score ≥ `threshold`; `None` means keep nothing (a keep count of 0)."""
    if threshold is None:
        return torch.zeros_like(scores, dtype=torch.bool)
    return scores >= threshold


def magnitude_mask(tau: torch.Tensor, keep: float) -> torch.Tensor:
    """TIES trim mask: the top-k entries of |τ| with k = keep_count(numel, keep)."""
    return topk_mask(tau.abs(), keep_count(tau.numel(), keep))


def trim(tau: torch.Tensor, keep: float) -> torch.Tensor:
    """TIES trim: τ with all but its top keep fraction of entries (by |τ|) set to 0; no rescale."""
    if keep >= 1:
        return tau
    return tau * magnitude_mask(tau, keep)


def tensor_generator(seed: int, name: str, index: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator for one (tensor, model) pair, seeded from sha256(seed, index, name).

    Seeding per tensor makes a DARE mask independent of the order in which tensors are visited, so a
    streamed merge and an in-memory merge draw the same masks; the same seed gives the same masks.
    """
    digest = hashlib.sha256(f"{int(seed)}\x00{int(index)}\x00{name}".encode("utf-8")).digest()
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return gen


def dare_mask(shape: torch.Size | tuple[int, ...], drop: float, generator: torch.Generator,
              device: str | torch.device = "cpu") -> torch.Tensor:
    """DARE keep mask: each entry survives independently with probability 1 − drop (u ≥ drop, u ~ U[0, 1))."""
    if drop <= 0:
        return torch.ones(shape, dtype=torch.bool, device=device)
    u = torch.rand(shape, generator=generator, device=device)
    return u >= drop


def dare(tau: torch.Tensor, drop: float, generator: torch.Generator) -> torch.Tensor:
    """DARE: drop each entry of τ with probability p = `drop`, rescale survivors by 1/(1 − p).

    drop = 0 returns τ; drop = 1 returns zeros. The mask comes from `generator` (see `tensor_generator`).
    """
    if not 0.0 <= drop <= 1.0:
        raise ParameterError(f"drop must lie in [0, 1]; got {drop}.")
    if drop <= 0:
        return tau
    if drop >= 1:
        return torch.zeros_like(tau)
    mask = dare_mask(tau.shape, drop, generator, device=tau.device)
    return tau * mask / (1.0 - drop)


def breadcrumbs_counts(n: int, keep: float, gamma: float) -> tuple[int, int]:
    """(n_top, n_keep) for Breadcrumbs: n_top = ⌊γ·n⌋ largest entries removed, n_keep = ⌊keep·n⌋ kept.

    If keep + γ would exceed 1 after flooring, fewer large entries are removed (mergekit's rule).
    """
    n_keep = int(keep * n) if keep < 1 else n
    n_top = int(gamma * n)
    n_top = min(n_top, n - n_keep)
    return n_top, n_keep


def breadcrumbs_mask(tau: torch.Tensor, keep: float, gamma: float) -> torch.Tensor:
    """Breadcrumbs mask: entries ranked n_top+1 … n_top+n_keep by |τ| (largest γ fraction and the smallest
    entries removed, exactly ⌊keep·n⌋ survive)."""
    n = tau.numel()
    if keep >= 1:
        return torch.ones_like(tau, dtype=torch.bool)
    n_top, n_keep = breadcrumbs_counts(n, keep, gamma)
    mag = tau.abs()
    outer = topk_mask(mag, n_top + n_keep)
    if n_top > 0:
        outer &= ~topk_mask(mag, n_top)
    return outer


def breadcrumbs(tau: torch.Tensor, keep: float = 0.1, gamma: float = 0.01) -> torch.Tensor:
    """Breadcrumbs sparsification of τ (no rescale): τ ⊙ breadcrumbs_mask(τ, keep, γ)."""
    if keep + gamma > 1 + 1e-12:
        raise ParameterError(f"Breadcrumbs needs keep + gamma ≤ 1; got keep={keep}, gamma={gamma}.")
    if keep >= 1:
        return tau
    return tau * breadcrumbs_mask(tau, keep, gamma)
