"""MoFO, the momentum-filtered optimizer (docs/methods.md#mofo; seed: mofo-rebuttal.txt).

Adam(W) in which, in every parameter tensor (its "partition", PyTorch's default partitioning: q, k, v, o,
each MLP matrix, the embeddings… are separate tensors), only the entries whose first moment |m_t| is among
the top `fraction` of that tensor are moved this step:

    m_t = β1·m_{t−1} + (1 − β1)·g_t            (every entry)
    v_t = β2·v_{t−1} + (1 − β2)·g_t²           (every entry)
    θ_t = θ_{t−1}·(1 − lr·λ) − lr · FLT(m_t) ⊙ (m_t / (1 − β1^t)) / (√(v_t / (1 − β2^t)) + ε)

where FLT(m_t) is the 0/1 mask of the ⌈fraction·n⌉ entries of largest |m_t| in the tensor (n its size).
Biases and the parameters of normalisation layers are not filtered (full Adam step). Which ones they are is
decided by module type, not by name (`unfiltered_parameters`): GPT-2's LayerNorms are called ln_1, ln_2 and
ln_f, whose names lack "norm".

Weight decay: decoupled as in AdamW and applied to **every** entry, updated or not. This follows the seed,
whose MoFO-for-Lion rule writes the decay term outside the filter:
θ_t = θ_{t−1} − η_t·(sign(c_t ⊙ FLT(m_{t−1})) + λ·θ_{t−1}). With fraction = 1 MoFO is exactly AdamW.

Options of the same optimizer (MoFO's ablations; docs/methods.md#mofo-filters, #mofo-lion, #head-partitions):

- `filter`, which entries of a partition move (the same count k in every case): "momentum" (MoFO: largest |m_t|),
  "gradient" (FLT(g): largest |g_t|), "mv" (FLT(m/√v): largest |m̂_t/(√v̂_t + ε)|, the Adam step itself), "gv"
  (FLT(g/√v): largest |g_t/(√v̂_t + ε)|) or "random" (random BCD: a fresh uniformly random k of the partition each
  step, drawn from a generator seeded with `seed`), m̂ and v̂ bias-corrected as in Adam's step;
- `base`: "adam" (above) or "lion" (MoFO-Lion: Lion's update, `forgetlab.train.lion`, on the filtered entries;
  its filter ranks |m_{t−1}|, the momentum before this step, as the MoFO authors write it, and |g_1| at the first
  step, where m_0 = 0 ranks nothing);
- `partitions`: tensor name → the blocks it is cut into, each filtered on its own (`head_partitions`: q, k, v
  and o of every attention head); a tensor not named is one partition (PyTorch's default).
"""
from __future__ import annotations

import math
from typing import Collection, Iterable, Mapping, Optional, Sequence

import torch

from forgetlab.core.anatomy import Anatomy
from forgetlab.core.errors import ParameterError
from forgetlab.merge.select import kth_largest
from forgetlab.train.lion import LION_BETAS, check_lion, lion_update_

FILTERS = ("momentum", "gradient", "mv", "gv", "random")
"""MoFO's filters (docs/methods.md#mofo-filters): which entries of a partition move; "momentum" is MoFO's own."""
BASES = ("adam", "lion")
"""The optimizers MoFO filters: Adam(W) (MoFO) and Lion (MoFO-Lion, docs/methods.md#mofo-lion)."""
ADAM_BETAS = (0.9, 0.999)
"""Adam's (β1, β2) when none are given."""
NEEDS_V = ("mv", "gv")
"""The filters that read Adam's second moment v (so not available with base "lion")."""

Block = tuple[int, int, int]
"""One partition of a tensor: (dim, start, stop), the indices [start, stop) along dimension dim."""

_NORM_TYPES = tuple(t for t in (torch.nn.LayerNorm, torch.nn.GroupNorm, getattr(torch.nn, "RMSNorm", None),
                                 torch.nn.modules.batchnorm._NormBase, torch.nn.LocalResponseNorm) if t is not None)


def is_norm_module(module: torch.nn.Module) -> bool:
    """A normalisation layer: torch's LayerNorm/GroupNorm/RMSNorm/BatchNorm/InstanceNorm, or a class whose
    name ends in "Norm" (transformers' LlamaRMSNorm, T5LayerNorm, Qwen2RMSNorm … are plain nn.Modules)."""
    return isinstance(module, _NORM_TYPES) or type(module).__name__.endswith("Norm")


