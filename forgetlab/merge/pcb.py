"""PCB-merging: parameter competition balancing (METHODS.md; seed pcb-merging-rebuttal.txt).

For tasks i, j over the entries of a task vector (the whole flattened vector for scope="global", each
tensor for scope="tensor"):
  Norm(x) = (x − min x)/(max x − min x)  (a constant x maps to 0)
  intra_i = softmax(N·Norm(τi ⊙ τi)),  inter_i = Σj softmax(Norm(τi ⊙ τj))  (j includes i)
  βi = intra_i ⊙ inter_i;  β̂i = βi where βi ≥ its k-th largest value, k = keep_count(n, r), else 0
  τm = Σi λi·β̂i ⊙ τi / Σi β̂i  (0 where Σi β̂i = 0);  θ = θ0 + τm  (λi = λ by default).

Global scope needs min, max and softmax denominators over the whole vector, then a quantile of β:
`PCBGlobalCollector` computes them streaming in four passes (min/max; softmax sums; two RadixSelect
passes for the exact threshold of each βi), and the merge pass applies `pcb_combine` per tensor.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from forgetlab.merge.sparsify import keep_count
from forgetlab.merge.stats import RadixSelect, kth_largest


@dataclass
class PCBStats:
    """Statistics that fix PCB's Norm and softmax over a set of entries, and the β thresholds."""

    n_tasks: int
    lo: dict[tuple[int, int], float] = field(default_factory=dict)  # min of τi⊙τj, i ≤ j
    hi: dict[tuple[int, int], float] = field(default_factory=dict)  # max of τi⊙τj
    z_intra: list[float] = field(default_factory=list)              # Σ exp(N·Norm(τi⊙τi))
    z_pair: dict[tuple[int, int], float] = field(default_factory=dict)  # Σ exp(Norm(τi⊙τj))
    thresholds: list[float | None] = field(default_factory=list)    # k-th largest βi (None: keep none)

    def to_dict(self) -> dict:
        key = lambda p: f"{p[0]},{p[1]}"  # noqa: E731
        return {"n_tasks": self.n_tasks, "lo": {key(k): v for k, v in self.lo.items()},
                "hi": {key(k): v for k, v in self.hi.items()}, "z_intra": list(self.z_intra),
                "z_pair": {key(k): v for k, v in self.z_pair.items()}, "thresholds": list(self.thresholds)}


def _pairs(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(i, n)]


def _key(i: int, j: int) -> tuple[int, int]:
    return (i, j) if i <= j else (j, i)


