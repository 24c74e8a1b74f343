"""How a trade-off is measured and judged: speciality measures (exact match ↑, answer loss ↓, or an lm-eval metric
`TASK/METRIC`), generality measures (held-out general loss ↓, or a benchmark metric), which direction is better,
and the Pareto front of points that no other point beats on both axes (docs/methods.md#pareto-front). Shared by
sweeps, merge searches, fine-tune comparisons and the app's charts.

The settings that choose the measures are declared here once (`measure_field`, `general_measure_field`,
`lm_eval_include_field`, `limit_field`: `--measure`, `--general-measure`, `--lm-eval-include`, `--limit`), and
`measure_benchmarks` turns them into the lm-eval benchmarks a job must run."""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from forgetlab.core.benchmarks import BenchmarkSpec, check_limit, check_metrics
from forgetlab.core.errors import ParameterError
from forgetlab.core.evaluate import forgetting_text
from forgetlab.core.settings import count_field, setting


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


def measure_benchmarks(pool, measures: Sequence[str], include: Optional[str] = None,
                       limit: Optional[int] = None) -> Optional[BenchmarkSpec]:
    """The BenchmarkSpec that the benchmark measures among `measures` need (their tasks; include folder and
    limit as given, else the pool's probes.benchmarks), or None when every measure is built in. Each benchmark
    measure's task and metric are checked here, before any work (`check_metrics`)."""
    tasks = list(dict.fromkeys(m.partition("/")[0] for m in measures if is_benchmark(m)))
    if not tasks:
        return None
    pool_spec = pool.probes.benchmarks if pool.probes is not None else None
    spec = BenchmarkSpec(general=tasks, include=include or (pool_spec.include if pool_spec else None),
                         limit=check_limit(limit) if limit is not None else (pool_spec.limit if pool_spec else None))
    check_metrics(measures, spec)
    return spec


def measure_label(measure: str) -> str:
    """A label for axes and tables: 'exact match', 'answer loss', 'general loss' or the benchmark measure."""
    if measure in MEASURES:
        return MEASURES[measure][0]
    return "general loss" if measure == "general_loss" else measure


def digits_of(measure: str) -> int:
    """The decimals a sentence gives a value of `measure`: 2 for exact match (a share of answers), 3 for a loss
    in nats or a benchmark metric."""
    return 2 if measure == "exact_match" else 3


def unit_of(measure: str) -> str:
    """The unit of `measure`'s values: "nats" for the losses (answer loss, general loss), "" for exact match and
    the benchmark metrics (shares, accuracies)."""
    return "nats" if measure in ("answer_loss", "general_loss") else ""


def value_text(measure: str, value: float) -> str:
    """A value in words, with its unit: "exact match 0.62", "answer loss 2.310 nats", "zoo_math/acc 0.450"."""
    unit = unit_of(measure)
    return f"{measure_label(measure)} {value:.{digits_of(measure)}f}" + (f" {unit}" if unit else "")


def change_text(measure: str, delta: float) -> str:
    """A change of `measure` in words, signed, with its unit: "+0.50 exact match", "-0.830 nats of answer loss",
    "+0.031 nats (perplexity +3.2 %)" for the general loss (`forgetting_text`), "+0.050 zoo_math/acc"."""
    if measure == "general_loss":
        return forgetting_text(delta)
    unit = unit_of(measure)
    number = f"{delta:+.{digits_of(measure)}f}"
    return f"{number} {unit} of {measure_label(measure)}" if unit else f"{number} {measure_label(measure)}"


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


def best_tradeoff(speciality: Sequence[float], general_loss: Sequence[float]) -> Optional[int]:
    """The point that keeps most speciality for least forgetting (docs/methods.md#best-tradeoff): on the Pareto
    front (`pareto_mask`, speciality larger-is-better, general loss smaller-is-better), the one with the largest
    s' − g', where s' and g' are speciality and general loss rescaled to [0, 1] over the points with both values
    (0 where all points share a value); the first such point on a tie; None when no point has both values."""
    flags = pareto_mask(speciality, general_loss)
    finite = [i for i, on in enumerate(flags) if on]
    if not finite:
        return None
    s = [float(v) for v in speciality]
    g = [float(v) for v in general_loss]
    ok = [i for i in range(len(s)) if not (math.isnan(s[i]) or math.isnan(g[i]))]

    def scaled(values: list[float], i: int) -> float:
        lo, hi = min(values[j] for j in ok), max(values[j] for j in ok)
        return (values[i] - lo) / (hi - lo) if hi > lo else 0.0

    return max(finite, key=lambda i: (scaled(s, i) - scaled(g, i), -i))


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


# ------------------------------------------------------------------------------ the settings that choose them

LM_EVAL_INCLUDE_HELP = "folder of local lm-eval task YAMLs (default: the pool's probes.benchmarks.include)"
LIMIT_HELP = "at most this many examples per lm-eval task"


def measure_help(when: str = "at every point") -> str:
    """The help of `--measure`; `when` says when a benchmark measure runs ("at every point", …)."""
    return ("speciality measure: exact_match (higher is better, default), answer_loss (lower is better), or an "
            "lm-eval metric TASK/METRIC (e.g. zoo_math/acc), run " + when)


def general_measure_help(when: str = "at every point") -> str:
    """The help of `--general-measure`; `when` as for `measure_help`."""
    return ("generality measure: general_loss (held-out loss, default) or an lm-eval metric TASK/METRIC (e.g. "
            "zoo_wiki_cloze/acc), run " + when)


def measure_field(when: str = "at every point") -> Any:
    """`measure`: the speciality measure (`check_measure`), a settings field (forgetlab.core.settings)."""
    return setting("exact_match", help=measure_help(when))


def general_measure_field(when: str = "at every point") -> Any:
    """`general_measure`: the generality measure (`check_general_measure`), a settings field."""
    return setting("general_loss", help=general_measure_help(when))


def lm_eval_include_field() -> Any:
    """`lm_eval_include`: the folder of a benchmark measure's local lm-eval tasks, a settings field."""
    return setting(None, help=LM_EVAL_INCLUDE_HELP, metavar="DIR")


def limit_field() -> Any:
    """`limit`: how many examples each lm-eval task of a benchmark measure runs, a settings field."""
    return count_field(None, LIMIT_HELP)
