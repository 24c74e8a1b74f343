"""Exact selection: the k-th largest entry of a tensor, top-k and threshold masks, and their in-place
forms — the building blocks every sparsifying merge method shares (one home for "keep the k largest").

- `kth_largest(values, k)`: the exact k-th largest value and how many entries reach it. On the CPU (float32,
  contiguous) a strided sample brackets the target rank and `numpy.partition` runs only on the entries inside
  the bracket (~1–3 % of them); elsewhere the same bracketing with `torch.kthvalue` (on a GPU `torch.sort`,
  `_smallest`). A bracket that misses falls back to a full selection, so the value is always exact —
  bit-identical to `torch.kthvalue`.
- `topk_mask`, `threshold_mask`, `keep_count`: the reference masks (ties at the cut broken by storage order,
  first wins); `keep_top_`, `top_cut_`, `threshold_`: the same selections applied in place on the CPU, block
  by block, without a bool tensor of the whole size.
- `RadixSelect`: the exact k-th largest of a vector streamed tensor by tensor (global-scope methods), in two
  passes with 65,536-bin histograms of the float bits.

CPU kernels (`on_cpu_fast_path`): float32 tensors on the CPU go through numpy's comparisons and masks (~0.1 ns
per entry, where a torch bool tensor costs ~1–3 ns) in blocks of `BLOCK` entries that stay in cache.
`DEVICE_PATH_ON_CPU = True` makes the CPU take the torch (device) path, which is how tests cover it without a GPU.
"""
from __future__ import annotations

import math

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


def block_ranges(n: int):
    for s in range(0, n, BLOCK):
        yield s, min(n, s + BLOCK)


def score_block(x: np.ndarray, absolute: bool, s: int, e: int, buf: np.ndarray) -> np.ndarray:
    blk = x[s:e]
    return np.abs(blk, out=buf[: e - s]) if absolute else blk


def _kth_largest_array(x: np.ndarray, k: int, row: int = 1, absolute: bool = False) -> tuple[float, int]:
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
    for s, e in block_ranges(n):
        c = e - s
        a, ab, ins = score_block(x, absolute, s, e, buf), above[:c], inside[:c]
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


def _smallest(values: torch.Tensor, j: int, by_sort: bool | None = None) -> torch.Tensor:
    """The exact j-th smallest entry (1-based) of a flat tensor, as a 0-d tensor: torch.kthvalue, except on a GPU
    (`by_sort` None: the tensor's device decides), where torch.sort's device-wide radix sort is ~20× faster than
    kthvalue on one large slice (kthvalue runs a slice in one thread block: pytorch/pytorch#75599) and gives the
    same value."""
    if values.device.type == "cuda" if by_sort is None else by_sort:
        return torch.sort(values).values[j - 1]
    return torch.kthvalue(values, j).values


