"""PCB-merging: parameter competition balancing (docs/methods.md#pcb).

For tasks i, j over the entries of a task vector (the whole flattened vector for scope="global", each
tensor for scope="tensor"):
  Norm(x) = (x − min x)/(max x − min x)  (a constant x maps to 0)
  intra_i = softmax(N·Norm(τi ⊙ τi)),  inter_i = Σj softmax(Norm(τi ⊙ τj))  (j includes i)
  βi = intra_i ⊙ inter_i;  β̂i = βi where βi ≥ its k-th largest value, k = keep_count(n, r), else 0
  τm = Σi λi·β̂i ⊙ τi / Σi β̂i  (0 where Σi β̂i = 0);  θ = θ0 + τm  (λi = λ by default).

Global scope needs min, max and softmax denominators over the whole vector, then a quantile of β:
`PCBGlobalCollector` computes them streaming in four passes (min/max; softmax sums; two RadixSelect
passes for the exact threshold of each βi), and the merge pass applies `pcb_combine` per tensor.

Options (docs/methods.md#pcb-activation, #pcb-self-term): `activation` — softmax (default) or, as in the
paper's Appendix B.1 ablation, sigmoid, ReLU or tanh applied entry-wise in its place (no denominator);
`self_term` — True (default): inter_i sums over every j, i included; False: over j ≠ i only.

Reference: `pcb_stats`, `pcb_balance`, `pcb_combine`, `pcb_merge`. CPU kernels: `pcb_minmax`, `pcb_zsums`,
`pcb_betas`, `pcb_combine_into_`, `pcb_merge_into_` (the same formulas block by block). Global statistics:
`PCBGlobalCollector`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.methods.common import LAM_RANGE, UNIT, scope_param
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, fast_kernel, method
from forgetlab.merge.select import BLOCK, RadixSelect, as_array, block_ranges, keep_count, kth_largest, on_cpu_fast_path


ACTIVATIONS = ("softmax", "sigmoid", "relu", "tanh")
"""PCB's balancing activation: softmax (the paper's) or an entry-wise one in its place (Appendix B.1)."""
_INPLACE = {"softmax": torch.Tensor.exp_, "sigmoid": torch.Tensor.sigmoid_, "relu": torch.Tensor.relu_,
            "tanh": torch.Tensor.tanh_}
_OUT = {"softmax": torch.exp, "sigmoid": torch.sigmoid, "relu": torch.relu, "tanh": torch.tanh}


def check_activation(activation: str) -> str:
    """The activation, checked against ACTIVATIONS."""
    if activation not in _OUT:
        raise ParameterError(f"PCB's activation must be one of {', '.join(ACTIVATIONS)}; got {activation!r}.")
    return activation


@dataclass
class PCBStats:
    """Statistics that fix PCB's Norm and softmax over a set of entries, and the β thresholds."""

    n_tasks: int
    lo: dict[tuple[int, int], float] = field(default_factory=dict)  # min of τi⊙τj, i ≤ j
    hi: dict[tuple[int, int], float] = field(default_factory=dict)  # max of τi⊙τj
    z_intra: list[float] = field(default_factory=list)              # Σ exp(N·Norm(τi⊙τi))
    z_pair: dict[tuple[int, int], float] = field(default_factory=dict)  # Σ exp(Norm(τi⊙τj))
    thresholds: list[float | None] = field(default_factory=list)    # k-th largest βi (None: keep none)
    activation: str = "softmax"   # softmax: z are sums of exp; otherwise an entry-wise activation, z = 1
    self_term: bool = True        # inter_i sums over j = i too

    @property
    def softmax(self) -> bool:
        """Whether the balancing activation is the softmax (its denominators are summed)."""
        return self.activation == "softmax"

    def to_dict(self) -> dict:
        key = lambda p: f"{p[0]},{p[1]}"  # noqa: E731
        return {"n_tasks": self.n_tasks, "lo": {key(k): v for k, v in self.lo.items()},
                "hi": {key(k): v for k, v in self.hi.items()}, "z_intra": list(self.z_intra),
                "z_pair": {key(k): v for k, v in self.z_pair.items()}, "thresholds": list(self.thresholds),
                "activation": self.activation, "self_term": self.self_term}


