"""One scorecard per pool model and evaluation budget: computed once, then the same number everywhere.

An evaluation `Budget` is how much probe data a scorecard uses: the first `max_general` held-out blocks and the
first `max_task` eval pairs of each task (docs/methods.md#evaluation-budget). The held-out loss of the first 32
blocks is not the loss of the first 160, so two pages with their own limits show two numbers for one model;
with one budget for the whole app and `pool_scorecard` they show one.

`pool_scorecard(pool, name, budget, device=…, dtype=…)` evaluates a model of the pool once per (model, budget,
device, dtype, benchmarks) and keeps the card with the pool object (a rebuilt pool — e.g. after pool.yaml
changed — starts empty, as its loaded models do). `cached_scorecards` lists what is there without evaluating,
and `remember` stores cards computed elsewhere (e.g. the zoo build's stored ones, at the budget they were
computed with).
"""
from __future__ import annotations

import copy
import json
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch

from forgetlab.core.evaluate import Scorecard, check_limits, evaluate
from forgetlab.core.progress import Progress, report


@dataclass(frozen=True)
class Budget:
    """How much probe data an evaluation uses: held-out general blocks and eval pairs per task (None: all)."""

    max_general: Optional[int] = 32
    max_task: Optional[int] = 50

    def __post_init__(self) -> None:
        check_limits(max_general=self.max_general, max_task=self.max_task)

    def describe(self) -> str:
        """"32 held-out blocks, 50 eval pairs per task" (or "all …" for None)."""
        g = "all held-out blocks" if self.max_general is None else f"{self.max_general} held-out blocks"
        t = "all eval pairs" if self.max_task is None else f"{self.max_task} eval pairs per task"
        return f"{g}, {t}"

    def to_dict(self) -> dict[str, Optional[int]]:
        return {"max_general": self.max_general, "max_task": self.max_task}


DEFAULT_BUDGET = Budget(32, 50)
"""The app's budget when nothing else is known: ~0.6 s per pico model on one core, so a sweep of 11 points or an
attribution map of 30 parts stays well under a minute."""

_CACHES: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_TIMES: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()   # when each card was stored
_LOCK = threading.Lock()


def _cache(pool, book: "weakref.WeakKeyDictionary[Any, dict]" = _CACHES) -> dict:
    with _LOCK:
        cache = book.get(pool)
        if cache is None:
            cache = book[pool] = {}
        return cache


def _key(name: str, budget: Budget, device, dtype, benchmarks) -> tuple:
    bench = json.dumps(benchmarks.to_dict(), sort_keys=True) if benchmarks is not None else None
    return (name, budget.max_general, budget.max_task, str(device or "cpu"), str(dtype).removeprefix("torch."),
            bench)


def pool_scorecard(pool, name: str, budget: Budget = DEFAULT_BUDGET, *, device: Optional[str] = None,
                   dtype=None, benchmarks=None, benchmark_manager=None, progress: Progress = None) -> Scorecard:
    """The scorecard of the pool's model `name` ("base" or a fine-tuned model) at `budget`: evaluated on the
    pool's probe data (eval split, `forgetlab.core.evaluate.evaluate` with its default batch and block size) the
    first time, then returned from the pool's cache for the same (name, budget, device, dtype, benchmarks).
    A copy is returned, so a caller may rename it."""
    dtype = dtype or torch.float32
    key = _key(name, budget, device, dtype, benchmarks)
    cache = _cache(pool)
    card = cache.get(key)
    if card is None:
        model = pool.load(name, device=device, dtype=dtype)
        card = evaluate(model, pool.tokenizer, pool.probes, name=name, max_general=budget.max_general,
                        max_task=budget.max_task, benchmarks=benchmarks, benchmark_manager=benchmark_manager,
                        progress=progress)
        with _LOCK:
            if key not in cache:
                _cache_time(pool, key)
            card = cache.setdefault(key, card)
    else:
        report(progress, 1.0, f"{name}: scorecard at this budget already computed")
    return copy.deepcopy(card)


def cached_scorecards(pool, names: Iterable[str], budget: Budget = DEFAULT_BUDGET, *, device: Optional[str] = None,
                      dtype=None, benchmarks=None) -> list[Scorecard]:
    """The cards of `names` (in that order) already computed at `budget`; models not yet evaluated are left out.
    Never evaluates anything."""
    cache = _cache(pool)
    out = []
    for name in names:
        card = cache.get(_key(name, budget, device, dtype or torch.float32, benchmarks))
        if card is not None:
            out.append(copy.deepcopy(card))
    return out


def remember(pool, cards: Iterable[Scorecard], budget: Budget, *, device: Optional[str] = None, dtype=None) -> None:
    """Store cards computed elsewhere at `budget` (each under its `model` name) unless the pool has one already."""
    cache = _cache(pool)
    with _LOCK:
        for card in cards:
            key = _key(card.model, budget, device, dtype or torch.float32, None)
            if key not in cache:
                _cache_time(pool, key)
            cache.setdefault(key, copy.deepcopy(card))


def _cache_time(pool, key: tuple) -> None:
    """Record now as the time the card under `key` was stored (called with _LOCK held)."""
    times = _TIMES.get(pool)
    if times is None:
        times = _TIMES[pool] = {}
    times[key] = time.time()


def scorecard_times(pool, names: Iterable[str], budget: Budget = DEFAULT_BUDGET, *, device: Optional[str] = None,
                    dtype=None, benchmarks=None) -> dict[str, float]:
    """When the cached cards of `names` at `budget` were computed (or stored by `remember`), as time.time()
    seconds, by model name; models without a card are left out."""
    times = _cache(pool, _TIMES)
    out = {}
    for name in names:
        stamp = times.get(_key(name, budget, device, dtype or torch.float32, benchmarks))
        if stamp is not None:
            out[name] = stamp
    return out


def forget_scorecards(pool, name: Optional[str] = None) -> None:
    """Drop the pool's cached cards (one model's, or all of them)."""
    cache, times = _cache(pool), _cache(pool, _TIMES)
    with _LOCK:
        for key in [k for k in cache if name is None or k[0] == name]:
            del cache[key]
            times.pop(key, None)


def up_to_date_text(stamps: Iterable[float]) -> str:
    """What Evaluate says when every chosen card is already computed: "All 7 scorecards are up to date (computed
    09:20); nothing to recompute: the set is saved to Runs as it stands." — the computation times (time.time() seconds) as a clock time, or a span of
    them (with the date when it is not today)."""
    stamps = sorted(stamps)
    if not stamps:
        return "No scorecard is computed yet."

    def clock(t: float) -> str:
        today = time.strftime("%Y-%m-%d") == time.strftime("%Y-%m-%d", time.localtime(t))
        return time.strftime("%H:%M" if today else "%Y-%m-%d %H:%M", time.localtime(t))

    first, last = clock(stamps[0]), clock(stamps[-1])
    when = first if first == last else f"{first}–{last}"
    n = len(stamps)
    cards = "The scorecard is" if n == 1 else f"All {n} scorecards are"
    return f"{cards} up to date (computed {when}); nothing to recompute: the set is saved to Runs as it stands."
