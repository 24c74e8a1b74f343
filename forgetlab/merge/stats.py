"""Exact statistics over a task vector that is streamed tensor by tensor (for global-scope methods).

`RadixSelect` finds the exact k-th largest value of a stream of non-negative float32 numbers in two passes
with 65,536-bin histograms: for non-negative IEEE floats the int32 bit pattern orders like the value, so
pass 1 counts the high 16 bits and finds the bin that holds the k-th largest, pass 2 counts the low 16
bits of the values in that bin. Memory: two histograms, whatever the size of the vector. The result is
bit-identical to `torch.kthvalue` over the concatenated vector (tests check this).

`StatsCollector` is the protocol of a global first pass: the engine calls `add(pass_index, name, base,
taus)` for every tensor in every pass, then `end_pass(pass_index)`, and hands `result()` to the method.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

import torch

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
        v = values.detach().to(device="cpu", dtype=torch.float32).contiguous().reshape(-1)
        return v.view(torch.int32) & 0x7FFFFFFF  # clears the sign of −0.0; inputs are non-negative

    def add(self, values: torch.Tensor) -> None:
        """Count one chunk of values in the current stage (no-op once done)."""
        if self.stage < 2 and _LITTLE and values.dtype == torch.float32 and values.device.type == "cpu":
            self._add_halves(values)
        elif self.stage == 0:
            hi = self._bits(values) >> 16
            self.hist += torch.bincount(hi, minlength=_BINS)[:_BINS]
        elif self.stage == 1:
            bits = self._bits(values)
            sel = bits[(bits >> 16) == self.high] & 0xFFFF
            if sel.numel():
                self.hist += torch.bincount(sel, minlength=_BINS)[:_BINS]

    def _add_halves(self, values: torch.Tensor) -> None:
        """`add` on a little-endian CPU: the high and low 16 bits of each float32 are the odd and even uint16
        of its memory, so a histogram of them is numpy.bincount of a strided view (no shift, no mask, no
        int64 copy; ~3 ns per value where the torch ops took ~8), and stage 1 picks the low halves of the
        values in the chosen bin with a comparison and numpy.compress (~1 ns per value, the bool-indexed
        torch gather took ~10). Bins ≥ 0x8000 (sign bit set: −0.0 of a non-negative input) fold onto
        bins − 0x8000, as the mask of `_bits` does."""
        import numpy as np
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
        import numpy as np
        if not self._pending:
            return
        parts, self._pending, self._pending_n = self._pending, [], 0
        h = sum(np.bincount(p, minlength=_BINS) for p in parts) if len(parts) < 4 else \
            np.bincount(np.concatenate(parts), minlength=_BINS)
        if self.stage == 0:
            h = h[: _BINS // 2] + h[_BINS // 2:]
            self.hist[: _BINS // 2] += torch.from_numpy(h)
        else:
            self.hist += torch.from_numpy(h)

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


def kth_largest(values: torch.Tensor, k: int) -> float | None:
    """k-th largest entry of a tensor held in memory (None for k = 0): the reference for `RadixSelect`."""
    flat = values.reshape(-1).to(torch.float32)
    if k <= 0:
        return None
    return float(torch.kthvalue(flat, flat.numel() - k + 1).values)


class StatsCollector(Protocol):
    """A global first pass: `passes` sweeps over every tensor, then `result()`."""

    passes: int

    def add(self, pass_index: int, name: str, base: torch.Tensor, taus: Sequence[torch.Tensor]) -> None: ...

    def end_pass(self, pass_index: int) -> None: ...

    def result(self) -> Any: ...


class TiesGlobalCollector:
    """Global TIES trimming thresholds: per task, the exact k-th largest |τt| over the whole task vector,
    k = keep_count(total entries, keep). Two passes (RadixSelect)."""

    passes = 2

    def __init__(self, n_tasks: int, total: int, keep: float):
        from forgetlab.merge.sparsify import keep_count
        self.selects = [RadixSelect(keep_count(total, keep)) for _ in range(n_tasks)]

    def add(self, pass_index, name, base, taus):
        for sel, tau in zip(self.selects, taus):
            sel.add(tau.abs())

    def end_pass(self, pass_index):
        for sel in self.selects:
            sel.advance()

    def result(self) -> list[float | None]:
        return [sel.value for sel in self.selects]
