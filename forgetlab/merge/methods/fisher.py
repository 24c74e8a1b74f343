"""Fisher merging, ``fisher`` (docs/methods.md#fisher; Matena & Raffel, arXiv 2111.09832): θ = Σt F̃t⊙θt / Σt F̃t
with F̃t = Ft + eps, Ft the diagonal Fisher of model t on its task's probe split. forgetlab takes the empirical
Fisher: the mean over probe pairs of the squared gradient of the answer's log-likelihood (the sum over answer
tokens, prompt tokens masked as in training), one pair at a time. eps = 1e-6 (fusion-bench's
`minimal_fisher_weight`); fusion-bench also offers a per-model L2 normalisation of the Fisher, left out here (the
paper's formula has none). Tensors without a Fisher (buffers) are averaged. Needs a pool, as slwm does.

eps = 0 is the formula's limit eps → 0⁺: Σt Ft⊙θt / Σt Ft, and where no model's Fisher covers an entry (Σt Ft = 0,
e.g. the embedding of a token no probe pair uses) the plain mean of the θt, as for any eps > 0 there. A fine-tune
holding NaN/Inf makes its whole Fisher NaN (the gradients flow through every layer): refused, naming the model
and its non-finite tensors, before anything is merged."""
from __future__ import annotations

import copy
from typing import Sequence

import torch

from forgetlab.core.errors import CheckpointError
from forgetlab.core.progress import report, scaled
from forgetlab.merge.methods.regmean import probe_inputs
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, method


def fisher_average(thetas: Sequence[torch.Tensor], fishers: Sequence[torch.Tensor], eps: float) -> torch.Tensor:
    """Σt (Ft + eps)⊙θt / Σt (Ft + eps); with eps = 0, where Σt Ft = 0 the limit eps → 0⁺ of it: the mean of the θt."""
    num = torch.zeros_like(thetas[0], dtype=torch.float32)
    den = torch.zeros_like(num)
    for th, f in zip(thetas, fishers):
        w = f.to(num.device, torch.float32) + float(eps)
        num.add_(w * th)
        den.add_(w)
    uncovered = den == 0
    if bool(uncovered.any()):           # only with eps = 0: no Fisher weight at these entries
        mean = torch.stack([th.to(num.device, torch.float32) for th in thetas]).mean(dim=0)
        num = torch.where(uncovered, mean, num)
        den = torch.where(uncovered, torch.ones_like(den), den)
    return num / den


def _check_fisher(name: str, model, fisher: dict[str, torch.Tensor]) -> None:
    """Refuse a Fisher with NaN/Inf (CheckpointError): name the model's non-finite weights when it has any (their
    NaN reaches every gradient), else the tensors whose squared gradients overflowed."""
    bad = [k for k, f in fisher.items() if not bool(torch.isfinite(f).all())]
    if not bad:
        return
    weights = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if weights:
        raise CheckpointError(
            f"fisher: {name} holds NaN/Inf in {len(weights)} tensor(s) ({', '.join(weights[:3])}"
            f"{' …' if len(weights) > 3 else ''}), so its gradients and its Fisher are NaN and the merge would be "
            f"NaN. Repair or re-save {name}, or leave it out of the merge.")
    raise CheckpointError(
        f"fisher: the Fisher of {name} is not finite in {len(bad)} tensor(s) ({', '.join(bad[:3])}"
        f"{' …' if len(bad) > 3 else ''}) although its weights are: its squared answer gradients overflow float32 "
        "on its task's probe pairs. Check those pairs (or the model's outputs on them), or merge with a method "
        "that takes no gradients (regmean, ties).")


def empirical_fisher(model, enc, progress=None, *, own: bool = False) -> dict[str, torch.Tensor]:
    """Mean over the encoded pairs of (∂ log p(answer | prompt)/∂θ)², one pair at a time (answer tokens only).

    The gradients are taken on a copy of `model`, or with `own` on the model itself (its weights are not
    changed; its gradients and requires_grad flags are reset afterwards), which saves a copy when nobody else
    runs it meanwhile."""
    work = model.train(False) if own else copy.deepcopy(model).train(False)
    flags = [p.requires_grad for p in work.parameters()]
    try:
        return _fisher_of(work, enc, progress)
    finally:
        if own:
            for p, flag in zip(work.parameters(), flags):
                p.grad = None
                p.requires_grad_(flag)


