"""Torch threads for a zoo build or a CPU job, chosen from what the other processes use now and re-chosen
while it runs.

Two torch threads train the pico model about 1.5–2× faster than one on an idle two-core machine, but up to 10×
slower when another process holds a core (the threads wait on each other; bench/zoo_build.py). The 1-minute
load average is the wrong signal: right after `pip install` it still says "busy" for a minute on a machine that
is idle. So the build measures the other processes' CPU use (all CPU time in /proc/stat minus this process's)
over a short window at the start and every `interval` seconds while it trains, and uses `wanted` threads only
while that many cores are free. The weights do not depend on the thread count (tests/test_zoo_build.py trains
with 1 and with 2 threads and compares bit for bit), so switching mid-build keeps the build deterministic —
where that holds: on some CPUs torch's backward passes sum in a thread-dependent order (seen on 5 Dec 2026 with
torch 2.13.0 and transformers 5.25: forward passes equal, gradients not). `backward_is_thread_independent()`
checks this machine once; where it fails, the governor picks the count at the start and keeps it for the build.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch


@dataclass(frozen=True)
class CpuSample:
    """A reading of the machine's busy CPU seconds (all processes), this process's CPU seconds, and the wall clock."""

    busy: float
    own: float
    wall: float


def read_cpu(stat_path: str = "/proc/stat") -> Optional[CpuSample]:
    """The current `CpuSample`, or None where /proc/stat cannot be read (not Linux).

    Busy time is every field of the aggregate `cpu` line except idle and iowait, steal included (on a VM it is
    a neighbour's use of our core)."""
    try:
        with open(stat_path, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 5:
        return None
    ticks = [int(x) for x in fields[1:9]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return CpuSample(busy=(sum(ticks) - idle) / hz, own=time.process_time(), wall=time.monotonic())


def others_busy(before: CpuSample, after: CpuSample) -> float:
    """Cores used by other processes between two samples: (Δ machine busy − Δ own CPU) / Δ wall, at least 0."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / wall)


_PROBE: dict[str, bool] = {}


def backward_is_thread_independent() -> bool:
    """Whether a linear layer's gradient comes out bit for bit the same with 1 and with 2 torch threads on this
    machine (checked once per process, on a pico-sized product: 2048 rows of 128 → 352)."""
    if "ok" not in _PROBE:
        previous = torch.get_num_threads()
        grads = []
        # the first tick often comes inside torch.no_grad() or inference_mode() (evaluation, linearity): the
        # probe makes its tensors and runs its backward pass with autograd on, whatever the caller's mode is
        try:
            with torch.inference_mode(False), torch.enable_grad():
                g = torch.Generator().manual_seed(0)
                x, w = torch.randn(2048, 128, generator=g), torch.randn(352, 128, generator=g)
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    wt = w.clone().requires_grad_(True)
                    (x @ wt.T).square().sum().backward()
                    grads.append(wt.grad)
        finally:
            torch.set_num_threads(previous)
        _PROBE["ok"] = bool(torch.equal(grads[0], grads[1]))
    return _PROBE["ok"]


def threads_for(wanted: int, others: float, cpus: int) -> int:
    """As many threads as cores are free of other processes (rounded to the nearest core), at least 1 and at
    most `wanted`: on two cores, 2 while the others use under half a core, else 1."""
    wanted = max(1, int(wanted))
    return max(1, min(wanted, int(cpus - others + 0.5)))


@dataclass
class ThreadGovernor:
    """Sets torch's thread count for a build and re-checks it every `interval` seconds (`tick`).

    `sampler` returns a `CpuSample` (its `wall` read from `clock`) or None (then the 1-minute load average
    decides once, as a fallback); `history` lists [seconds since start, threads] at every change."""

    wanted: int
    interval: float = 5.0
    window: float = 0.25
    sampler: Callable[[], Optional[CpuSample]] = read_cpu
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    clock: Callable[[], float] = time.monotonic
    history: list = field(default_factory=list)
    _last: Optional[CpuSample] = None
    _start: float = 0.0
    threads: int = 1

    def start(self) -> int:
        """Measure the other processes over `window` seconds, set and return the thread count."""
        self._start = self.clock()
        if self.wanted <= 1:
            self._set(1)
            return 1
        first = self.sampler()
        if first is None:
            try:
                others = max(0.0, os.getloadavg()[0])
            except (AttributeError, OSError):
                others = 0.0
            self._set(threads_for(self.wanted, others, self.cpus))
            return self.threads
        time.sleep(self.window)
        self._last = self.sampler()
        self._set(threads_for(self.wanted, others_busy(first, self._last), self.cpus))
        return self.threads

    def tick(self) -> None:
        """Re-choose the thread count if `interval` seconds passed since the last reading (cheap otherwise)."""
        if self._last is None or self.wanted <= 1 or not backward_is_thread_independent():
            return
        if self.clock() - self._last.wall < self.interval:
            return
        sample = self.sampler()
        if sample is None:
            return
        others = others_busy(self._last, sample)
        self._last = sample
        self._set(threads_for(self.wanted, others, self.cpus))

    def _set(self, threads: int) -> None:
        if threads != self.threads or not self.history:
            self.history.append([round(self.clock() - self._start, 1), threads])  # as JSON gives it back
        self.threads = threads
        torch.set_num_threads(threads)


_CURRENT: contextvars.ContextVar[Optional[ThreadGovernor]] = contextvars.ContextVar("forgetlab_threads", default=None)


@contextlib.contextmanager
def governed_threads(device=None, wanted: Optional[int] = None, *,
                     sampler: Callable[[], Optional[CpuSample]] = read_cpu, cpus: Optional[int] = None):
    """Run the enclosed CPU job on as many torch threads as cores are free of other processes now
    (`ThreadGovernor`, `wanted` = this thread's count by default), re-chosen on each `tick()` from the job's
    progress reports; the count is restored after. On a busy two-core machine two threads run a small model
    several times slower than one, so a job started beside other work must not keep torch's default.

    Must be entered in the thread that runs the job: torch's thread count is per thread. Does nothing for a
    job on a GPU (`device` "cuda…"), or inside another governed block."""
    if (device is not None and str(device).startswith("cuda")) or _CURRENT.get() is not None:
        yield None
        return
    previous = torch.get_num_threads()
    governor = ThreadGovernor(int(wanted or previous), sampler=sampler, cpus=int(cpus or os.cpu_count() or 1))
    governor.start()
    token = _CURRENT.set(governor)
    try:
        yield governor
    finally:
        _CURRENT.reset(token)
        torch.set_num_threads(previous)


def tick() -> None:
    """Let the governor of the enclosing `governed_threads` block re-check the thread count (cheap; a no-op
    outside one). Progress callbacks of the CLI and the app call it."""
    governor = _CURRENT.get()
    if governor is not None:
        governor.tick()
