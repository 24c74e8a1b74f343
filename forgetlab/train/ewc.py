"""EWC, elastic weight consolidation (docs/methods.md#ewc; Kirkpatrick et al. 2017, PNAS 114(13)).

After each finished task k, `diagonal_fisher` measures how much the loss of that task depends on each weight,
F_k,j = (1/N) Σ_n (∂ℓ_n/∂θ_j)² at the weights θ*_k the task ended with, and `EwcPenalty.add_task` keeps it.
Later tasks then train on loss + (λ/2)·Σ_k Σ_j F_k,j (θ_j − θ*_k,j)², the sum over the finished tasks (as in the
paper's sequential experiments, one penalty per earlier task).

The sum is kept in two tensors and one number, whatever the number of tasks: with A = Σ_k F_k, B = Σ_k F_k θ*_k
and C = Σ_k F_k θ*_k², the penalty is (λ/2)·Σ_j (A θ² − 2Bθ + C) and its gradient λ(Aθ − B). forgetlab stores
A, the Fisher-weighted centre μ = B/A (μ = θ* where A = 0) and the number D = Σ_j (C − B²/A): then the penalty
is (λ/2)·(Σ_j A (θ − μ)² + D) and the gradient λ·A·(θ − μ) — the same values, without the cancellation of
A θ² − 2Bθ + C in float32 when θ is near μ.
"""
from __future__ import annotations

import math
import warnings
from typing import Mapping, Sequence

import torch
from torch.func import functional_call, grad, vmap

from forgetlab.core.data import collate
from forgetlab.core.errors import ParameterError, TrainingError
from forgetlab.core.progress import Progress, report
from forgetlab.train.trainer import causal_lm_loss, usable_examples


FISHER_CHUNK_BYTES = 1 << 28
"""The per-example gradients `diagonal_fisher` holds at once (256 MiB): a chunk of c examples holds c copies of
the trained weights' gradients, so c = this // their bytes (at most FISHER_CHUNK); c = 1 is a plain loop."""
FISHER_CHUNK = 32


