"""One session-wide choice of how speciality is measured: exact match (↑) or answer loss (↓).

Every page that shows speciality (Models, Forgetting, Merge, Fine-tune, Runs) draws the same radio
(`speciality_measure(page, pool)`); a change on one page holds on every other page of the browser session.
The choice is kept under `MEASURE_KEY` (a plain session-state key, which Streamlit keeps across page switches,
unlike a widget's own key) and each page's radio is synced to it.

Benchmark metrics: when the pool names lm-eval benchmarks (`probes.benchmarks`), a page that can use them
(`speciality_measure(page, pool, benchmarks=True)`; the Forgetting page's sweeps through `sweep_measures`)
also offers each `TASK/METRIC` — the metrics of the latest benchmark run saved from the Models page, else those
listed by a local task's YAML (`metric_list`). A page that cannot use them shows the built-in default while the
session's benchmark choice stays for the pages that can. `generality_measure(page, pool)` is the same choice
for the generality axis: held-out general loss, or a benchmark metric.

The default is the measure that moves on the pool: answer loss when exact match hardly differs between the
pool's models (e.g. the demo zoo, whose small models rarely produce an exact answer), else exact match. It is
decided from scorecards already computed — the zoo's stored ones (`stored_scorecards`) or the Models page's —
never by evaluating anything; with none at hand it is answer loss, which moves whenever exact match does.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import streamlit as st
import yaml

from forgetlab.core.benchmarks import BenchmarkSpec
from forgetlab.core.evaluate import Scorecard
from forgetlab.core.scorecards import Budget, remember
from forgetlab.ui.benchmarks import DEFAULT_LIMIT, latest_benchmarks, pool_spec

if TYPE_CHECKING:  # pragma: no cover
    from forgetlab.core.pool import ModelPool

MEASURE_KEY = "app_measure"
MEASURE_LABELS = {"exact_match": "exact match ↑", "answer_loss": "answer loss ↓"}
MOVES = 0.25        # exact match "moves" when some task's exact match differs by this much between models
                    # (the pico zoo's 0–0.11 is a few answers of 50–100: noise next to the answer loss)
MANIFEST = "manifest.json"


def measure_label(measure: str) -> str:
    """"exact match ↑" / "answer loss ↓" (other measures: their name)."""
    return MEASURE_LABELS.get(measure, measure)


def stored_scorecards(pool: "ModelPool") -> list["Scorecard"]:
    """The scorecards that a zoo build stored in the manifest beside the pool file, for the pool's models
    (base first, then the pool's order); [] when the pool has no manifest (a user's own pool) or none match."""
    source = getattr(pool, "source", None)
    path = Path(source).parent / MANIFEST if source else None
    if path is None or not path.is_file():
        return []
    try:
        stored = json.loads(path.read_text(encoding="utf-8")).get("scorecards") or {}
    except (OSError, ValueError, AttributeError):
        return []
    cards = []
    for name in ["base", *pool.model_names]:
        data = stored.get(name)
        if isinstance(data, dict):
            try:
                card = Scorecard.from_dict(data)
            except (KeyError, TypeError, ValueError):
                continue
            card.model = name
            cards.append(card)
    return cards


def stored_budget(pool: "ModelPool") -> "Budget | None":
    """The budget the zoo build computed its stored scorecards with (the manifest's `settings.evaluation`), when
    it is one the app can reproduce (blocks of 128 tokens, `forgetlab.core.evaluate`'s default); else None."""
    source = getattr(pool, "source", None)
    path = Path(source).parent / MANIFEST if source else None
    if path is None or not path.is_file():
        return None
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))["settings"]["evaluation"]
        if int(spec.get("block_size", 128)) != 128:
            return None
        return Budget(spec.get("max_general"), spec.get("max_task"))
    except Exception:  # noqa: BLE001 - no usable record: the cards are simply not reused
        return None


def remember_stored_scorecards(pool: "ModelPool", budget: "Budget", device: str = "cpu") -> bool:
    """Put the zoo build's stored scorecards into the pool's scorecard cache when they were computed at `budget`
    on the CPU in float32 (what the build does), so they are not computed again; returns whether they were."""
    if device != "cpu" or stored_budget(pool) != budget:
        return False
    remember(pool, stored_scorecards(pool), budget, device=device)
    return True


