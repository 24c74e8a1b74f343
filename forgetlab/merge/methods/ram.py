"""Reinforced Agent Merging (docs/methods.md#ram), as mergekit 0.1.5 computes it: an entry of a task vector
counts when |τt| > ε; entries changed by one model only keep that model's value, entries changed by several
are averaged over the models that changed them. `ramplus_tl` (tensor-local RAM+) scales each model's unique
entries by λt = 1 + r·clamp(ρt, 0, α), ρt = (its shared entries) / (its unique entries) in the tensor.

Both stream: one pass over the models counts the contributors per entry, a second adds each model's kept
entries divided by that count into the base. CPU kernel: `ram_merge_into_`, the same numbers block by block
(RAM+ counts each model's shared and unique entries in a first blocked pass)."""
from __future__ import annotations

import torch

from forgetlab.merge.registry import ParamSpec, TensorJob, fast_kernel, method
from forgetlab.merge.select import block_ranges


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


def _ram_block(blocks: list[torch.Tensor], epsilon: float):
    masks = [tau.abs() > epsilon for tau in blocks]
    count = torch.zeros_like(blocks[0])
    for m in masks:
        count += m
    return masks, count == 1, count > 1, count


def _ram_lams(taus: list[torch.Tensor], epsilon: float, r: float | None, alpha: float) -> list[float]:
    if r is None:
        return [1.0] * len(taus)
    shared, uniq = [0] * len(taus), [0] * len(taus)
    for s, e in block_ranges(taus[0].numel()):
        masks, unique, overlap, _ = _ram_block([t[s:e] for t in taus], epsilon)
        for i, m in enumerate(masks):
            shared[i] += int((m & overlap).sum())
            uniq[i] += int((m & unique).sum())
    return [1.0 + r * min(max(sh / max(float(u), epsilon), 0.0), alpha) for sh, u in zip(shared, uniq)]


def ram_merge_into_(base: torch.Tensor, taus: list[torch.Tensor], epsilon: float, r: float | None = None,
                    alpha: float = 0.2) -> torch.Tensor:
    """`ram_merge` block by block (blocks of `select.BLOCK` entries): the same element-wise operations, so the
    same numbers, without full-size masks and counts. `taus` are overwritten."""
    flat = [t.reshape(-1) for t in taus]
    o = base.reshape(-1)
    lams = _ram_lams(flat, epsilon, r, alpha)
    for s, e in block_ranges(o.numel()):
        blocks = [t[s:e] for t in flat]
        masks, unique, overlap, count = _ram_block(blocks, epsilon)
        inv = torch.where(overlap, 1.0 / count.clamp(min=1), 0.0)
        for tau, m, lam in zip(blocks, masks, lams):
            tau.mul_(m)
            o[s:e].add_(tau * (unique * lam + inv))
    return base


@method("ram", "RAM: keep entries changed by one model, average entries changed by several.",
        (_eps_param(),), mergekit="ram",
        formula="θ = θ0 + Σt τt·[|τt| > ε] / max(1, Σs [|τs| > ε])")
def _ram(job: TensorJob) -> torch.Tensor:
    return ram_merge(job.base, job.take_taus(), job.params["epsilon"])


@method("ramplus_tl", "RAM+ (tensor-local): RAM with each model's unique entries scaled up by its share of "
        "shared entries.",
        (ParamSpec("r", "float", 0.1, "Strength r of the rescaling λt = 1 + r·clamp(ρt, 0, α).", (0.0, 100.0)),
         ParamSpec("alpha", "float", 0.2, "Cap α on the overlap ratio ρt.", (0.0, 100.0)), _eps_param()),
        mergekit="ramplus_tl",
        formula="θ = θ0 + Σt τt·[|τt| > ε]·(λt·[c = 1] + [c > 1]/c), λt = 1 + r·clamp(ρt, 0, α)")
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