def fisher_chunk(params: Sequence[torch.Tensor]) -> int:
    """How many examples `diagonal_fisher` differentiates at once for these trained parameters (see
    FISHER_CHUNK_BYTES): 1 (one backward pass per example) for a model whose gradients exceed it."""
    size = sum(p.numel() * p.element_size() for p in params)
    return max(1, min(FISHER_CHUNK, FISHER_CHUNK_BYTES // max(1, size)))


def diagonal_fisher(model: torch.nn.Module, examples: Sequence, *, pad_id: int = 0,
                    progress: Progress = None) -> dict[str, torch.Tensor]:
    """The empirical diagonal Fisher of the model's trainable parameters on `examples`
    (forgetlab.core.data.EncodedExample): F_j = (1/N) Σ_n (∂ℓ_n/∂θ_j)², ℓ_n = the causal-LM loss of example n
    alone (forgetlab.train.trainer.causal_lm_loss: mean cross-entropy over its answer tokens); examples without
    a loss position are skipped (N counts the used ones). float32 tensors keyed by parameter name, on each
    parameter's device. The model runs in eval mode (no dropout) and is put back in its mode after; neither
    the parameters' `.grad` nor any optimizer state is touched.

    Small models take `fisher_chunk` examples at a time, right-padded, each differentiated on its own
    (torch.func's vmap of grad; padding after the last token changes no earlier position of a causal LM);
    larger ones, or a model torch.func cannot trace, one backward pass per example."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ParameterError("The model has no trainable parameters (all have requires_grad=False), so it has no "
                             "Fisher to measure.")
    used = sorted(usable_examples(examples), key=lambda ex: len(ex.input_ids))   # similar lengths: less padding
    if not used:
        raise TrainingError("No example with a loss to measure the Fisher on: every example has all its labels "
                            "set to -100. Give the task's training pairs (answers not cut off).")
    params = [p for _, p in named]
    dev = params[0].device
    fisher = {n: torch.zeros(p.shape, dtype=torch.float32, device=p.device) for n, p in named}
    chunk = fisher_chunk(params)
    was_training = model.training
    model.eval()
    try:
        done = 0
        while done < len(used):
            part = used[done:done + chunk]
            batch = {k: v.to(dev) for k, v in collate(part, pad_id).items()}
            if chunk > 1:
                try:
                    _add_squares_vmap(model, named, batch, fisher)
                except (RuntimeError, NotImplementedError, TypeError):   # an op torch.func cannot batch
                    chunk = 1
                    continue
            else:
                _add_squares(model, named, batch, fisher)
            done += len(part)
            report(progress, done / len(used), f"Fisher · example {done}/{len(used)}")
    finally:
        model.train(was_training)
    for f in fisher.values():
        f.div_(len(used))
    return fisher


def _add_squares(model, named, batch, fisher) -> None:
    """fisher[name] += (∂ℓ/∂θ)² for the one example of `batch` (autograd; .grad untouched)."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    loss = causal_lm_loss(out.logits, batch["labels"])
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    for (name, _), g in zip(named, grads):
        if g is not None:
            g = g.detach().float()
            fisher[name].addcmul_(g, g)


def _add_squares_vmap(model, named, batch, fisher) -> None:
    """fisher[name] += Σ_n (∂ℓ_n/∂θ)² over the right-padded examples n of `batch`, each differentiated alone."""
    weights = {n: p.detach() for n, p in named}

    def loss(w, ids, labels):
        out = functional_call(model, w, (ids.unsqueeze(0),), {"use_cache": False})
        return causal_lm_loss(out.logits, labels.unsqueeze(0))

    with warnings.catch_warnings():     # torch.func falls back to a loop for CPU attention and says so, each call
        warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented "
                                                  "the batching rule")
        grads = vmap(grad(loss), in_dims=(None, 0, 0))(weights, batch["input_ids"], batch["labels"])
    for name, g in grads.items():
        fisher[name].add_(g.float().pow(2).sum(0))


class EwcPenalty:
    """(λ/2)·Σ_k Σ_j F_k,j (θ_j − θ*_k,j)² over the finished tasks k (Kirkpatrick et al. 2017, accumulated over
    tasks as in their sequential experiments), kept as A = Σ_k F_k, B = Σ_k F_k θ*_k, C = Σ_k F_k θ*_k² so memory
    does not grow with the number of tasks (stored as A, μ = B/A and D = Σ_j (C − B²/A): module docstring);
    gradient λ·(A θ − B). Pass it to `forgetlab.train.trainer.train(ewc=…)`."""

    def __init__(self, lam: float):
        lam = float(lam)
        if not (0.0 <= lam < math.inf):
            raise ParameterError(f"The EWC strength λ must be a finite number ≥ 0 (0: off); got {lam}.")
        self.lam = lam
        self.tasks = 0
        self.fisher_sum: dict[str, torch.Tensor] = {}     # A
        self.center: dict[str, torch.Tensor] = {}         # μ = B / A
        self.offset = 0.0                                  # D = Σ_j (C − B²/A), ≥ 0

    def add_task(self, fisher: Mapping[str, torch.Tensor], weights: Mapping[str, torch.Tensor]) -> None:
        """Add a finished task: its diagonal Fisher F_k (`diagonal_fisher`) and the weights θ*_k it ended with,
        keyed by parameter name (every name of `fisher` must be in `weights`, with the same shape)."""
        missing = [n for n in fisher if n not in weights]
        if missing:
            raise ParameterError(f"EWC needs the weights θ* of every tensor of the Fisher; {len(missing)} are "
                                 f"missing (e.g. {missing[0]!r}). Pass the model's weights after the task.")
        with torch.no_grad():
            for name, f in fisher.items():
                f = f.detach().float()
                t = weights[name].detach().to(device=f.device, dtype=torch.float32)
                if t.shape != f.shape:
                    raise ParameterError(f"EWC: the weights of {name!r} have shape {tuple(t.shape)} but its Fisher "
                                         f"{tuple(f.shape)}; pass the Fisher and the weights of the same model.")
                if name not in self.fisher_sum:
                    self.fisher_sum[name] = f.clone()
                    self.center[name] = t.clone()
                    continue
                a, mu = self.fisher_sum[name], self.center[name]
                total = a + f
                live = total > 0
                # D grows by Σ A·F·(μ − θ*)² / (A + F), the weighted-variance update of merging two centres
                gap = (mu - t).double()
                self.offset += float(torch.where(live, a.double() * f.double() * gap * gap / total.double(),
                                                 torch.zeros((), dtype=torch.float64, device=a.device)).sum())
                mu.add_(torch.where(live, f * (t - mu) / torch.where(live, total, torch.ones_like(total)), t - mu))
                a.copy_(total)
        self.tasks += 1

    def add_grad_(self, named_params: Sequence[tuple[str, torch.Tensor]]) -> float:
        """Add λ(Aθ − B) = λ·A·(θ − μ) to each parameter's .grad (creating it if None); return the penalty's
        value (λ/2)·(Σ_j A (θ − μ)² + D). Parameters without a Fisher are left alone. With λ = 0 or no task
        added, return 0.0 without touching any gradient."""
        if not self.lam or not self.tasks:
            return 0.0
        total, matched = self.offset, 0
        with torch.no_grad():
            for name, p in named_params:
                a = self.fisher_sum.get(name)
                if a is None:
                    continue
                if a.shape != p.shape:
                    raise ParameterError(f"EWC: {name!r} has shape {tuple(p.shape)} but its Fisher "
                                         f"{tuple(a.shape)}; the penalty belongs to another model.")
                matched += 1
                a = a.to(p.device)
                diff = p.detach().float() - self.center[name].to(p.device)
                pull = a * diff
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.add_(pull.to(p.grad.dtype), alpha=self.lam)
                total += float((pull.double() * diff.double()).sum())
        if not matched:
            raise ParameterError("EWC: none of the trained parameters has a Fisher in this penalty; it was built "
                                 "for another model (or with other parameter names).")
        return 0.5 * self.lam * total