def default_measure(cards: Sequence["Scorecard"]) -> str:
    """"exact_match" when some task's exact match differs by at least MOVES between the scorecards, else
    "answer_loss" (also with no scorecards)."""
    by_task: dict[str, list[float]] = {}
    for card in cards:
        for name, score in card.tasks.items():
            by_task.setdefault(name, []).append(float(score.exact_match))
    moves = any(max(v) - min(v) >= MOVES for v in by_task.values() if v)
    return "exact_match" if moves else "answer_loss"


def _yaml_metrics(include: str | None, task: str) -> list[str]:
    """The metrics a local lm-eval task's YAML lists (`metric_list`), or [] when it is not found there."""
    if not include or not Path(include).is_dir():
        return []
    class _AnyTags(yaml.SafeLoader):
        pass

    _AnyTags.add_multi_constructor("", lambda loader, suffix, node: None)
    for f in sorted(Path(include).rglob("*.yaml")):
        try:
            doc = yaml.load(f.read_text(encoding="utf-8"), Loader=_AnyTags)  # noqa: S506 (safe loader subclass)
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            continue
        if isinstance(doc, dict) and doc.get("task") == task:
            return [str(m["metric"]) for m in doc.get("metric_list") or [] if isinstance(m, dict) and m.get("metric")]
    return []


def benchmark_measures(pool: "ModelPool | None") -> list[str]:
    """Every `TASK/METRIC` the pool's benchmarks offer: for each task named under `probes.benchmarks`, the
    metrics of the latest saved benchmark run of the pool (Models page), else those of its local YAML; [] when
    the pool names no benchmarks."""
    if pool is None:
        return []
    spec = pool_spec(pool)
    if spec is None:
        return []
    try:
        latest = latest_benchmarks(pool)
    except Exception:  # noqa: BLE001 - an unreadable runs/ folder only loses the listed metrics
        latest = None
    known = latest[0].measures() if latest is not None else []
    out: list[str] = []
    for task in spec.all_tasks:
        metrics = [m.partition("/")[2] for m in known if m.partition("/")[0] == task] or _yaml_metrics(spec.include,
                                                                                                     task)
        out += [f"{task}/{metric}" for metric in metrics]
    return out


def current_measure(pool: "ModelPool | None" = None, *, benchmarks: bool = False) -> str:
    """The session's measure (set by a page's radio), else the default for `pool`'s stored scorecards. A
    benchmark `TASK/METRIC` is returned only with `benchmarks=True` and when the pool offers it."""
    chosen = st.session_state.get(MEASURE_KEY)
    if chosen in MEASURE_LABELS:
        return chosen
    if benchmarks and chosen and chosen in benchmark_measures(pool):
        return chosen
    return default_measure(stored_scorecards(pool)) if pool is not None else "answer_loss"


def _choice(where, label: str, options: list[str], key: str, sync, help: str, fmt=measure_label) -> None:
    if len(options) > 2:        # benchmark metrics too: a drop-down (a row of ten radio buttons wraps badly)
        where.selectbox(label, options, format_func=fmt, key=key, on_change=sync, help=help)
    else:
        where.radio(label, options, format_func=fmt, horizontal=True, key=key, on_change=sync, help=help)


def speciality_measure(page: str, pool: "ModelPool | None" = None, *, container=None,
                       benchmarks: bool = False) -> str:
    """Draw the session-wide "Speciality measured by" choice on `page` (its own widget key) and return
    "exact_match", "answer_loss" or — with `benchmarks=True`, on a pool that names lm-eval benchmarks — a
    benchmark `TASK/METRIC`. Only the charts change with the built-in two; a benchmark metric must have been
    evaluated (the Forgetting page's sweeps run it at every point: `sweep_measures`)."""
    options = list(MEASURE_LABELS) + (benchmark_measures(pool) if benchmarks else [])
    value = current_measure(pool, benchmarks=benchmarks)
    if st.session_state.get(MEASURE_KEY) in (None, *options):
        st.session_state[MEASURE_KEY] = value      # a benchmark choice this page cannot show stays for the others
    key = f"{page}_measure"
    st.session_state[key] = value

    def sync() -> None:
        st.session_state[MEASURE_KEY] = st.session_state[key]

    where = container if container is not None else st
    _choice(where, "Speciality measured by", options, key, sync,
            "Exact match (↑) of the generated answers, or the loss on the answer tokens (↓), which moves before "
            "exact match does" + (", or an lm-eval metric TASK/METRIC of the pool's benchmarks (run at every "
            "point)" if len(options) > 2 else "") + ". One choice for every page of this session.")
    return st.session_state[key]


