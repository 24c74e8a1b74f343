"""CPU kernels of the merge methods that run at the memory-bandwidth limit (issue 15; docs/merging.md).

A merge must read every input byte and write the output once; everything else is arithmetic on tensors
that, for the embeddings of a small model already, do not fit in a cache. torch's element-wise kernels are
fast on float tensors (~0.1–0.5 ns per entry on one thread) but slow wherever a bool tensor is made or used
(a comparison ~0.7 ns, `torch.where` ~3 ns, a masked multiply ~1 ns), and `torch.kthvalue` costs ~20 ns per
entry. These kernels therefore

- select exactly instead of sorting: `kth_largest` brackets the k-th largest value with a strided sample,
  counts the entries above the bracket, and runs `numpy.partition` only on the few entries inside it (about
  1–3 % of them); a bracket that misses (e.g. many ties) falls back to `numpy.partition` of everything. The
  result is the exact k-th largest value, bit-identical to `torch.kthvalue`;
- use numpy's comparisons and masks (~0.1 ns per entry) and torch's float arithmetic in place (a sign
  election is `(S ≥ 0)·2 − 1` as floats, an agreement count a sum of `sign(max(σ·τ, 0))`);
- work on blocks of `BLOCK` entries, so that the five to ten element-wise steps of a merge read and write
  memory once per block instead of once per step.

They apply to float32 tensors on the CPU. On another device (CUDA) the methods keep their torch code path
(`torch.kthvalue` is fast on a GPU, and no tensor leaves the device); `DEVICE_PATH_ON_CPU = True` makes
the CPU take that path too, which is how the tests cover it without a GPU.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

# Entries per block of the blocked loops: 64 Ki float32 = 256 KiB per array, so the arrays of one block of a
# 3-model merge stay within a 2 MiB L2 cache.
BLOCK = 1 << 16

# Tests set this to run the device (torch) code path on the CPU.
DEVICE_PATH_ON_CPU = False

# Below this many entries the exact selection is a plain numpy.partition (sampling would not pay).
_SMALL = 1 << 12

# Half-width of the sampled bracket in standard deviations of the sample quantile: a miss (probability
# ~5e-4 per selection at 3.5, more where the stride meets structure) only costs a full numpy.partition.
_Z = 3.5


def on_cpu_fast_path(*tensors: torch.Tensor) -> bool:
    """Whether these tensors take the numpy kernels: float32, on the CPU, and not forced onto the device path."""
    if DEVICE_PATH_ON_CPU:
        return False
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


def as_array(t: torch.Tensor) -> np.ndarray:
    """Flat numpy view of a contiguous CPU tensor (no copy: writes go to the tensor)."""
    if not t.is_contiguous():
        raise ValueError("internal: kernels work on contiguous tensors")
    return t.detach().reshape(-1).numpy()


def _coprime_step(step: int, row: int) -> int:
    # A stride that shares a factor with the row length samples a few columns only (biased when columns
    # differ in scale, e.g. outlier channels); a coprime stride walks across all of them.
    step = max(1, step)
    while row > 1 and math.gcd(step, row) != 1:
        step += 1
    return step


def _blocks(n: int):
    for s in range(0, n, BLOCK):
        yield s, min(n, s + BLOCK)


def _scores(x: np.ndarray, absolute: bool, s: int, e: int, buf: np.ndarray) -> np.ndarray:
    blk = x[s:e]
    return np.abs(blk, out=buf[: e - s]) if absolute else blk


def kth_largest(x: np.ndarray, k: int, row: int = 1, absolute: bool = False) -> tuple[float, int]:
    """Exact k-th largest entry of a flat float array without NaN (of |x| when `absolute`), 1 ≤ k ≤ x.size,
    and how many entries are ≥ it (k unless entries tie at that value).

    Bracket: a strided sample of m ≈ 2·n^(2/3) entries (stride coprime with `row`, the tensor's last
    dimension) gives the sample quantiles lo ≤ hi around rank k with a margin of `_Z` standard deviations;
    one blocked pass counts #(> hi) and gathers the entries in [lo, hi]; if k − #(> hi) falls among them the
    value is selected there (numpy.partition), else among all entries (still exact, just slower).
    """
    n = x.size
    if not 1 <= k <= n:
        raise ValueError(f"internal: k={k} for {n} entries")
    if n <= _SMALL:
        a = np.abs(x) if absolute else x
        part = np.partition(a, n - k)
        v = part[n - k]
        return float(v), int(k + np.count_nonzero(part[: n - k] == v))
    m = int(min(n // 4, max(1024, 2.0 * n ** (2.0 / 3.0))))
    step = _coprime_step(n // m, row)
    sample = np.abs(x[::step]) if absolute else x[::step].copy()
    m = sample.size
    q = (n - k) / n  # quantile of the target, counted from the bottom
    d = _Z * math.sqrt(max(q * (1 - q), 1.0 / m) / m) + 2.0 / m
    ilo, ihi = int(math.floor((q - d) * (m - 1))), int(math.ceil((q + d) * (m - 1)))
    idx = [i for i in (ilo, ihi) if 0 <= i < m]
    part = np.partition(sample, idx) if idx else sample
    lo = part[ilo] if ilo >= 0 else -np.inf
    hi = part[ihi] if ihi < m else np.inf
    nb = min(BLOCK, n)
    buf, above, inside = np.empty(nb, x.dtype), np.empty(nb, np.bool_), np.empty(nb, np.bool_)
    n_above, chunks = 0, []
    for s, e in _blocks(n):
        c = e - s
        a, ab, ins = _scores(x, absolute, s, e, buf), above[:c], inside[:c]
        np.greater(a, hi, out=ab)
        n_above += int(np.count_nonzero(ab))
        np.greater_equal(a, lo, out=ins)
        np.logical_xor(ins, ab, out=ins)  # lo ≤ a ≤ hi (> hi implies ≥ lo)
        chunks.append(np.compress(ins, a))  # ~1 ns per entry; a[ins] measured ~2.8 ns
    vals = np.concatenate(chunks)
    rank = k - n_above  # rank of the target among the entries in [lo, hi], from the top
    if 1 <= rank <= vals.size:
        j = vals.size - rank
        part = np.partition(vals, j)
        v = part[j]
        return float(v), int(n_above + rank + np.count_nonzero(part[:j] == v))
    a = np.abs(x) if absolute else x  # the bracket missed: select among all entries
    part = np.partition(a, n - k)
    v = part[n - k]
    return float(v), int(k + np.count_nonzero(part[: n - k] == v))


def keep_top_(t: torch.Tensor, k: int, score: torch.Tensor | None = None) -> torch.Tensor:
    """Keep, in place, the entries of `t` at the k largest scores (default score |t|) and zero the rest:
    `t * sparsify.topk_mask(score, k)` exactly (ties at the cut broken by storage order, first wins; a
    zeroed negative entry is −0.0 as there) without a sort or a bool tensor of the whole size.
    `t` and `score` are contiguous float32 CPU tensors with the same number of entries, no NaN in `score`."""
    arr = as_array(t)
    n = arr.size
    if k >= n:
        return t
    if k <= 0:
        arr *= np.float32(0)
        return t
    absolute = score is None
    sc = arr if absolute else as_array(score)
    row = int(t.shape[-1]) if t.dim() else 1
    cut, n_ge = kth_largest(sc, k, row, absolute)
    nb = min(BLOCK, n)
    buf, keep = np.empty(nb, np.float32), np.empty(nb, np.bool_)
    for s, e in _blocks(n):
        c = e - s
        np.greater_equal(_scores(sc, absolute, s, e, buf), cut, out=keep[:c])
        blk = arr[s:e]
        np.multiply(blk, keep[:c], out=blk)
    if n_ge > k:  # ties at the cut: keep the first tied entries in storage order (kept entries still score cut)
        full = np.abs(arr) if absolute else sc
        tied = np.flatnonzero(full == np.float32(cut))
        n_gt = n_ge - tied.size
        arr[tied[k - n_gt:]] *= np.float32(0)
    return t


def top_cut_(t: torch.Tensor, k: int) -> float | None:
    """The cut that keeps exactly the k entries of largest |t|: entries with |t| ≥ cut (None: all, k ≥ n;
    +∞: none, k ≤ 0). When entries tie at the cut, the tied ones after the first k − #(> cut) in storage
    order are set to ±0 in place (as `t * sparsify.topk_mask(|t|, k)` drops them), so that the cut then
    keeps exactly k. For `ties_combine_into_(…, cuts=…)`, which applies the cut inside its blocks."""
    arr = as_array(t)
    n = arr.size
    if k >= n:
        return None
    if k <= 0:
        return math.inf
    cut, n_ge = kth_largest(arr, k, int(t.shape[-1]) if t.dim() else 1, absolute=True)
    if n_ge > k and cut > 0:  # cut = 0: every non-zero entry is kept, zeros add nothing either way
        tied = np.flatnonzero(np.abs(arr) == np.float32(cut))
        arr[tied[k - (n_ge - tied.size):]] *= np.float32(0)
    return cut


def threshold_(tau: torch.Tensor, threshold: float | None) -> torch.Tensor:
    """Keep, in place, the entries with |τ| ≥ threshold (global-scope trimming: `τ ⊙ [|τ| ≥ thr]`); None
    (a keep count of 0) zeroes everything."""
    arr = as_array(tau)
    if threshold is None:
        arr *= np.float32(0)
        return tau
    nb = min(BLOCK, arr.size)
    buf, keep = np.empty(nb, np.float32), np.empty(nb, np.bool_)
    for s, e in _blocks(arr.size):
        c = e - s
        np.greater_equal(_scores(arr, True, s, e, buf), np.float32(threshold), out=keep[:c])
        blk = arr[s:e]
        np.multiply(blk, keep[:c], out=blk)
    return tau


def _sum_rows(T: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = T[0] + T[1] + … in that order (the order in which `stack.sum(dim=0)` adds; a strided
    torch.sum over dim 0 of a block measured ~3× slower than these adds)."""
    if T.shape[0] == 1:
        return out.copy_(T[0])
    torch.add(T[0], T[1], out=out)
    for r in range(2, T.shape[0]):
        out.add_(T[r])
    return out


