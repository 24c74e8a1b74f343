"""How a trade-off is measured and judged: speciality measures (exact match ↑, answer loss ↓, or an lm-eval metric
`TASK/METRIC`), generality measures (held-out general loss ↓, or a benchmark metric), which direction is better,
and the Pareto front of points that no other point beats on both axes (docs/methods.md#pareto-front). Shared by
sweeps, merge searches, fine-tune comparisons and the app's charts."""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from forgetlab.core.benchmarks import BenchmarkSpec, check_limit, check_metrics
from forgetlab.core.errors import ParameterError


MEASURES: dict[str, tuple[str, bool]] = {"exact_match": ("exact match", True), "answer_loss": ("answer loss", False)}
"""How speciality is measured: name → (label, higher is better)."""


LOWER_IS_BETTER = {"perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte", "ter"}
"""lm-eval metrics where lower is better (every other benchmark metric counts as higher is better)."""


def is_benchmark(measure: str) -> bool:
    """True for a benchmark measure `TASK/METRIC` (an lm-eval task's metric)."""
    return "/" in str(measure)


def check_measure(measure: str) -> str:
    """`measure` if it is one of `MEASURES` or a benchmark `TASK/METRIC`, else ParameterError naming the
    choices."""
    if measure in MEASURES:
        return measure
    task, sep, metric = str(measure).partition("/")
    if sep and task and metric:
        return measure
    raise ParameterError(f"Unknown speciality measure {measure!r}; choose one of {', '.join(MEASURES)} or an "
                         "lm-eval metric written TASK/METRIC (e.g. arc_easy/acc).")


def check_general_measure(measure: str) -> str:
    """`general_loss` or a benchmark `TASK/METRIC`; ParameterError otherwise."""
    if measure == "general_loss" or (is_benchmark(measure) and check_measure(measure)):
        return measure
    raise ParameterError(f"Unknown generality measure {measure!r}; use general_loss or an lm-eval metric written "
                         "TASK/METRIC (e.g. hellaswag/acc_norm).")


def higher_is_better(measure: str) -> bool:
    """Whether a larger value of `measure` (speciality or generality) is better."""
    if measure in MEASURES:
        return MEASURES[measure][1]
    if measure == "general_loss":
        return False
    return measure.partition("/")[2].partition(",")[0] not in LOWER_IS_BETTER


def measure_label(measure: str) -> str:
    """A label for axes and tables: 'exact match', 'answer loss', 'general loss' or the benchmark measure."""
    if measure in MEASURES:
        return MEASURES[measure][0]
    return "general loss" if measure == "general_loss" else measure


def pareto_mask(speciality: Sequence[float], general_loss: Sequence[float]) -> list[bool]:
    """Non-dominated flags: point i is on the front unless some j has speciality_j ≥ speciality_i and
    general_loss_j ≤ general_loss_i with at least one strict. Points with a NaN value are never on it;
    identical points are all on it."""
    if len(speciality) != len(general_loss):
        raise ParameterError("pareto_mask needs as many speciality values as general losses.")
    s = [float(v) for v in speciality]
    g = [float(v) for v in general_loss]
    ok = [not (math.isnan(a) or math.isnan(b)) for a, b in zip(s, g)]
    flags = []
    for i in range(len(s)):
        if not ok[i]:
            flags.append(False)
            continue
        dominated = any(
            ok[j] and s[j] >= s[i] and g[j] <= g[i] and (s[j] > s[i] or g[j] < g[i]) for j in range(len(s))
        )
        flags.append(not dominated)
    return flags


def pareto_front(points: Sequence[Any], task: Optional[str] = None, measure: str = "exact_match",
                 general_measure: str = "general_loss") -> list[bool]:
    """Mark the non-dominated points (speciality up, general loss down) and return the flags.

    `points` are `SweepPoint`s (their `pareto` attribute is set; speciality on `task` in `measure`, an
    answer loss counting as better when lower), objects with `speciality` and `general_loss` attributes, or
    `(speciality, general_loss)` pairs.
    """
    spec, gen = [], []
    sign = 1.0 if higher_is_better(check_measure(measure)) else -1.0
    gsign = -1.0 if higher_is_better(check_general_measure(general_measure)) else 1.0   # the mask wants a loss
    for p in points:
        if callable(getattr(p, "generality", None)) and hasattr(p, "scorecard"):   # a SweepPoint
            spec.append(sign * p.speciality(task, measure))
            gen.append(gsign * p.generality(general_measure))
        elif isinstance(p, (tuple, list)) and len(p) == 2:
            spec.append(p[0])
            gen.append(p[1])
        else:
            s = p.speciality(task) if callable(getattr(p, "speciality", None)) else p.speciality
            spec.append(s)
            gen.append(p.general_loss)
    flags = pareto_mask(spec, gen)
    for p, f in zip(points, flags):
        if hasattr(p, "pareto"):
            p.pareto = f
    return flags


def measure_benchmarks(pool, measures: Sequence[str], include: Optional[str] = None,
                       limit: Optional[int] = None) -> Optional[BenchmarkSpec]:
    """The BenchmarkSpec that the benchmark measures among `measures` need (their tasks; include folder and
    limit from the arguments, else the pool's probes.benchmarks), or None when every measure is built in.
    Each benchmark measure's task and metric are checked here, before any work (`check_metrics`)."""
    tasks = list(dict.fromkeys(m.partition("/")[0] for m in measures if is_benchmark(m)))
    if not tasks:
        return None
    pool_spec = pool.probes.benchmarks if pool.probes is not None else None
    spec = BenchmarkSpec(general=tasks, include=include or (pool_spec.include if pool_spec else None),
                         limit=check_limit(limit) if limit is not None else (pool_spec.limit if pool_spec else None))
    check_metrics(measures, spec)
    return spec