GENERAL_KEY = "app_general_measure"


def generality_measure(page: str, pool: "ModelPool | None" = None, *, container=None) -> str:
    """Draw the session-wide "Generality measured by" choice on `page` when the pool offers benchmark metrics
    and return it: "general_loss" (held-out loss ↓) or a benchmark `TASK/METRIC`. Without benchmark metrics
    nothing is drawn and "general_loss" is returned."""
    options = ["general_loss", *benchmark_measures(pool)]
    if len(options) == 1:
        return "general_loss"
    chosen = st.session_state.get(GENERAL_KEY)
    value = chosen if chosen in options else "general_loss"
    st.session_state[GENERAL_KEY] = value
    key = f"{page}_general_measure"
    st.session_state[key] = value

    def sync() -> None:
        st.session_state[GENERAL_KEY] = st.session_state[key]

    where = container if container is not None else st
    where.selectbox("Generality measured by", options, key=key, on_change=sync,
                    format_func=lambda m: "general loss ↓ (held-out text)" if m == "general_loss" else m,
                    help="Held-out general-text loss (↓), or an lm-eval metric TASK/METRIC of the pool's "
                         "benchmarks (run at every point). One choice for every page of this session.")
    return value


class SweepMeasures:
    """The Forgetting page's measures: `measure` (speciality) and `general_measure` (generality), each built in
    or a benchmark `TASK/METRIC`; `settings` ({"benchmarks": BenchmarkSpec} when a benchmark is chosen, else {})
    to pass to a sweep function so that every point runs those lm-eval tasks, and `values` the same as the
    measure settings of an analysis (forgetlab.analysis.measures: the benchmark measures, their include folder
    and limit; {} with the built-in measures, which change only the charts); `apply(results)` sets both measures
    on sweep results, falling back to the built-in ones (with a note) when a result lacks the benchmark."""

    def __init__(self, pool: "ModelPool", measure: str, general_measure: str):
        self.measure, self.general_measure = measure, general_measure
        self.fallback = current_measure(pool)        # the built-in measure for sweeps without the benchmark
        tasks = list(dict.fromkeys(m.partition("/")[0] for m in (measure, general_measure) if "/" in m))
        self.settings: dict = {}
        self.values: dict = {}
        if tasks:
            spec = pool_spec(pool)
            limit = min(DEFAULT_LIMIT, spec.limit or DEFAULT_LIMIT)     # at every point: the quick limit
            self.settings = {"benchmarks": BenchmarkSpec(general=tasks, include=spec.include, limit=limit)}
            self.values = {**{k: m for k, m in (("measure", measure), ("general_measure", general_measure))
                              if "/" in m}, "lm_eval_include": spec.include, "limit": limit}

    @staticmethod
    def _has(result, measure: str) -> bool:
        task, _, metric = measure.partition("/")
        return bool(result.points) and all(metric in p.scorecard.benchmarks.get(task, {}) for p in result.points)

    def apply(self, results) -> None:
        """Set `measure` and `general_measure` on each sweep result (a list, or one result); a benchmark measure
        that some result lacks (a sweep run without it) is replaced by the built-in one for all of them."""
        results = results if isinstance(results, (list, tuple)) else [results]
        measure, general = self.measure, self.general_measure
        if "/" in measure and not all(self._has(r, measure) for r in results):
            st.caption(f"Speciality: {measure} was not run in every sweep shown; showing "
                       f"{measure_label(self.fallback)} (run a sweep with it to see it).")
            measure = self.fallback
        if "/" in general and not all(self._has(r, general) for r in results):
            st.caption(f"Generality: {general} was not run in every sweep shown; showing the general loss.")
            general = "general_loss"
        for r in results:
            r.measure, r.general_measure = measure, general


def sweep_measures(page: str, pool: "ModelPool", *, container=None) -> SweepMeasures:
    """Draw the speciality (with benchmark metrics) and generality choices on `page`; a SweepMeasures."""
    measure = speciality_measure(page, pool, container=container, benchmarks=True)
    return SweepMeasures(pool, measure, generality_measure(page, pool, container=container))