def ties_combine_into_(out: torch.Tensor, taus: Sequence[torch.Tensor], weights: Sequence[float] | None,
                       lam: float, cuts: Sequence[float | None] | None = None) -> torch.Tensor:
    """out += λ·disjoint_mean(sign_elect(trim(τt))) in place, block by block (METHODS.md, TIES; mergekit's
    weighted form, see forgetlab.merge.ties). `taus` are left as they are.

    Trim: with `cuts`, model t keeps the entries with |τt| ≥ cuts[t] (the exact k-th largest |τt| from
    `kth_largest`, or a global threshold; +∞ keeps nothing, None everything) — τ̂t = τt·[|τt| ≥ cut], as
    `τ * mask` in the reference (ties at a cut must have been settled by the caller, see `settle_ties_`).
    Per entry, with v_t = wt·τ̂t: S = Σt v_t, elected sign σ = +1 where S ≥ 0 else −1; u_t = max(σ·v_t, 0)
    is |v_t| where its sign agrees and 0 elsewhere, so the agreeing sum is σ·Σt u_t (the same terms summed
    over the model axis of a stacked block, as `ties.ties_combine` sums its stack: bit-identical) and the
    agreeing weight Σt wt·sign(u_t); merged = σ·Σ u / that weight (1 where it is 0: nothing agrees, Σ u = 0).
    """
    flat = [t.reshape(-1) for t in taus]
    o = out.reshape(-1)
    n_models = len(flat)
    w = [1.0] * n_models if weights is None else [float(x) for x in weights]
    unit = all(x == 1.0 for x in w)
    size = o.numel()
    nb = min(BLOCK, size)
    T = torch.empty((n_models, nb), dtype=torch.float32)
    S, sg, num, den = (torch.empty(nb, dtype=torch.float32) for _ in range(4))
    # |τ| ≥ cut ⇔ |τ| > the float just below cut: hardshrink(τ, that) keeps exactly the entries the cut keeps, in
    # one op (abs + compare + multiply took three); a dropped entry is +0 where `τ * mask` gives −0 for τ < 0
    # (the same value: the merged entry is then 0 either way).
    shrink = None if cuts is None else [None if c is None else float(np.nextafter(np.float32(c), np.float32(-np.inf)))
                                        for c in cuts]
    trim = shrink is not None and any(c is not None for c in shrink)
    wcol = None if unit else torch.tensor([[x] for x in w], dtype=torch.float32)
    for s, e in _blocks(size):
        c = e - s
        T_, S_, sg_, num_, den_ = T[:, :c], S[:c], sg[:c], num[:c], den[:c]
        blocks = [t[s:e] for t in flat]
        if trim:
            for j, b in enumerate(blocks):
                if shrink[j] is None:
                    T_[j].copy_(b)
                else:
                    torch.ops.aten.hardshrink.out(b, shrink[j], out=T_[j])  # τ̂ = τ·[|τ| ≥ cut]
        else:
            for j, b in enumerate(blocks):
                T_[j].copy_(b)
        if wcol is not None:
            T_.mul_(wcol)
        _sum_rows(T_, S_)
        torch.ge(S_, 0, out=sg_)
        sg_.mul_(2).sub_(1)  # σ = ±1
        T_.mul_(sg_).clamp_min_(0)  # u
        _sum_rows(T_, num_)
        T_.sign_()  # [agree]
        if wcol is not None:
            T_.mul_(wcol)
        _sum_rows(T_, den_)
        if unit:
            den_.clamp_min_(1)  # a count: 0 → 1
        else:
            den_.add_(torch.eq(den_, 0, out=S_))
        num_.div_(den_).mul_(sg_)
        if lam != 1:
            num_.mul_(lam)
        o[s:e].add_(num_)
    return out