def _fisher_of(work, enc, progress) -> dict[str, torch.Tensor]:
    for p in work.parameters():
        p.requires_grad_(True)
    dev = next(work.parameters()).device
    params = dict(work.named_parameters())
    acc = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
    n = len(enc)
    for i in range(n):
        one = enc.chunk(i, i + 1)
        ids = one.input_ids.to(dev)
        start = int(one.answer_starts[0])
        logits = work(input_ids=ids).logits[0, :-1].float()
        targets = ids[0, 1:]
        logp = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]
        length = int(one.lengths[0])
        ll = logp[max(0, start - 1): length - 1].sum()
        work.zero_grad(set_to_none=True)
        ll.backward()
        for name, p in params.items():
            if p.grad is not None:
                acc[name].add_(p.grad.detach().float() ** 2)
        report(progress, (i + 1) / n, f"fisher: pair {i + 1}/{n}")
    work.zero_grad(set_to_none=True)
    return {k: v.div_(max(1, n)).cpu() for k, v in acc.items()}     # in place: no second copy of the sums


def fisher_prepare(ctx) -> dict[str, torch.Tensor]:
    """The prepare hook: per tensor name, the stacked Fishers (T, …) of the fine-tuned models.

    One fine-tuned model at a time is loaded (`ModelPool.borrow`: unloaded after unless the caller held it) and
    its gradients are taken on it directly when the pool did not hold it before (on a copy when it did); each
    model's Fisher is written into the (T, …) stacks as soon as it is known."""
    names, encs, _ = probe_inputs(ctx, int(ctx.params["samples"]), method="fisher")
    T = len(names)
    out: dict[str, torch.Tensor] = {}
    for t, (name, enc) in enumerate(zip(names, encs)):
        held = (name, "cpu", torch.float32) in ctx.pool.loaded()
        with ctx.pool.borrow(name) as model:
            fisher = empirical_fisher(model, enc, scaled(ctx.progress, t / T, (t + 1) / T), own=not held)
            _check_fisher(name, model, fisher)
        for k in list(fisher):
            f = fisher.pop(k)
            if k not in out:
                out[k] = torch.empty((T, *f.shape), dtype=f.dtype)
            out[k][t].copy_(f)
            del f
    return out


def fisher_prepare_memory(model: int, n_models: int, linear_inputs: int) -> dict[str, int]:
    """fisher's prepare phase on the CPU, in bytes (`WorkingMemory.prepare`; `model`: the model's float32 bytes):
    the model, its gradients and their running sum (3.1 model sizes measured by bench/prepare_memory.py on a 42M
    Llama, rounded up), and one Fisher of the model's size per fine-tune, which the formula needs whole."""
    return {"model, gradients and their running sum": int(3.2 * model),
            "Fishers (one per fine-tune)": n_models * model}


@method("fisher", "Fisher merging: average the models weighted entry by entry by their diagonal Fisher on their tasks.",
        (ParamSpec("eps", "float", 1e-6, "Added to every Fisher entry (fusion-bench's minimal_fisher_weight); 0: "
                   "the pure Fisher-weighted mean, the plain mean where no Fisher covers an entry.", (0.0, 1e6)),
         ParamSpec("samples", "int", 32, "Probe pairs per task whose gradients give the Fisher.", (1, 100000)),
         ParamSpec("tasks", "str", "", "Task of each model, comma-separated in model order (default: the task "
                   "named like the model).")),
        prepare=fisher_prepare, needs_pool=True, in_place=False,
        formula="θ = Σt (Ft + eps)⊙θt / Σt (Ft + eps)", memory=WorkingMemory((7.1, 3.1), prepare=fisher_prepare_memory),
        title="Fisher merging",
        paper="Matena & Raffel, Merging models with Fisher-weighted averaging (arXiv 2111.09832)")
def _fisher(job: TensorJob) -> torch.Tensor:
    if job.prepared is None:
        return torch.stack(job.finetuned).mean(dim=0)
    return fisher_average(job.finetuned, list(job.prepared), job.params["eps"])