def unfiltered_parameters(model: torch.nn.Module) -> set[str]:
    """Names (as in `model.named_parameters()`) of the parameters MoFO does not filter: every parameter of a
    normalisation layer (`is_norm_module`: weight and bias) and every parameter registered as a module's
    `bias`. Decided by module type, so GPT-2's ln_1/ln_2/ln_f count as norms although their names lack "norm"."""
    ids = set()
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if pname == "bias" or is_norm_module(module):
                ids.add(id(p))
    return {n for n, p in model.named_parameters() if id(p) in ids}


def top_fraction_mask(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """Boolean mask of the k = ⌈fraction·n⌉ entries of `scores` with the largest values (n = scores.numel());
    entries tied at the k-th largest value are taken in storage order until there are k.

    The cut is found with `forgetlab.merge.select.kth_largest` (an exact selection; on the CPU a numpy one
    that needs about one copy of the tensor, where torch.topk needs 4.6 of them), then compared in pieces.
    """
    n = scores.numel()
    k = min(n, max(1, math.ceil(fraction * n - 1e-9)))
    if k >= n:
        return torch.ones_like(scores, dtype=torch.bool)
    flat = scores.reshape(-1)
    work = flat if flat.dtype in (torch.float32, torch.float64) else flat.float()
    cut, _ = kth_largest(work.detach(), k)
    mask = work > cut
    missing = k - int(torch.count_nonzero(mask))
    for start in range(0, n, CHUNK):             # ties at the cut, in storage order, a piece at a time
        if missing <= 0:
            break
        piece = work[start:start + CHUNK] == cut
        idx = piece.nonzero().reshape(-1)[:missing]
        mask[start + idx] = True
        missing -= int(idx.numel())
    return mask.view_as(scores)


def head_partitions(model: torch.nn.Module) -> dict[str, list[Block]]:
    """Per-head partitions (docs/methods.md#head-partitions) of the model's attention weights, from its anatomy
    (`forgetlab.core.anatomy.Anatomy.head_slices`): tensor name → its blocks (dim, start, stop), in order. Llama:
    the rows of q_proj per query head, of k_proj and v_proj per key/value head (grouped-query attention: one
    block per kv head), the columns of o_proj per query head. GPT-2: the q, k and v columns of the fused c_attn per
    head (3 × heads blocks: its q, k and v are separate partitions even with one head) and the rows of attn.c_proj
    per head. Biases are not listed (MoFO gives them the full step); every other tensor stays one partition."""
    anatomy = Anatomy.from_model(model)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    found: dict[str, set[Block]] = {}
    for layer, head in anatomy.submodules("head"):
        for piece in anatomy.head_slices(layer, head):
            if piece.name in shapes and len(shapes[piece.name]) >= 2:
                found.setdefault(piece.name, set()).add((piece.dim, piece.start, piece.stop))
    return {name: sorted(blocks) for name, blocks in found.items()}


def check_blocks(name: str, shape: Sequence[int], blocks: Sequence[Block]) -> list[Block]:
    """The blocks of tensor `name`, checked to tile it: one dimension, sorted, no gap nor overlap, from 0 to the
    tensor's size along that dimension; a ParameterError naming the tensor otherwise."""
    blocks = sorted((int(d), int(a), int(b)) for d, a, b in blocks)
    dims = {d for d, _, _ in blocks}
    if len(dims) != 1 or not 0 <= next(iter(dims)) < len(shape):
        raise ParameterError(f"The partitions of {name} must cut one dimension of its shape {tuple(shape)}; got "
                             f"{blocks[:4]}. Give (dim, start, stop) blocks along a single dimension.")
    dim = dims.pop()
    edge, tiled = 0, True
    for _, start, stop in blocks:
        tiled = tiled and start == edge and stop > start
        edge = stop
    if not tiled or edge != shape[dim]:
        raise ParameterError(f"The partitions of {name} must cover dimension {dim} (size {shape[dim]}) from 0, "
                             f"without gaps or overlaps; got {blocks[:4]}{' …' if len(blocks) > 4 else ''}.")
    return blocks


def partition_mask(scores: torch.Tensor, fraction: float, blocks: Optional[Sequence[Block]] = None) -> torch.Tensor:
    """MoFO's FLT: the `top_fraction_mask` of `scores` taken in each partition on its own — each block
    (dim, start, stop) of `blocks`, or the whole tensor when `blocks` is None or empty."""
    if not blocks:
        return top_fraction_mask(scores, fraction)
    mask = torch.empty(scores.shape, dtype=torch.bool, device=scores.device)
    for dim, start, stop in blocks:
        piece = scores.narrow(dim, start, stop - start)
        mask.narrow(dim, start, stop - start).copy_(top_fraction_mask(piece.contiguous(), fraction))
    return mask


class MoFO(torch.optim.Optimizer):
    """Momentum-filtered Adam(W) (or Lion): per partition, only the top-`fraction` entries by the filter's score
    are updated (module docstring).

    `named_params` is the model itself (its trainable parameters are optimised; norms and biases found by
    module type, see `unfiltered_parameters`) or `(name, tensor)` pairs such as `model.named_parameters()`
    together with `unfiltered`, the names that get the full step (default for pairs: the 1-D tensors —
    biases and norm scales are the only 1-D parameters of the language models forgetlab loads; pass the model
    or `unfiltered=unfiltered_parameters(model)` to decide by module type). Defaults follow docs/methods.md:
    fraction 0.2, betas (0.9, 0.999) for Adam and (0.9, 0.99) for Lion, eps 1e-8, weight decay 0 (decoupled,
    applied to every entry as in AdamW), filter "momentum", base "adam", PyTorch's partitions, seed 0 (random
    BCD's generator). After a step, `state[p]["updated"]` holds how many entries of p were moved.
    """

    def __init__(
        self,
        named_params: torch.nn.Module | Iterable[tuple[str, torch.Tensor]],
        lr: float = 1e-3,
        betas: Optional[tuple[float, float]] = None,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        fraction: float = 0.2,
        unfiltered: Collection[str] | None = None,
        filter: str = "momentum",
        base: str = "adam",
        partitions: Optional[Mapping[str, Sequence[Block]]] = None,
        seed: int = 0,
    ):
        if isinstance(named_params, torch.nn.Module):
            if unfiltered is None:
                unfiltered = unfiltered_parameters(named_params)
            named_params = [(n, p) for n, p in named_params.named_parameters() if p.requires_grad]
        pairs = list(named_params)
        if not pairs:
            raise ParameterError("MoFO got no parameters; pass model.named_parameters().")
        for item in pairs:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise ParameterError(
                    "MoFO needs (name, parameter) pairs to know which tensors are biases or norms; "
                    "pass model.named_parameters(), not model.parameters()."
                )
        check_filter(filter, base)
        betas = tuple(betas) if betas is not None else (LION_BETAS if base == "lion" else ADAM_BETAS)
        check_lion(lr, betas, weight_decay)       # lr > 0, betas in [0, 1), weight decay ≥ 0: Adam's rules too
        if not eps > 0:
            raise ParameterError(f"eps must be positive; got {eps}.")
        if not (0.0 < float(fraction) <= 1.0):
            raise ParameterError(f"fraction must lie in (0, 1]; got {fraction}. MoFO's default is 0.2.")
        if isinstance(seed, bool) or int(seed) != seed or seed < 0:
            raise ParameterError(f"seed must be a whole number ≥ 0 (it seeds random BCD's draws); got {seed!r}.")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fraction=float(fraction))
        if unfiltered is None:
            unfiltered = {n for n, p in pairs if p.dim() <= 1}
        names = {n for n, _ in pairs}
        unknown = set(unfiltered) - names
        if unknown:
            raise ParameterError(f"unfiltered names {sorted(unknown)[:3]} are not among the parameters given "
                                 "to MoFO; pass names from the same model.named_parameters().")
        partitions = dict(partitions or {})
        unknown = set(partitions) - names
        if unknown:
            raise ParameterError(f"partitions name {sorted(unknown)[:3]}, which are not among the parameters given "
                                 "to MoFO; pass names from the same model.named_parameters().")
        shapes = dict((n, p.shape) for n, p in pairs)
        blocks = {n: check_blocks(n, shapes[n], b) for n, b in partitions.items()}
        group = {"params": [p for _, p in pairs], "names": [n for n, _ in pairs],
                 "unfiltered": [n in unfiltered for n, _ in pairs], "blocks": [blocks.get(n) for n, _ in pairs]}
        super().__init__([group], defaults)
        self.filter, self.base, self.seed = filter, base, int(seed)
        self.generators: dict[torch.device, torch.Generator] = {}   # random BCD's, one per device, seeded

    def _random_scores(self, p: torch.Tensor) -> torch.Tensor:
        """Uniform [0, 1) scores of p's shape from this optimizer's seeded generator on p's device (random BCD:
        the top k of iid uniform scores is a uniformly random k-subset)."""
        gen = self.generators.get(p.device)
        if gen is None:
            gen = self.generators[p.device] = torch.Generator(device=p.device).manual_seed(self.seed)
        return torch.rand(p.shape, generator=gen, device=p.device, dtype=torch.float32)

    def _scores(self, p, grad, m, v, bc1: float, sqrt_bc2: float, eps: float) -> torch.Tensor:
        """The filter's score of every entry of p (a new tensor; m, v and the gradient are left untouched)."""
        if self.filter == "random":
            return self._random_scores(p)
        if self.filter == "gradient":
            return grad.abs()
        if self.filter == "momentum":
            return m.abs()
        denom = v.sqrt().div_(sqrt_bc2).add_(eps)                   # √v̂ + ε, then m̂ (or g) divided by it
        if self.filter == "mv":
            return torch.div(m, denom, out=denom).abs_().div_(bc1)
        return torch.div(grad, denom, out=denom).abs_()

    @torch.no_grad()
    def step(self, closure=None):
        """One MoFO step (see the module docstring for the update rule); returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd, fraction = group["lr"], group["eps"], group["weight_decay"], group["fraction"]
            for name, p, full, blocks in zip(group["names"], group["params"], group["unfiltered"], group["blocks"]):
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise ParameterError(f"MoFO does not support sparse gradients ({name}).")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if self.base == "adam":
                        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"]
                m = state["exp_avg"]
                if self.base == "lion":      # FLT(m_{t−1}) before m moves; at t = 1 (m_0 = 0) |g_1|
                    mask = None
                    if not full:
                        scores = (grad.abs() if self.filter == "momentum" and t == 1 else
                                  self._scores(p, grad, m, None, 1.0, 1.0, eps))
                        mask = partition_mask(scores, fraction, blocks)
                        del scores
                    lion_update_(p, grad, m, lr=lr, betas=(beta1, beta2), weight_decay=wd, mask=mask)
                else:
                    v = state["exp_avg_sq"]
                    m.lerp_(grad, 1.0 - beta1)
                    v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                    if wd:
                        p.mul_(1.0 - lr * wd)
                    bc1 = 1.0 - beta1**t
                    sqrt_bc2 = math.sqrt(1.0 - beta2**t)
                    mask = None
                    if not full:            # also at fraction 1, where the mask is all ones: one code path
                        scores = self._scores(p, grad, m, v, bc1, sqrt_bc2, eps)
                        mask = partition_mask(scores, fraction, blocks)
                        del scores
                    _masked_adam_update_(p, m, v, mask, lr / bc1, sqrt_bc2, eps)
                state["updated"] = int(mask.sum()) if mask is not None else p.numel()
        return loss


def check_filter(filter: str, base: str = "adam") -> None:
    """Refuse an unknown filter or base, and a filter that reads Adam's v ("mv", "gv") with base "lion"."""
    if base not in BASES:
        raise ParameterError(f"Unknown MoFO base {base!r}. Choose one of: {', '.join(BASES)}.")
    if filter not in FILTERS:
        raise ParameterError(f"Unknown MoFO filter {filter!r}. Choose one of: {', '.join(FILTERS)} "
                             "(docs/methods.md#mofo-filters).")
    if base == "lion" and filter in NEEDS_V:
        raise ParameterError(f"The {filter!r} filter ranks by Adam's second moment v, which Lion does not keep; "
                             "with MoFO-Lion use the momentum, gradient or random filter.")


CHUNK = 1 << 20     # entries per piece of the update: its temporaries stay a few MiB whatever the tensor's size


def _masked_adam_update_(p: torch.Tensor, m: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                         step: float, sqrt_bc2: float, eps: float) -> None:
    """In place: p ← p − step · (FLT ⊙ m) / (√v / √bc2 + ε), over flat pieces of CHUNK entries. Element-wise,
    so the result is the same as on the whole tensor, with temporaries of one piece instead of three copies of
    the largest tensor (the embedding, a fifth of a small model)."""
    pf, mf, vf = p.view(-1), m.reshape(-1), v.reshape(-1)
    kf = mask.reshape(-1) if mask is not None else None
    for start in range(0, pf.numel(), CHUNK):
        sl = slice(start, start + CHUNK)
        denom = (vf[sl].sqrt() / sqrt_bc2).add_(eps)
        num = mf[sl] * kf[sl] if kf is not None else mf[sl]
        pf[sl].addcdiv_(num, denom, value=-step)