def dare_(tau: torch.Tensor, drop: float, generator: torch.Generator) -> torch.Tensor:
    """DARE in place (METHODS.md): τ·[u ≥ p]/(1 − p) with u ~ U[0, 1) drawn from `generator` block by block —
    the same draws, in the same order, as `sparsify.dare_mask` makes for the whole tensor, so the same mask
    (the test compares them); the mask is a float block, not a bool tensor of the whole size."""
    flat = tau.reshape(-1)
    if drop <= 0:
        return tau
    if drop >= 1:
        return flat.mul_(0).reshape(tau.shape)
    u = torch.empty(min(BLOCK, flat.numel()), dtype=torch.float32)
    scale = 1.0 - drop
    for s, e in _blocks(flat.numel()):
        u_ = u[: e - s]
        torch.rand(e - s, generator=generator, out=u_)
        torch.ge(u_, drop, out=u_)
        flat[s:e].mul_(u_).div_(scale)
    return tau


def consensus_into_(out: torch.Tensor, taus: Sequence[torch.Tensor], lams: Sequence[float], k: int,
                    alpha: float) -> torch.Tensor:
    """out += α·(Σt τt) ⊙ [Σt mt ≥ k] in place, mt = |τt| ≥ λt·|Σs τs − τt| (METHODS.md, Consensus / TALL
    masks), block by block with float masks; the same operations in the same order as
    `consensus.consensus_merge` (total = 0 + τ1 + τ2 + …, masks counted as 1.0/0.0)."""
    flat = [t.reshape(-1) for t in taus]
    o = out.reshape(-1)
    nb = min(BLOCK, o.numel())
    tot, d, m, cnt = (torch.empty(nb, dtype=torch.float32) for _ in range(4))
    for s, e in _blocks(o.numel()):
        c = e - s
        tot_, d_, m_, cnt_ = tot[:c], d[:c], m[:c], cnt[:c]
        blocks = [t[s:e] for t in flat]
        tot_.zero_()
        for b in blocks:
            tot_.add_(b)
        cnt_.zero_()
        for b, lt in zip(blocks, lams):
            torch.sub(tot_, b, out=d_).abs_().mul_(float(lt))
            torch.abs(b, out=m_)
            torch.ge(m_, d_, out=m_)
            cnt_.add_(m_)
        torch.ge(cnt_, int(k), out=cnt_)
        tot_.mul_(alpha).mul_(cnt_)
        o[s:e].add_(tot_)
    return out