def norm01(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """Min-max normalisation (x − lo)/(hi − lo) with fixed bounds; zeros when hi = lo."""
    if not hi > lo:
        return torch.zeros_like(x)
    return (x - lo) / (hi - lo)


def _exp_intra(tau: torch.Tensor, n_tasks: int, lo: float, hi: float) -> torch.Tensor:
    return torch.exp(n_tasks * norm01(tau * tau, lo, hi))


def _exp_pair(ti: torch.Tensor, tj: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return torch.exp(norm01(ti * tj, lo, hi))


def pcb_balance(taus: Sequence[torch.Tensor], stats: PCBStats) -> list[torch.Tensor]:
    """βi = intra_i ⊙ inter_i for each task, with Norm bounds and softmax denominators from `stats`."""
    n = len(taus)
    betas = []
    for i in range(n):
        intra = _exp_intra(taus[i], n, stats.lo[(i, i)], stats.hi[(i, i)]) / stats.z_intra[i]
        inter = torch.zeros_like(intra)
        for j in range(n):
            k = _key(i, j)
            inter += _exp_pair(taus[i], taus[j], stats.lo[k], stats.hi[k]) / stats.z_pair[k]
        betas.append(intra * inter)
    return betas


def pcb_combine(taus: Sequence[torch.Tensor], betas: Sequence[torch.Tensor],
                thresholds: Sequence[float | None], lam: float | Sequence[float] = 1.0) -> torch.Tensor:
    """τm = Σi λi·β̂i ⊙ τi / Σi β̂i with β̂i = βi·[βi ≥ threshold_i] (0 where Σi β̂i = 0)."""
    lams = [float(lam)] * len(taus) if isinstance(lam, (int, float)) else [float(x) for x in lam]
    num = torch.zeros_like(taus[0], dtype=torch.float32)
    den = torch.zeros_like(num)
    for tau, beta, thr, li in zip(taus, betas, thresholds, lams):
        bhat = torch.zeros_like(beta) if thr is None else torch.where(beta >= thr, beta, torch.zeros_like(beta))
        num += li * bhat * tau
        den += bhat
    safe = torch.where(den > 0, den, torch.ones_like(den))
    return torch.where(den > 0, num / safe, torch.zeros_like(num))


def pcb_stats(taus: Sequence[torch.Tensor], keep: float = 0.2) -> PCBStats:
    """PCB statistics of entries held in memory (one tensor for scope="tensor", or a concatenation)."""
    n = len(taus)
    st = PCBStats(n)
    for i, j in _pairs(n):
        prod = taus[i] * taus[j]
        st.lo[(i, j)] = float(prod.min())
        st.hi[(i, j)] = float(prod.max())
        st.z_pair[(i, j)] = float(_exp_pair(taus[i], taus[j], st.lo[(i, j)], st.hi[(i, j)]).double().sum())
    st.z_intra = [float(_exp_intra(taus[i], n, st.lo[(i, i)], st.hi[(i, i)]).double().sum()) for i in range(n)]
    k = keep_count(taus[0].numel(), keep)
    st.thresholds = [kth_largest(b, k) for b in pcb_balance(taus, st)]
    return st


def pcb_merge(taus: Sequence[torch.Tensor], keep: float = 0.2, lam: float | Sequence[float] = 1.0,
              stats: PCBStats | None = None) -> torch.Tensor:
    """Merged task vector of PCB: statistics from `taus` themselves unless `stats` (global ones) is given."""
    taus = [t.to(torch.float32) for t in taus]
    st = stats if stats is not None else pcb_stats(taus, keep)
    return pcb_combine(taus, pcb_balance(taus, st), st.thresholds, lam)


class PCBGlobalCollector:
    """Streams PCB's global statistics: pass 0 min/max of every τi⊙τj, pass 1 softmax denominators (float64
    sums), passes 2–3 the exact k-th largest βi (RadixSelect), k = keep_count(total entries, keep)."""

    passes = 4

    def __init__(self, n_tasks: int, total: int, keep: float):
        self.st = PCBStats(n_tasks)
        self.n = n_tasks
        for p in _pairs(n_tasks):
            self.st.lo[p], self.st.hi[p], self.st.z_pair[p] = math.inf, -math.inf, 0.0
        self.st.z_intra = [0.0] * n_tasks
        k = keep_count(total, keep)
        self.selects = [RadixSelect(k) for _ in range(n_tasks)]

    def add(self, pass_index, name, base, taus):
        taus = [t.to(torch.float32) for t in taus]
        st = self.st
        from forgetlab.merge import kernels
        if kernels.on_cpu_fast_path(*taus):  # the same statistics, block by block (forgetlab.merge.kernels)
            if pass_index == 0:
                kernels.pcb_minmax(taus, st.lo, st.hi)
            elif pass_index == 1:
                kernels.pcb_zsums(taus, st.lo, st.hi, st.z_pair, st.z_intra)
            else:
                betas = kernels.pcb_betas(taus, st, [torch.empty_like(taus[0]) for _ in taus])
                for sel, beta in zip(self.selects, betas):
                    sel.add(beta)
            return
        if pass_index == 0:
            for i, j in _pairs(self.n):
                prod = taus[i] * taus[j]
                st.lo[(i, j)] = min(st.lo[(i, j)], float(prod.min()))
                st.hi[(i, j)] = max(st.hi[(i, j)], float(prod.max()))
        elif pass_index == 1:
            for i, j in _pairs(self.n):
                st.z_pair[(i, j)] += float(_exp_pair(taus[i], taus[j], st.lo[(i, j)], st.hi[(i, j)]).double().sum())
            for i in range(self.n):
                st.z_intra[i] += float(_exp_intra(taus[i], self.n, st.lo[(i, i)], st.hi[(i, i)]).double().sum())
        else:
            for sel, beta in zip(self.selects, pcb_balance(taus, st)):
                sel.add(beta)

    def end_pass(self, pass_index):
        if pass_index >= 2:
            for sel in self.selects:
                sel.advance()

    def result(self) -> PCBStats:
        self.st.thresholds = [sel.value for sel in self.selects]
        return self.st
