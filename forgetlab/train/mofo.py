"""MoFO, the momentum-filtered optimizer (METHODS.md "MoFO"; seed: mofo-rebuttal.txt).

Adam(W) in which, in every parameter tensor (its "partition", PyTorch's default partitioning: q, k, v, o,
each MLP matrix, the embeddings… are separate tensors), only the entries whose first moment |m_t| is among
the top `fraction` of that tensor are moved this step:

    m_t = β1·m_{t−1} + (1 − β1)·g_t            (every entry)
    v_t = β2·v_{t−1} + (1 − β2)·g_t²           (every entry)
    θ_t = θ_{t−1}·(1 − lr·λ) − lr · FLT(m_t) ⊙ (m_t / (1 − β1^t)) / (√(v_t / (1 − β2^t)) + ε)

where FLT(m_t) is the 0/1 mask of the ⌈fraction·n⌉ entries of largest |m_t| in the tensor (n its size).
Tensors whose name contains "bias" or "norm" are not filtered (full Adam step).

Weight decay: decoupled as in AdamW and applied to **every** entry, updated or not. This follows the seed,
whose MoFO-for-Lion rule writes the decay term outside the filter:
θ_t = θ_{t−1} − η_t·(sign(c_t ⊙ FLT(m_{t−1})) + λ·θ_{t−1}). With fraction = 1 MoFO is exactly AdamW.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch

from forgetlab.errors import ParameterError

UNFILTERED_KEYS = ("bias", "norm")


def is_unfiltered(name: str) -> bool:
    """True for tensors that get the full Adam step: names containing "bias" or "norm" (case-insensitive)."""
    low = name.lower()
    return any(key in low for key in UNFILTERED_KEYS)


def top_fraction_mask(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """Boolean mask of the k = ⌈fraction·n⌉ entries of `scores` with the largest values (n = scores.numel())."""
    n = scores.numel()
    k = min(n, max(1, math.ceil(fraction * n - 1e-9)))
    if k >= n:
        return torch.ones_like(scores, dtype=torch.bool)
    flat = scores.reshape(-1)
    idx = torch.topk(flat, k, largest=True, sorted=False).indices
    mask = torch.zeros(n, dtype=torch.bool, device=scores.device)
    mask[idx] = True
    return mask.view_as(scores)


class MoFO(torch.optim.Optimizer):
    """Momentum-filtered Adam(W): per tensor, only the top-`fraction` entries by |m_t| are updated.

    `named_params` is `model.named_parameters()` (or any iterable of `(name, tensor)` pairs): the names decide
    which tensors are filtered ("bias"/"norm" tensors are not). Defaults follow METHODS.md: fraction 0.2,
    betas (0.9, 0.999), eps 1e-8, weight decay 0 (decoupled, applied to every entry as in AdamW).
    After a step, `state[p]["updated"]` holds how many entries of p were moved.
    """

    def __init__(
        self,
        named_params: Iterable[tuple[str, torch.Tensor]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        fraction: float = 0.2,
    ):
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
        group = {"params": [p for _, p in pairs], "names": [n for n, _ in pairs]}
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
            for name, p in zip(group["names"], group["params"]):
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
                denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
                if fraction < 1.0 and not is_unfiltered(name):
                    mask = top_fraction_mask(m.abs(), fraction)
                    p.addcdiv_(m * mask, denom, value=-lr / bc1)
                    state["updated"] = int(mask.sum())
                else:
                    p.addcdiv_(m, denom, value=-lr / bc1)
                    state["updated"] = p.numel()
        return loss