def fapm_score_into(score: torch.Tensor, tau: torch.Tensor, w0_abs: torch.Tensor, mean0: float | None,
                    kind: str) -> torch.Tensor:
    """FAPM's pruning score of τ into `score` (METHODS.md, FAPM; the rules of `fapm.fapm_scores`), block by
    block without torch.where: "fapm" S = |τ| − mean(|W0|)·|τ|/|W0|, "relative" S = −|τ|/|W0|, "magnitude"
    S = |τ|; `mean0` = mean(|W0|), None for an all-zero base (then "fapm" scores by magnitude). |τ|/|W0| is
    +∞ where W0 = 0 and τ ≠ 0 by itself; the one NaN, 0/0 where τ = 0 and W0 = 0, is the reference's 0."""
    flat, w, sc = tau.reshape(-1), w0_abs.reshape(-1), score.reshape(-1)
    if kind == "magnitude" or (kind == "fapm" and mean0 is None):
        return torch.abs(flat, out=sc).reshape(score.shape)
    inf = math.inf
    for s, e in _blocks(flat.numel()):
        b, sc_ = flat[s:e], sc[s:e]
        torch.abs(b, out=sc_)
        if kind == "relative":
            sc_.div_(w[s:e]).neg_()
        else:
            rel = torch.div(sc_, w[s:e])
            sc_.sub_(rel.mul_(mean0))
        torch.nan_to_num_(sc_, nan=0.0, posinf=inf, neginf=-inf)
    return score


