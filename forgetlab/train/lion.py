"""Lion, the sign-momentum optimizer (docs/methods.md#lion; Chen et al. 2023, "Symbolic Discovery of Optimization
Algorithms", NeurIPS 36): the one home of its update rule, used by `Lion` and by MoFO-Lion
(`forgetlab.train.mofo.MoFO` with `base="lion"`).

For every entry, with gradient g, momentum m (0 at the start), learning rate lr and weight decay wd:

    c = β1·m + (1 − β1)·g
    θ ← θ − lr·(M ⊙ sign(c) + wd·θ)
    m ← β2·m + (1 − β2)·g

M is 1 everywhere for Lion; MoFO-Lion passes its filter (docs/methods.md#mofo-lion). The decay term is outside the
filter, as in the MoFO authors' MoFO-Lion rule. Defaults: β1 0.9, β2 0.99, wd 0 (the paper's betas; its authors
advise a learning rate 3–10× smaller than AdamW's and a weight decay 3–10× larger, since sign(c) has unit size).
"""
from __future__ import annotations

from typing import Iterable

import torch

from forgetlab.core.errors import ParameterError

LION_BETAS = (0.9, 0.99)
"""Lion's (β1, β2) when none are given: the paper's defaults."""

CHUNK = 1 << 20     # entries per piece of the update: its temporaries stay a few MiB whatever the tensor's size


def check_lion(lr: float, betas: tuple[float, float], weight_decay: float) -> None:
    """Refuse a learning rate ≤ 0, betas outside [0, 1) or a negative weight decay, saying which."""
    if not lr > 0:
        raise ParameterError(f"lr must be positive; got {lr}.")
    if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
        raise ParameterError(f"betas must lie in [0, 1); got {betas}.")
    if weight_decay < 0:
        raise ParameterError(f"weight_decay must be ≥ 0; got {weight_decay}.")


@torch.no_grad()
def lion_update_(p: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, *, lr: float, betas: tuple[float, float],
                 weight_decay: float = 0.0, mask: torch.Tensor | None = None) -> None:
    """In place, one Lion step of parameter `p` with gradient `grad` and momentum `m` (module docstring):
    θ ← θ·(1 − lr·wd) − lr·M ⊙ sign(β1·m + (1 − β1)·g), then m ← β2·m + (1 − β2)·g. `mask` (bool, p's shape;
    None = every entry) is M. Computed over flat pieces of CHUNK entries (element-wise, so the same result as on
    the whole tensor, with the temporaries of one piece)."""
    beta1, beta2 = betas
    if weight_decay:
        p.mul_(1.0 - lr * weight_decay)
    pf, gf, mf = p.view(-1), grad.reshape(-1), m.view(-1)
    kf = mask.reshape(-1) if mask is not None else None
    for start in range(0, pf.numel(), CHUNK):
        sl = slice(start, start + CHUNK)
        c = torch.lerp(mf[sl], gf[sl], 1.0 - beta1).sign_()
        if kf is not None:
            c.mul_(kf[sl])
        pf[sl].add_(c, alpha=-lr)
        mf[sl].lerp_(gf[sl], 1.0 - beta2)


class Lion(torch.optim.Optimizer):
    """Lion (module docstring) over `params`: lr (default 1e-4), betas (default (0.9, 0.99)), decoupled weight
    decay (default 0). `state[p]["exp_avg"]` holds m."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-4, betas: tuple[float, float] = LION_BETAS,
                 weight_decay: float = 0.0):
        check_lion(lr, tuple(betas), weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        """One Lion step of every parameter with a gradient; returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ParameterError("Lion does not support sparse gradients.")
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                lion_update_(p, p.grad, state["exp_avg"], lr=group["lr"], betas=group["betas"],
                             weight_decay=group["weight_decay"])
        return loss