def _pairs(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(i, n)]


def _key(i: int, j: int) -> tuple[int, int]:
    return (i, j) if i <= j else (j, i)


def norm01(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """Min-max normalisation (x − lo)/(hi − lo) with fixed bounds; zeros when hi = lo."""
    if not hi > lo:
        return torch.zeros_like(x)
    return (x - lo) / (hi - lo)


def _exp_intra(tau: torch.Tensor, n_tasks: int, lo: float, hi: float, activation: str = "softmax") -> torch.Tensor:
    return _OUT[activation](n_tasks * norm01(tau * tau, lo, hi))


def _exp_pair(ti: torch.Tensor, tj: torch.Tensor, lo: float, hi: float, activation: str = "softmax") -> torch.Tensor:
    return _OUT[activation](norm01(ti * tj, lo, hi))


def pcb_balance(taus: Sequence[torch.Tensor], stats: PCBStats) -> list[torch.Tensor]:
    """βi = intra_i ⊙ inter_i for each task, with Norm bounds and softmax denominators from `stats` (and its
    activation; j = i left out of inter_i where `stats.self_term` is False)."""
    n = len(taus)
    act = stats.activation
    betas = []
    for i in range(n):
        intra = _exp_intra(taus[i], n, stats.lo[(i, i)], stats.hi[(i, i)], act) / stats.z_intra[i]
        inter = torch.zeros_like(intra)
        for j in range(n):
            if j == i and not stats.self_term:
                continue
            k = _key(i, j)
            inter += _exp_pair(taus[i], taus[j], stats.lo[k], stats.hi[k], act) / stats.z_pair[k]
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


def pcb_stats(taus: Sequence[torch.Tensor], keep: float = 0.2, activation: str = "softmax",
              self_term: bool = True) -> PCBStats:
    """PCB statistics of entries held in memory (one tensor for scope="tensor", or a concatenation); with an
    activation other than softmax the denominators are 1."""
    n = len(taus)
    st = PCBStats(n, activation=check_activation(activation), self_term=bool(self_term))
    for i, j in _pairs(n):
        prod = taus[i] * taus[j]
        st.lo[(i, j)] = float(prod.min())
        st.hi[(i, j)] = float(prod.max())
        st.z_pair[(i, j)] = (float(_exp_pair(taus[i], taus[j], st.lo[(i, j)], st.hi[(i, j)]).double().sum())
                             if st.softmax else 1.0)
    st.z_intra = [float(_exp_intra(taus[i], n, st.lo[(i, i)], st.hi[(i, i)]).double().sum()) if st.softmax
                  else 1.0 for i in range(n)]
    k = keep_count(taus[0].numel(), keep)
    st.thresholds = [None if k <= 0 else kth_largest(b, k)[0] for b in pcb_balance(taus, st)]
    return st


def pcb_merge(taus: Sequence[torch.Tensor], keep: float = 0.2, lam: float | Sequence[float] = 1.0,
              stats: PCBStats | None = None, activation: str = "softmax", self_term: bool = True) -> torch.Tensor:
    """Merged task vector of PCB: statistics from `taus` themselves unless `stats` (global ones, which then carry
    the activation and the j = i choice) is given."""
    taus = [t.to(torch.float32) for t in taus]
    st = stats if stats is not None else pcb_stats(taus, keep, activation, self_term)
    return pcb_combine(taus, pcb_balance(taus, st), st.thresholds, lam)


# -- the same formulas block by block, in place (CPU kernels)


def _pcb_exps(blocks, n_tasks, lo, hi, E: dict, Ei: list, activation: str = "softmax") -> None:
    """E[(i, j)] = exp(Norm(τi⊙τj)), Ei[i] = exp(N·Norm(τi⊙τi)) for one block (pcb._exp_pair/_exp_intra; exp is
    the activation's, e.g. tanh in place)."""
    act = _INPLACE[activation]
    for i, j in _pairs(n_tasks):
        P_ = E[(i, j)]
        l, h = lo[(i, j)], hi[(i, j)]
        if h > l:
            torch.mul(blocks[i], blocks[j], out=P_)
            P_.sub_(l).div_(h - l)
        else:
            P_.zero_()  # a constant product normalises to 0
        if i == j:
            act(torch.mul(P_, n_tasks, out=Ei[i]))
        act(P_)


def _pcb_buffers(n_tasks: int, nb: int):
    E = {p: torch.empty(nb, dtype=torch.float32) for p in _pairs(n_tasks)}
    Ei = [torch.empty(nb, dtype=torch.float32) for _ in range(n_tasks)]
    return E, Ei


def pcb_minmax(taus: Sequence[torch.Tensor], lo: dict | None = None, hi: dict | None = None) -> tuple[dict, dict]:
    """min and max of τi ⊙ τj for every pair i ≤ j (updating `lo`/`hi` when given: a streamed first pass)."""
    flat = [t.reshape(-1) for t in taus]
    n_tasks = len(flat)
    lo = {p: math.inf for p in _pairs(n_tasks)} if lo is None else lo
    hi = {p: -math.inf for p in _pairs(n_tasks)} if hi is None else hi
    size = flat[0].numel()
    P = torch.empty(min(BLOCK, size), dtype=torch.float32)
    for s, e in block_ranges(size):
        P_ = P[: e - s]
        for i, j in _pairs(n_tasks):
            torch.mul(flat[i][s:e], flat[j][s:e], out=P_)
            mn, mx = torch.aminmax(P_)
            lo[(i, j)] = min(lo[(i, j)], float(mn))
            hi[(i, j)] = max(hi[(i, j)], float(mx))
    return lo, hi


def pcb_zsums(taus: Sequence[torch.Tensor], lo: dict, hi: dict, z_pair: dict | None = None,
              z_intra: list | None = None) -> tuple[dict, list]:
    """Softmax denominators Σ exp(Norm(τi⊙τj)) and Σ exp(N·Norm(τi⊙τi)), summed in float64 (updating the
    given sums: a streamed pass). Only the softmax has them: callers use 1 for the other activations."""
    flat = [t.reshape(-1) for t in taus]
    n_tasks = len(flat)
    z_pair = {p: 0.0 for p in _pairs(n_tasks)} if z_pair is None else z_pair
    z_intra = [0.0] * n_tasks if z_intra is None else z_intra
    size = flat[0].numel()
    nb = min(BLOCK, size)
    E, Ei = _pcb_buffers(n_tasks, nb)
    for s, e in block_ranges(size):
        c = e - s
        Eb = {p: v[:c] for p, v in E.items()}
        Eib = [v[:c] for v in Ei]
        _pcb_exps([t[s:e] for t in flat], n_tasks, lo, hi, Eb, Eib)
        for p, v in Eb.items():
            z_pair[p] += float(v.sum(dtype=torch.float64))
        for i, v in enumerate(Eib):
            z_intra[i] += float(v.sum(dtype=torch.float64))
    return z_pair, z_intra


def _pcb_betas_block(blocks, n_tasks, st, Eb, Eib, outs, tmp) -> None:
    """βi = intra_i ⊙ inter_i for one block into outs[i] (the operations of pcb.pcb_balance, in its order;
    `tmp` is a scratch block, so no temporary is allocated per pair)."""
    _pcb_exps(blocks, n_tasks, st.lo, st.hi, Eb, Eib, st.activation)
    for i in range(n_tasks):
        out = outs[i]
        out.zero_()
        for j in range(n_tasks):
            if j == i and not st.self_term:
                continue
            p = (i, j) if i <= j else (j, i)
            out.add_(torch.div(Eb[p], st.z_pair[p], out=tmp))
        out.mul_(Eib[i].div_(st.z_intra[i]))


def pcb_betas(taus: Sequence[torch.Tensor], st, outs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """βi of every task into `outs` (tensors of τ's size), with the Norm bounds and denominators of `st`."""
    flat = [t.reshape(-1) for t in taus]
    n_tasks = len(flat)
    size = flat[0].numel()
    E, Ei = _pcb_buffers(n_tasks, min(BLOCK, size))
    tmp = torch.empty(min(BLOCK, size), dtype=torch.float32)
    of = [o.reshape(-1) for o in outs]
    for s, e in block_ranges(size):
        c = e - s
        _pcb_betas_block([t[s:e] for t in flat], n_tasks, st, {p: v[:c] for p, v in E.items()},
                         [v[:c] for v in Ei], [o[s:e] for o in of], tmp[:c])
    return list(outs)


def pcb_combine_into_(out: torch.Tensor, taus: Sequence[torch.Tensor], thresholds: Sequence[float | None],
                      lams: Sequence[float], betas: Sequence[torch.Tensor] | None = None, st=None) -> torch.Tensor:
    """out += Σi λi·β̂i ⊙ τi / Σi β̂i (0 where Σi β̂i = 0), β̂i = βi·[βi ≥ thresholdi] (None: keep none), in
    place and block by block (pcb.pcb_combine's operations in its order). βi come from `betas`, or are
    computed per block from the statistics `st` (global scope: nothing of τ's size is stored)."""
    flat = [t.reshape(-1) for t in taus]
    n_tasks = len(flat)
    o = out.reshape(-1)
    size = o.numel()
    nb = min(BLOCK, size)
    num, den, bh, tmp = (torch.empty(nb, dtype=torch.float32) for _ in range(4))
    shrink = [None if t is None else float(np.nextafter(np.float32(t), np.float32(-np.inf))) for t in thresholds]
    if betas is None:
        E, Ei = _pcb_buffers(n_tasks, nb)
        B = [torch.empty(nb, dtype=torch.float32) for _ in range(n_tasks)]
    else:
        bflat = [b.reshape(-1) for b in betas]
    for s, e in block_ranges(size):
        c = e - s
        num_, den_, bh_, tmp_ = num[:c], den[:c], bh[:c], tmp[:c]
        blocks = [t[s:e] for t in flat]
        if betas is None:
            bl = [b[:c] for b in B]
            _pcb_betas_block(blocks, n_tasks, st, {p: v[:c] for p, v in E.items()}, [v[:c] for v in Ei], bl,
                             tmp_)
        else:
            bl = [b[s:e] for b in bflat]
        num_.zero_()
        den_.zero_()
        for beta, tau, thr, li in zip(bl, blocks, shrink, lams):
            if thr is None:
                continue  # β̂ = 0: adds 0 to both sums
            torch.ops.aten.hardshrink.out(beta, thr, out=bh_)  # β ≥ 0: β·[β ≥ threshold]
            num_.add_(torch.mul(bh_, float(li), out=tmp_).mul_(tau))
            den_.add_(bh_)
        den_.add_(torch.eq(den_, 0, out=tmp_))  # Σ β̂ = 0: the sum of λ·β̂·τ is 0 too, divide by 1
        o[s:e].add_(num_.div_(den_))
    return out


def pcb_merge_into_(out: torch.Tensor, taus: Sequence[torch.Tensor], keep: float, lams: Sequence[float],
                    stats=None, activation: str = "softmax", self_term: bool = True) -> torch.Tensor:
    """out += PCB's merged task vector (pcb.pcb_merge): per-tensor statistics from `taus` (two blocked
    passes, βi stored once, exact k-th largest βi by selection), or the global `stats` (one blocked pass)."""
    n_tasks = len(taus)
    if stats is not None:
        return pcb_combine_into_(out, taus, stats.thresholds, lams, st=stats)
    st = PCBStats(n_tasks, activation=check_activation(activation), self_term=bool(self_term))
    st.lo, st.hi = pcb_minmax(taus)
    if st.softmax:
        st.z_pair, st.z_intra = pcb_zsums(taus, st.lo, st.hi)
    else:
        st.z_pair, st.z_intra = {p: 1.0 for p in _pairs(n_tasks)}, [1.0] * n_tasks
    betas = pcb_betas(taus, st, [torch.empty_like(out) for _ in range(n_tasks)])
    k = keep_count(out.numel(), keep)
    st.thresholds = [None if k <= 0 else kth_largest(as_array(b), k, row=int(out.shape[-1]) if out.dim() else 1)[0]
                     for b in betas]
    return pcb_combine_into_(out, taus, st.thresholds, lams, betas=betas)


class PCBGlobalCollector:
    """Streams PCB's global statistics: pass 0 min/max of every τi⊙τj, pass 1 softmax denominators (float64
    sums; 1 and nothing summed for an activation other than softmax), passes 2–3 the exact k-th largest βi
    (RadixSelect), k = keep_count(total entries, keep)."""

    passes = 4

    def __init__(self, n_tasks: int, total: int, keep: float, activation: str = "softmax", self_term: bool = True):
        self.st = PCBStats(n_tasks, activation=check_activation(activation), self_term=bool(self_term))
        self.n = n_tasks
        z0 = 0.0 if self.st.softmax else 1.0
        for p in _pairs(n_tasks):
            self.st.lo[p], self.st.hi[p], self.st.z_pair[p] = math.inf, -math.inf, z0
        self.st.z_intra = [z0] * n_tasks
        k = keep_count(total, keep)
        self.selects = [RadixSelect(k) for _ in range(n_tasks)]

    def add(self, pass_index, name, base, taus):
        taus = [t.to(torch.float32) for t in taus]
        st = self.st
        if pass_index == 1 and not st.softmax:
            return  # no denominators: they stay 1
        if on_cpu_fast_path(*taus):  # the same statistics, block by block (the kernels above)
            if pass_index == 0:
                pcb_minmax(taus, st.lo, st.hi)
            elif pass_index == 1:
                pcb_zsums(taus, st.lo, st.hi, st.z_pair, st.z_intra)
            else:
                betas = pcb_betas(taus, st, [torch.empty_like(taus[0]) for _ in taus])
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


@method("pcb", "PCB-merging: balance intra- and inter-task parameter competition, drop, average.",
        (ParamSpec("keep", "float", 0.2, "Fraction r of entries of each balance matrix β kept.", UNIT),
         ParamSpec("lam", "float", 1.0, "Scaling λ (one number, or one λi per model, e.g. from the "
                   "CMA-ES search).", LAM_RANGE, per_model=True, model_key="lam"),
         scope_param("global"),
         ParamSpec("activation", "str", "softmax", "Balancing activation: softmax (the paper's) or sigmoid, relu, "
                   "tanh entry-wise in its place (the paper's Appendix B.1 ablation).", choices=ACTIVATIONS),
         ParamSpec("self_term", "bool", True, "Inter-balancing sums over every task j, i included (true) or over "
                   "j ≠ i only (false).")),
        collector=lambda n, total, p: PCBGlobalCollector(n, total, p["keep"], p.get("activation", "softmax"),
                                                         p.get("self_term", True)),
        global_when=lambda p: p.get("scope") == "global",
        formula="θ = θ0 + Σi λi·β̂i ⊙ τi / Σi β̂i", memory=WorkingMemory(fast=(2.2, 1.1), reference=(9.9, 1.1)),
        title="PCB-merging", paper="Parameter Competition Balancing for Model Merging (PCB-merging)")
def _pcb(job: TensorJob) -> torch.Tensor:
    p = job.params
    stats = job.stats if p["scope"] == "global" else None
    return job.base + pcb_merge(job.take_taus(), p["keep"], p["lam"], stats, p.get("activation", "softmax"),
                                p.get("self_term", True))


@fast_kernel("pcb")
def _pcb_fast(job: TensorJob) -> torch.Tensor:
    # blocked passes, exact selection of the β thresholds
    p = job.params
    stats = job.stats if p["scope"] == "global" else None
    taus = job.take_taus()
    lams = [float(p["lam"])] * len(taus) if isinstance(p["lam"], (int, float)) else p["lam"]
    return pcb_merge_into_(job.base, taus, p["keep"], lams, stats, p.get("activation", "softmax"),
                           p.get("self_term", True))