def fapm_prune_(tau: torch.Tensor, w0_abs: torch.Tensor, mean0: float | None, ratio: float, kind: str,
                score: torch.Tensor) -> torch.Tensor:
    """FAPM pruning in place: keep the n − ⌊ratio·n⌋ entries of τ with the largest score (exact selection,
    ties by storage order as `sparsify.topk_mask`), zero the rest (`fapm.fapm_prune`). `score` is scratch of
    τ's size."""
    if float(ratio) <= 0:
        return tau
    n = tau.numel()
    k = n - int(float(ratio) * n)
    if k >= n:
        return tau
    if kind == "magnitude" or (kind == "fapm" and mean0 is None):
        return keep_top_(tau, k)
    return keep_top_(tau, k, fapm_score_into(score, tau, w0_abs, mean0, kind))


def breadcrumbs_(tau: torch.Tensor, n_top: int, n_keep: int) -> torch.Tensor:
    """Breadcrumbs in place (METHODS.md): keep the entries ranked n_top + 1 … n_top + n_keep by |τ|, i.e.
    τ·(topk(|τ|, n_top + n_keep) ∧ ¬topk(|τ|, n_top)) exactly as `sparsify.breadcrumbs_mask` (ties at either
    cut broken by storage order, first wins). Without ties at the cuts: one blocked pass keeping
    lo ≤ |τ| < hi; with ties: the same masks built in numpy with the tied entries settled."""
    arr = as_array(tau)
    n = arr.size
    k1, k2 = n_top + n_keep, n_top
    row = int(tau.shape[-1]) if tau.dim() else 1
    if k1 <= 0:
        arr *= np.float32(0)
        return tau
    lo, n_ge1 = (-math.inf, n) if k1 >= n else kth_largest(arr, k1, row, absolute=True)
    hi, n_ge2 = (math.inf, 0) if k2 <= 0 else kth_largest(arr, k2, row, absolute=True)
    ties1 = k1 < n and n_ge1 > k1 and lo > 0  # ties at a cut of 0 change nothing: those entries are 0
    ties2 = k2 > 0 and n_ge2 > k2 and hi > 0
    if not ties1 and not ties2:
        nb = min(BLOCK, n)
        buf, keep, below = np.empty(nb, np.float32), np.empty(nb, np.bool_), np.empty(nb, np.bool_)
        for s, e in _blocks(n):
            c = e - s
            a = _scores(arr, True, s, e, buf)
            np.greater_equal(a, np.float32(lo), out=keep[:c])
            np.less(a, np.float32(hi), out=below[:c])
            np.logical_and(keep[:c], below[:c], out=keep[:c])
            blk = arr[s:e]
            np.multiply(blk, keep[:c], out=blk)
        return tau
    a = np.abs(arr)
    outer = np.greater_equal(a, np.float32(lo))
    if ties1:
        tied = np.flatnonzero(a == np.float32(lo))
        outer[tied[k1 - (n_ge1 - tied.size):]] = False
    if k2 > 0:
        inner = np.greater_equal(a, np.float32(hi))
        if ties2:
            tied = np.flatnonzero(a == np.float32(hi))
            inner[tied[k2 - (n_ge2 - tied.size):]] = False
        outer &= ~inner
    np.multiply(arr, outer, out=arr)
    return tau


# -- PCB (METHODS.md, PCB-merging): the formulas of forgetlab.merge.pcb, block by block

def _pcb_pairs(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(i, n)]


