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

    @staticmethod
    def _bits(values: torch.Tensor) -> torch.Tensor:
        v = values.detach().to(device="cpu", dtype=torch.float32).contiguous().reshape(-1)
        return v.view(torch.int32) & 0x7FFFFFFF  # clears the sign of −0.0; inputs are non-negative

    def add(self, values: torch.Tensor) -> None:
        """Count one chunk of values in the current stage (no-op once done)."""
        if self.stage == 0:
            hi = self._bits(values) >> 16
            self.hist += torch.bincount(hi, minlength=_BINS)[:_BINS]
        elif self.stage == 1:
            bits = self._bits(values)
            sel = bits[(bits >> 16) == self.high] & 0xFFFF
            if sel.numel():
                self.hist += torch.bincount(sel, minlength=_BINS)[:_BINS]

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
