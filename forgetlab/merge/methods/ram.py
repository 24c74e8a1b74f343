"""Reinforced Agent Merging (docs/methods.md#ram), as mergekit 0.1.5 computes it: an entry of a task vector
counts when |τt| > ε; entries changed by one model only keep that model's value, entries changed by several
are averaged over the models that changed them. `ramplus_tl` (tensor-local RAM+) scales each model's unique
entries by λt = 1 + r·clamp(ρt, 0, α), ρt = (its shared entries) / (its unique entries) in the tensor.

Both stream: one pass over the models counts the contributors per entry, a second adds each model's kept
entries divided by that count into the base. CPU kernel: `ram_merge_into_`, the same numbers block by block
with the masks as 0/1 floats and the count kept as uint8 between the passes."""
from __future__ import annotations

import torch

from forgetlab.merge.registry import MergekitSpec, ParamSpec, TensorJob, WorkingMemory, fast_kernel, method
from forgetlab.merge.select import BLOCK, block_ranges


def _eps_param() -> ParamSpec:
    return ParamSpec("epsilon", "float", 1e-5, "An entry of a task vector counts as changed when |τ| > ε.",
                     (0.0, 1e3))


def ram_merge(base: torch.Tensor, taus: list[torch.Tensor], epsilon: float, r: float | None = None,
              alpha: float = 0.2) -> torch.Tensor:
    """RAM (r None) or RAM+ tensor-local into `base` in place: θ0 + Σt τt·[|τt| > ε]·(λt·[c = 1] + [c > 1]/c),
    c = Σt [|τt| > ε], λt = 1 for RAM. `taus` are overwritten."""
    masks = [tau.abs() > epsilon for tau in taus]
    count = torch.zeros_like(base)
    for m in masks:
        count += m
    unique = count == 1
    overlap = count > 1
    inv = torch.where(overlap, 1.0 / count.clamp(min=1), 0.0)
    for tau, m in zip(taus, masks):
        lam = 1.0
        if r is not None:
            shared = int((m & overlap).sum())
            uniq = int((m & unique).sum())
            rho = shared / max(float(uniq), epsilon)
            lam = 1.0 + r * min(max(rho, 0.0), alpha)
        tau.mul_(m)
        base.add_(tau * (unique * lam + inv))
    return base


def ram_merge_into_(base: torch.Tensor, taus: list[torch.Tensor], epsilon: float, r: float | None = None,
                    alpha: float = 0.2) -> torch.Tensor:
    """`ram_merge` block by block (blocks of `select.BLOCK` entries), the same numbers in two passes: the first
    masks each τt in place and counts the contributors c per entry (kept as uint8; RAM+ also counts each model's
    unique and shared entries), the second adds τt·ft with ft = 1/max(c, 1), or λt where c = 1 — the reference's
    λt·[c = 1] + [c > 1]/c, since a masked τt is ±0 wherever it does not count. `taus` are overwritten."""
    flat = [t.reshape(-1) for t in taus]
    o = base.reshape(-1)
    n = o.numel()
    nb = min(BLOCK, n)
    counts = torch.empty(n, dtype=torch.uint8)
    c, u, f = (torch.empty(nb, dtype=torch.float32) for _ in range(3))
    # RAM+ keeps every model's block mask for its counts; RAM reuses one
    masks = torch.empty((len(flat) if r is not None else 1, nb), dtype=torch.float32)
    shared, uniq = [0] * len(flat), [0] * len(flat)
    for s, e in block_ranges(n):
        k = e - s
        c_, u_ = c[:k], u[:k]
        c_.zero_()
        for i, t in enumerate(flat):
            m_ = masks[min(i, len(masks) - 1), :k]
            blk = t[s:e]
            torch.abs(blk, out=m_)
            torch.gt(m_, epsilon, out=m_)  # [|τt| > ε] as 0/1 floats
            c_.add_(m_)
            blk.mul_(m_)
        counts[s:e].copy_(c_)
        if r is not None:  # exact: block sums of 0/1 floats stay far below 2^24
            torch.eq(c_, 1, out=u_)
            torch.gt(c_, 1, out=f[:k])
            for i, m_ in enumerate(masks[:, :k]):
                uniq[i] += int(torch.dot(m_, u_))
                shared[i] += int(torch.dot(m_, f[:k]))
    lams = [1.0] * len(flat)
    if r is not None:
        lams = [1.0 + r * min(max(sh / max(float(q), epsilon), 0.0), alpha) for sh, q in zip(shared, uniq)]
    unique = torch.empty(nb, dtype=torch.bool)
    for s, e in block_ranges(n):
        k = e - s
        c_, f_, m_, unique_ = c[:k], f[:k], u[:k], unique[:k]
        c_.copy_(counts[s:e])
        if r is not None:
            torch.eq(c_, 1, out=unique_)
        torch.reciprocal(c_.clamp_min_(1), out=c_)
        for t, lam in zip(flat, lams):
            if lam != 1.0:
                f_.copy_(c_).masked_fill_(unique_, lam)
            torch.mul(t[s:e], f_ if lam != 1.0 else c_, out=m_)
            o[s:e].add_(m_)
    return base


@method("ram", "RAM: keep entries changed by one model, average entries changed by several.",
        (_eps_param(),), mergekit=MergekitSpec("ram"),
        formula="θ = θ0 + Σt τt·[|τt| > ε] / max(1, Σs [|τs| > ε])",
        memory=WorkingMemory(fast=(0.6, 0), reference=(4.6, 0.3)),
        title="RAM", paper="Reinforced Agent Merging (arXiv 2601.13572)")
def _ram(job: TensorJob) -> torch.Tensor:
    return ram_merge(job.base, job.take_taus(), job.params["epsilon"])


@method("ramplus_tl", "RAM+ (tensor-local): RAM with each model's unique entries scaled up by its share of "
        "shared entries.",
        (ParamSpec("r", "float", 0.1, "Strength r of the rescaling λt = 1 + r·clamp(ρt, 0, α).", (0.0, 100.0)),
         ParamSpec("alpha", "float", 0.2, "Cap α on the overlap ratio ρt.", (0.0, 100.0)), _eps_param()),
        mergekit=MergekitSpec("ramplus_tl"),
        formula="θ = θ0 + Σt τt·[|τt| > ε]·(λt·[c = 1] + [c > 1]/c), λt = 1 + r·clamp(ρt, 0, α)",
        memory=WorkingMemory(fast=(0.6, 0), reference=(3.9, 0.8)),
        title="RAM+", paper="Reinforced Agent Merging (arXiv 2601.13572)")
def _ramplus_tl(job: TensorJob) -> torch.Tensor:
    p = job.params
    return ram_merge(job.base, job.take_taus(), p["epsilon"], p["r"], p["alpha"])


@fast_kernel("ram")
def _ram_fast(job: TensorJob) -> torch.Tensor:
    return ram_merge_into_(job.base, job.take_taus(), job.params["epsilon"])


@fast_kernel("ramplus_tl")
def _ramplus_tl_fast(job: TensorJob) -> torch.Tensor:
    p = job.params
    return ram_merge_into_(job.base, job.take_taus(), p["epsilon"], p["r"], p["alpha"])