def pcb_minmax(taus: Sequence[torch.Tensor], lo: dict | None = None, hi: dict | None = None) -> tuple[dict, dict]:
    """min and max of τi ⊙ τj for every pair i ≤ j (updating `lo`/`hi` when given: a streamed first pass)."""
    flat = [t.reshape(-1) for t in taus]
    n_tasks = len(flat)
    lo = {p: math.inf for p in _pcb_pairs(n_tasks)} if lo is None else lo
    hi = {p: -math.inf for p in _pcb_pairs(n_tasks)} if hi is None else hi
    size = flat[0].numel()
    P = torch.empty(min(BLOCK, size), dtype=torch.float32)
    for s, e in _blocks(size):
        P_ = P[: e - s]
        for i, j in _pcb_pairs(n_tasks):
            torch.mul(flat[i][s:e], flat[j][s:e], out=P_)
            mn, mx = torch.aminmax(P_)
            lo[(i, j)] = min(lo[(i, j)], float(mn))
            hi[(i, j)] = max(hi[(i, j)], float(mx))
    return lo, hi


def _pcb_exps(blocks, n_tasks, lo, hi, E: dict, Ei: list) -> None:
    """E[(i, j)] = exp(Norm(τi⊙τj)), Ei[i] = exp(N·Norm(τi⊙τi)) for one block (pcb._exp_pair/_exp_intra)."""
    for i, j in _pcb_pairs(n_tasks):
        P_ = E[(i, j)]
        l, h = lo[(i, j)], hi[(i, j)]
        if h > l:
            torch.mul(blocks[i], blocks[j], out=P_)
            P_.sub_(l).div_(h - l)
        else:
            P_.zero_()  # a constant product normalises to 0
        if i == j:
            torch.mul(P_, n_tasks, out=Ei[i]).exp_()
        P_.exp_()


def _pcb_buffers(n_tasks: int, nb: int):
    E = {p: torch.empty(nb, dtype=torch.float32) for p in _pcb_pairs(n_tasks)}
    Ei = [torch.empty(nb, dtype=torch.float32) for _ in range(n_tasks)]
    return E, Ei


def pcb_zsums(taus: Sequence[torch.Tensor], lo: dict, hi: dict, z_pair: dict | None = None,
              z_intra: list | None = None) -> tuple[dict, list]:
    """Softmax denominators Σ exp(Norm(τi⊙τj)) and Σ exp(N·Norm(τi⊙τi)), summed in float64 (updating the
    given sums: a streamed pass)."""
    flat = [t.reshape(-1) for t in taus]
    n_tasks = len(flat)
    z_pair = {p: 0.0 for p in _pcb_pairs(n_tasks)} if z_pair is None else z_pair
    z_intra = [0.0] * n_tasks if z_intra is None else z_intra
    size = flat[0].numel()
    nb = min(BLOCK, size)
    E, Ei = _pcb_buffers(n_tasks, nb)
    for s, e in _blocks(size):
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
    _pcb_exps(blocks, n_tasks, st.lo, st.hi, Eb, Eib)
    for i in range(n_tasks):
        out = outs[i]
        out.zero_()
        for j in range(n_tasks):
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
    for s, e in _blocks(size):
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
    for s, e in _blocks(size):
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
                    stats=None) -> torch.Tensor:
    """out += PCB's merged task vector (pcb.pcb_merge): per-tensor statistics from `taus` (two blocked
    passes, βi stored once, exact k-th largest βi by selection), or the global `stats` (one blocked pass)."""
    from forgetlab.merge.pcb import PCBStats
    from forgetlab.merge.sparsify import keep_count
    n_tasks = len(taus)
    if stats is not None:
        return pcb_combine_into_(out, taus, stats.thresholds, lams, st=stats)
    st = PCBStats(n_tasks)
    st.lo, st.hi = pcb_minmax(taus)
    st.z_pair, st.z_intra = pcb_zsums(taus, st.lo, st.hi)
    betas = pcb_betas(taus, st, [torch.empty_like(out) for _ in range(n_tasks)])
    k = keep_count(out.numel(), keep)
    st.thresholds = [None if k <= 0 else kth_largest(as_array(b), k, int(out.shape[-1]) if out.dim() else 1)[0]
                     for b in betas]
    return pcb_combine_into_(out, taus, st.thresholds, lams, betas=betas)
