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
"""
from __future__ import annotations

import math
from typing import Collection, Iterable

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.select import kth_largest

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


class MoFO(torch.optim.Optimizer):
    """Momentum-filtered Adam(W): per tensor, only the top-`fraction` entries by |m_t| are updated.

    `named_params` is the model itself (its trainable parameters are optimised; norms and biases found by
    module type, see `unfiltered_parameters`) or `(name, tensor)` pairs such as `model.named_parameters()`
    together with `unfiltered`, the names that get the full Adam step (default for pairs: the 1-D tensors —
    biases and norm scales are the only 1-D parameters of the language models forgetlab loads; pass the model
    or `unfiltered=unfiltered_parameters(model)` to decide by module type). Defaults follow docs/methods.md:
    fraction 0.2, betas (0.9, 0.999), eps 1e-8, weight decay 0 (decoupled, applied to every entry as in
    AdamW). After a step, `state[p]["updated"]` holds how many entries of p were moved.
    """

    def __init__(
        self,
        named_params: torch.nn.Module | Iterable[tuple[str, torch.Tensor]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        fraction: float = 0.2,
        unfiltered: Collection[str] | None = None,
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
        if not lr > 0:
            raise ParameterError(f"lr must be positive; got {lr}.")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ParameterError(f"betas must lie in [0, 1); got {betas}.")
        if not eps > 0:
            raise ParameterError(f"eps must be positive; got {eps}.")
        if weight_decay < 0:
            raise ParameterError(f"weight_decay must be ≥ 0; got {weight_decay}.")
        if not (0.0 < float(fraction) <= 1.0):
            raise ParameterError(f"fraction must lie in (0, 1]; got {fraction}. MoFO's default is 0.2.")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, fraction=float(fraction))
        if unfiltered is None:
            unfiltered = {n for n, p in pairs if p.dim() <= 1}
        unknown = set(unfiltered) - {n for n, _ in pairs}
        if unknown:
            raise ParameterError(f"unfiltered names {sorted(unknown)[:3]} are not among the parameters given "
                                 "to MoFO; pass names from the same model.named_parameters().")
        group = {"params": [p for _, p in pairs], "names": [n for n, _ in pairs],
                 "unfiltered": [n in unfiltered for n, _ in pairs]}
        super().__init__([group], defaults)

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
            for name, p, full in zip(group["names"], group["params"], group["unfiltered"]):
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise ParameterError(f"MoFO does not support sparse gradients ({name}).")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.lerp_(grad, 1.0 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                if wd:
                    p.mul_(1.0 - lr * wd)
                bc1 = 1.0 - beta1**t
                bc2 = 1.0 - beta2**t
                mask = top_fraction_mask(m.abs(), fraction) if fraction < 1.0 and not full else None
                _masked_adam_update_(p, m, v, mask, lr / bc1, math.sqrt(bc2), eps)
                state["updated"] = int(mask.sum()) if mask is not None else p.numel()
        return loss


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