def _kth_largest_tensor(values: torch.Tensor, k: int) -> torch.Tensor:
    """Exact k-th largest entry of a flat float tensor (1 ≤ k ≤ n), as a 0-d tensor.

    Large tensors avoid a full selection: a strided sample of ~65k entries brackets the target rank with a
    margin of 4/√(sample), the bracket is checked by counting (the k-th largest lies in [lo, hi] iff
    #(> hi) < k ≤ #(≥ lo)), and only the entries inside it go to a selection (`_smallest`). When the check fails
    (odd distributions, many ties) the whole tensor does. Either way the result is exact.
    """
    n = values.numel()
    if n <= (1 << 20):
        return _smallest(values, n - k + 1)
    step = max(1, n // 65536)
    sample = values[::step]
    s = sample.numel()
    q = 1.0 - k / n
    margin = 4.0 / math.sqrt(s)
    ordered = torch.sort(sample).values
    lo = ordered[max(0, int(math.floor((q - margin) * (s - 1))))]
    hi = ordered[min(s - 1, int(math.ceil((q + margin) * (s - 1))))]
    above = int(torch.count_nonzero(values > hi))
    inside = values[(values >= lo) & (values <= hi)]
    rank = k - above
    if 0 < rank <= inside.numel():
        return _smallest(inside, inside.numel() - rank + 1)
    return _smallest(values, n - k + 1)


def kth_largest(values: torch.Tensor | np.ndarray, k: int, *, absolute: bool = False,
                row: int | None = None) -> tuple[float, int]:
    """Exact k-th largest entry (of |values| when `absolute`), 1 ≤ k ≤ n, and how many entries are ≥ it (k
    unless entries tie at that value). A numpy array or a CPU float32 tensor takes the numpy selection (`row`,
    the tensor's last dimension, keeps the sample's stride from walking a few columns only); any other tensor
    the torch one. No NaN among the values."""
    if isinstance(values, np.ndarray):
        return _kth_largest_array(values, k, row or 1, absolute)
    if on_cpu_fast_path(values):
        return _kth_largest_array(as_array(values), k, row or (int(values.shape[-1]) if values.dim() else 1),
                                  absolute)
    flat = values.reshape(-1)
    flat = flat.abs() if absolute else flat
    n = flat.numel()
    if not 1 <= k <= n:
        raise ValueError(f"internal: k={k} for {n} entries")
    cut = _kth_largest_tensor(flat, k)
    return float(cut), int(torch.count_nonzero(flat >= cut))


def keep_count(n: int, keep: float) -> int:
    """Entries kept out of `n` for a keep fraction: 0 if keep ≤ 0, n if keep ≥ 1, else max(1, ⌊keep·n⌋)."""
    if n <= 0 or keep <= 0:
        return 0
    if keep >= 1:
        return n
    return max(1, int(keep * n))


def topk_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask (shape of `scores`) selecting exactly the `k` largest scores.

    The cut is the exact k-th largest value (`kth_largest`'s torch selection); entries at or above it are kept, and if
    several entries equal the cut, they are kept in storage order until k are selected, so the result is
    deterministic and nested in k.
    """
    flat = scores.reshape(-1)
    n = flat.numel()
    if k <= 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    if k >= n:
        return torch.ones_like(scores, dtype=torch.bool)
    work = flat if flat.dtype in (torch.float32, torch.float64) else flat.float()
    cut = _kth_largest_tensor(work, k)   # the torch selection: the reference the CPU kernels are tested against
    mask = work >= cut
    if int(torch.count_nonzero(mask)) != k:  # ties at the cut: keep the first ones in storage order
        mask = work > cut
        missing = k - int(torch.count_nonzero(mask))
        idx = (work == cut).nonzero().reshape(-1)[:missing]
        mask[idx] = True
    return mask.reshape(scores.shape)


def threshold_mask(scores: torch.Tensor, threshold: float | None) -> torch.Tensor:
    """Entries with score ≥ `threshold`; `None` means keep nothing (a keep count of 0)."""
    if threshold is None:
        return torch.zeros_like(scores, dtype=torch.bool)
    return scores >= threshold


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
    cut, n_ge = _kth_largest_array(sc, k, row, absolute)
    nb = min(BLOCK, n)
    buf, keep = np.empty(nb, np.float32), np.empty(nb, np.bool_)
    for s, e in block_ranges(n):
        c = e - s
        np.greater_equal(score_block(sc, absolute, s, e, buf), cut, out=keep[:c])
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
    cut, n_ge = _kth_largest_array(arr, k, int(t.shape[-1]) if t.dim() else 1, True)
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
    for s, e in block_ranges(arr.size):
        c = e - s
        np.greater_equal(score_block(arr, True, s, e, buf), np.float32(threshold), out=keep[:c])
        blk = arr[s:e]
        np.multiply(blk, keep[:c], out=blk)
    return tau


_BINS = 1 << 16


_LITTLE = __import__("sys").byteorder == "little"


_FLUSH = 1 << 20


class RadixSelect:
    """Exact k-th largest of non-negative float32 values fed in two passes (`add`, `advance`, `add`, `advance`).

    k = 0 means "select nothing": `value` is None. Stage 0 reads the high 16 bits, stage 1 the low 16 bits.
    """

    def __init__(self, k: int):
        self.k = int(k)
        self.stage = 0 if self.k > 0 else 2
        self.hist = torch.zeros(_BINS, dtype=torch.int64)
        self.high: int | None = None
        self.k_rem: int | None = None
        self._value: float | None = None
        self._pending: list = []  # parts not yet counted (see _add_halves)
        self._pending_n = 0

    @staticmethod
    def _bits(values: torch.Tensor) -> torch.Tensor:
        v = values.detach().to(dtype=torch.float32).contiguous().reshape(-1)
        return v.view(torch.int32) & 0x7FFFFFFF  # clears the sign of −0.0; inputs are non-negative

    def _count(self, counts: torch.Tensor) -> None:
        """Add a histogram, on the device it was counted on: values on a GPU are counted there (copying every
        tensor to the host for a CPU bincount made PCB's global pass the slowest part of a GPU merge)."""
        if self.hist.device != counts.device:
            self.hist = self.hist.to(counts.device)
        self.hist += counts

    def add(self, values: torch.Tensor) -> None:
        """Count one chunk of values in the current stage (no-op once done)."""
        if self.stage < 2 and _LITTLE and on_cpu_fast_path(values):
            self._add_halves(values)
        elif self.stage == 0:
            hi = self._bits(values) >> 16
            self._count(torch.bincount(hi, minlength=_BINS)[:_BINS])
        elif self.stage == 1:
            bits = self._bits(values)
            sel = bits[(bits >> 16) == self.high] & 0xFFFF
            if sel.numel():
                self._count(torch.bincount(sel, minlength=_BINS)[:_BINS])

    def _add_halves(self, values: torch.Tensor) -> None:
        """`add` on a little-endian CPU: the high and low 16 bits of each float32 are the odd and even uint16
        of its memory, so a histogram of them is numpy.bincount of a strided view (no shift, no mask, no
        int64 copy; ~3 ns per value where the torch ops took ~8), and stage 1 picks the low halves of the
        values in the chosen bin with a comparison and numpy.compress (~1 ns per value, the bool-indexed
        torch gather took ~10). Bins ≥ 0x8000 (sign bit set: −0.0 of a non-negative input) fold onto
        bins − 0x8000, as the mask of `_bits` does."""
        u16 = values.detach().contiguous().reshape(-1).numpy().view(np.uint16)
        high, low = u16[1::2], u16[0::2]
        if self.stage == 0:
            part = high if high.size >= _FLUSH else high.copy()
        else:
            part = np.compress(np.equal(high, self.high) | np.equal(high, self.high | 0x8000), low)
        if part.size:  # small parts wait: a 65,536-bin count has a fixed cost per call
            self._pending.append(part)
            self._pending_n += part.size
            if self._pending_n >= _FLUSH:
                self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        parts, self._pending, self._pending_n = self._pending, [], 0
        h = sum(np.bincount(p, minlength=_BINS) for p in parts) if len(parts) < 4 else \
            np.bincount(np.concatenate(parts), minlength=_BINS)
        if self.stage == 0:
            h = np.concatenate([h[: _BINS // 2] + h[_BINS // 2:], np.zeros(_BINS // 2, h.dtype)])
        self._count(torch.from_numpy(h).to(self.hist.device))

    @staticmethod
    def _find(hist: torch.Tensor, k: int) -> tuple[int, int]:
        """Bin b holding the k-th largest, and the rank of the target within the bin (from its top)."""
        ge = torch.flip(torch.cumsum(torch.flip(hist, [0]), 0), [0])  # ge[b] = #values in bins ≥ b
        ok = (ge >= k).nonzero()
        if ok.numel() == 0:
            raise ValueError(f"RadixSelect: asked for the {k}-th largest of {int(hist.sum())} values.")
        b = int(ok[-1])
        above = int(ge[b + 1]) if b + 1 < _BINS else 0
        return b, k - above

    def advance(self) -> None:
        """Close the current pass."""
        self._flush()
        if self.stage == 0:
            self.high, self.k_rem = self._find(self.hist, self.k)
            self.hist = torch.zeros(_BINS, dtype=torch.int64)
            self.stage = 1
        elif self.stage == 1:
            low, _ = self._find(self.hist, self.k_rem)
            bits = torch.tensor([(self.high << 16) | low], dtype=torch.int32)
            self._value = float(bits.view(torch.float32).item())
            self.hist = torch.zeros(0, dtype=torch.int64)
            self.stage = 2

    @property
    def done(self) -> bool:
        return self.stage == 2

    @property
    def value(self) -> float | None:
        """The k-th largest value (None when k = 0)."""
        if not self.done:
            raise RuntimeError("RadixSelect.value asked before both passes were fed.")
        return self._value
