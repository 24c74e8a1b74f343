"""Forgetting curves: what a post-hoc fix buys in speciality and costs in generality, over its setting.

Each sweep takes a pool and one fine-tuned model θ1 (task vector τ = θ1 − θ0) and evaluates a series of
models built from θ0 and θ1 (docs/methods.md):

- `alpha_curve`   WiSE-FT θ(α) = (1 − α)·θ0 + α·θ1, α ∈ {0, 0.1, …, 1} by default, and beside it (series
                  "slerp") mergekit's SLERP of θ0 and θ1 at t = α (docs/methods.md#slerp);
- `pruning_curve` FAPM θ = θ0 + mask ⊙ τ over pruning ratios, with the "magnitude" and "relative" ablations
                  as extra series on the same axes;
- `density_curve` DARE (drop rate p, survivors rescaled by 1/(1 − p)) and TIES trimming (keep fraction by
                  |τ|; with one task vector sign election and the disjoint mean leave the trimmed τ as is),
                  both plotted against the density (share of τ's entries that survive: 1 − p, or keep),
                  and beside them DELLA (MAGPRUNE at density d, docs/methods.md#della) and SCE (select_topk = d;
                  SCE's selection needs the variance across task vectors, so that series merges θ1 with the
                  pool's other fine-tuned models, docs/methods.md#sce) over the keeps grid;
- `hma_grid`      HMA: one α per block of decoder layers, over a list of α tuples (the MoFO rebuttal's 15
                  triples by default).

Every point carries a `forgetlab.core.evaluate.Scorecard` (generality: held-out general loss; speciality: exact
match per task), the distance D(θ, θ0) (`forgetlab.analysis.taskvec.distance`), and its settings. `pareto_front`
marks the points that no other point beats on both speciality (up) and general loss (down).

Benchmarks: pass `benchmarks=` (a `forgetlab.core.benchmarks.BenchmarkSpec`) and every point also runs those
lm-eval tasks; then `SweepResult.measure` (speciality) and `general_measure` (generality) may name an lm-eval
metric `TASK/METRIC` (e.g. `arc_easy/acc`, higher is better) instead of exact match / general loss.

Precision: `dtype=` sets the working copy's dtype (None: bfloat16 on cuda, float32 on cpu —
`forgetlab.core.memory.job_dtype`); merged tensors are computed in float32. Memory: `estimate("sweep", ...)`
(`forgetlab.analysis.sweep_memory`).

Analyses: each kind is an `Analysis` (forgetlab.analysis.sweep_analysis) named like its saved runs,
"sweep-alpha", "sweep-pruning", "sweep-density", "sweep-hma", with its settings declared once below
(`AlphaSettings`, …: the grids' defaults live there and nowhere else); the closed-form kinds are declared in
forgetlab.analysis.closed_form_sweeps, which builds on the public pieces of this module (`SweepSpec`,
`run_specs`, `sweep_recipe`, `check_grid`, `check_swept_model`, `wise_ft_at`).

Executors: pass `executor=` ("local", the default, or "ray", or a `forgetlab.executors.Executor`) to run the
points on Ray actors, each holding its own working copy (see `forgetlab.executors`); the points are the same
to 1e-6. Every point records the executor and the worker (host, pid) that computed it; a point whose worker
died twice is listed in `SweepResult.failed` and the other points are kept.

Memory: a sweep holds ONE working copy of the model (freshly loaded, never the pool's cached one) and, for
each point, rewrites its weights in place tensor by tensor from lazily read θ0/θ1 tensors; peak memory is
one model plus a few tensors whatever the number of points. Endpoints are exact: α = 0 and pruning ratio 1
write θ0 bit for bit, α = 1 and ratio 0 write θ1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from forgetlab.analysis.base import ANALYSES, analysis_for_kind, pool_source
from forgetlab.analysis.sweep_analysis import SweepSettings, sweep_analysis
from forgetlab.analysis.sweep_results import SweepPoint, SweepResult
from forgetlab.core.taskvectors import distance
from forgetlab.core.benchmarks import checked_manager, task_manager
from forgetlab.core.errors import ParameterError, ProbeDataError, WorkspaceError, check_fraction
from forgetlab.core.evaluate import Scorecard, evaluate
from forgetlab.core.progress import Progress, report, scaled
from forgetlab.core.settings import seed_field, setting
from forgetlab.core.workspace import SavedRun, list_runs, load_run
from forgetlab.executors import PoolWorkerFactory, make_executor
from forgetlab.merge.working_copy import LazyTensors, TensorMerger, WorkingCopy

KINDS = ("alpha", "pruning", "density", "hma", "lines", "rank", "iso")
"""Every sweep kind, in the order the Forgetting page offers them (the Analysis of each: `sweep-<kind>`)."""
PRUNING_SCORES = ("fapm", "magnitude", "relative")
DENSITY_METHODS = ("dare", "ties", "della", "sce")
ALPHA_METHODS = ("wise-ft", "slerp")
DELLA_EPSILON = 0.15  # mergekit's default ε, narrowed where density ± ε would leave (0, 1)
X_NAMES = {"alpha": "alpha", "pruning": "ratio", "density": "density", "hma": "mean_alpha"}
X_NAMES.update(lines="beta", rank="keep", iso="alpha")      # the closed-form curves (closed_form_sweeps)


OnPoint = Optional[Callable[[SweepPoint, SweepResult], None]]


# ------------------------------------------------------------------------------------------- the settings


@dataclass
class AlphaSettings(SweepSettings):
    """An α sweep (`alpha_curve`): WiSE-FT at each α of the grid, and SLERP at t = α with "slerp" among the
    methods."""

    alphas: tuple[float, ...] = setting(tuple(round(0.1 * i, 1) for i in range(11)), help="α grid, comma separated",
                                        range=(0.0, 1.0), label="α values")
    methods: tuple[str, ...] = setting(("wise-ft",), help="series: wise-ft slerp (SLERP of θ0 and θ1 at t = α, "
                                                          "mergekit's)", choices=ALPHA_METHODS, cli_choices=False,
                                       label="series")


@dataclass
class PruningSettings(SweepSettings):
    """A pruning sweep (`pruning_curve`): FAPM at each ratio, for each score."""

    ratios: tuple[float, ...] = setting((0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.99, 1.0),
                                        help="pruning ratios (zeroed share)", range=(0.0, 1.0),
                                        label="pruning ratios")
    scores: tuple[str, ...] = setting(PRUNING_SCORES, help="series: fapm magnitude relative", choices=PRUNING_SCORES,
                                      cli_choices=False)


@dataclass
class DensitySettings(SweepSettings):
    """A density sweep (`density_curve`): DARE over drop rates, TIES (DELLA, SCE) over keep fractions."""

    drops: tuple[float, ...] = setting((0.0, 0.5, 0.7, 0.9, 0.95, 0.99), help="DARE drop rates p", range=(0.0, 1.0),
                                       label="DARE drop rates")
    keeps: tuple[float, ...] = setting((1.0, 0.5, 0.3, 0.2, 0.1, 0.05, 0.01),
                                       help="TIES keep fractions (also DELLA's densities and SCE's select_topk)",
                                       range=(0.0, 1.0), label="TIES keep fractions (DELLA / SCE densities)")
    methods: tuple[str, ...] = setting(("dare", "ties"), help="dare ties della sce (sce merges the model with the "
                                                              "pool's other fine-tuned models)",
                                       choices=DENSITY_METHODS, cli_choices=False, label="series")
    seed: int = seed_field("DARE and DELLA seed", label="DARE / DELLA seed")


HMA_TRIPLES = (
    (0.05, 0.2, 0.35), (0.1, 0.2, 0.3), (0.2, 0.2, 0.2), (0.3, 0.2, 0.1), (0.35, 0.2, 0.05),
    (0.3, 0.5, 0.7), (0.4, 0.5, 0.6), (0.5, 0.5, 0.5), (0.6, 0.5, 0.4), (0.7, 0.5, 0.3),
    (0.65, 0.8, 0.95), (0.7, 0.8, 0.9), (0.8, 0.8, 0.8), (0.9, 0.8, 0.7), (0.95, 0.8, 0.65),
)
"""The MoFO rebuttal's 15 α triples (HMA's default grid)."""


@dataclass
class HmaSettings(SweepSettings):
    """An HMA grid (`hma_grid`): one α per block of decoder layers, for each α tuple."""

    grid: tuple[tuple[float, ...], ...] = setting(HMA_TRIPLES, help="α tuples like 0.1,0.2,0.3 (default: the MoFO "
                                                                    "rebuttal's 15 triples)", range=(0.0, 1.0),
                                                  label="α tuples (one per line)")


# ------------------------------------------------------------------------------------------- the engine


@dataclass
class SweepSpec:
    """One point of a sweep before it runs: its series, x, settings and the merger that writes its weights;
    `key`/`same_as` share an exact endpoint (θ0, θ1) between series, `others` the further fine-tuned models
    the merge takes after θ1 (SCE)."""

    series: str
    x: float
    settings: dict[str, Any]
    fn: TensorMerger
    same_as: Optional[str] = None   # key of an identical model already evaluated (shared endpoints)
    key: Optional[str] = None
    others: tuple[str, ...] = ()    # further fine-tuned models the merge takes after θ1 (SCE)


def check_swept_model(pool, model: str) -> None:
    """Refuse a model a sweep cannot sweep: the base (no task vector) or a name the pool does not have."""
    if model == "base":
        raise ParameterError("Sweeps need a fine-tuned model; 'base' has no task vector. Pick one of: "
                             f"{', '.join(pool.model_names) or 'none (add one to the pool)'}.")
    pool.check_models([model])


def default_task(pool, model: str) -> Optional[str]:
    """The task a model was fine-tuned on, guessed from its name (the longest task name it contains);
    None when no task name matches (speciality is then the mean over tasks)."""
    low = model.lower()
    hits = [t for t in pool.task_names if t.lower() in low]
    return max(hits, key=len) if hits else None


def check_grid(name: str, values: Sequence[float]) -> list[float]:
    """The grid as a list of fractions in [0, 1]; ParameterError naming `name` for an empty grid or a value
    outside."""
    vals = list(values) if values is not None else []
    if not vals:
        raise ParameterError(f"The {name} grid is empty; give at least one value in [0, 1], e.g. 0 0.5 1.")
    return [check_fraction(f"every {name} value", v) for v in vals]


def run_specs(pool, model: str, kind: str, specs: Sequence[SweepSpec], *, task: Optional[str],
              recipe: dict[str, Any], device: Optional[str], batch_size: int, max_general: Optional[int],
              max_task: Optional[int], tasks: Optional[Sequence[str]], on_point: OnPoint, progress: Progress,
              benchmarks=None, executor=None, dtype=None) -> SweepResult:
    """Evaluate the points `specs` of a sweep of `kind` on `pool`'s `model` (one working copy per worker of the
    executor, shared endpoints evaluated once): the engine of every curve. Checks the model, the probe data and
    the task before its first progress report; `on_point(point, result)` after each point."""
    check_swept_model(pool, model)
    if not pool.probes.general:
        raise ProbeDataError("Forgetting curves need held-out general text to measure generality; add "
                             "`probes: general:` to the pool file.")
    pool.check_tasks([task] if task is not None else [])
    if task is None:
        task = default_task(pool, model)
    eval_tasks = list(tasks) if tasks is not None else list(pool.task_names)
    if task is not None and task not in eval_tasks:
        eval_tasks.append(task)
    manager = checked_manager(benchmarks)
    if manager is not None:
        recipe = {**recipe, "benchmarks": benchmarks.to_dict()}
    executor = make_executor(executor)
    result = SweepResult(kind=kind, model=model, task=task, x_name=X_NAMES[kind], recipe=recipe,
                         executor={"name": executor.name})
    start = time.perf_counter()
    report(progress, 0.0, f"loading a working copy of {model}")
    factory = _SweepFactory(pool, model, device, batch_size, max_general, max_task, eval_tasks, benchmarks, manager,
                            dtype=dtype)
    labels = [f"{spec.series} {result.x_name}={spec.x:g}" for spec in specs]
    run = [i for i, spec in enumerate(specs) if spec.same_as is None]     # shared endpoints are evaluated once
    source = {spec.key: i for i, spec in enumerate(specs) if spec.key is not None and spec.same_as is None}
    copies = {i: [j for j, sp in enumerate(specs) if sp.same_as is not None and source.get(sp.same_as) == i]
              for i in run}
    slots: list[Optional[SweepPoint]] = [None] * len(specs)

    def landed(out) -> None:
        i = run[out.index]
        spec = specs[i]
        if not out.ok:
            result.failed.append({"series": spec.series, "x": float(spec.x), "settings": dict(spec.settings),
                                  "error": out.error, "attempts": out.attempts})
            return
        card, dist = out.value
        for j in [i, *copies[i]]:
            c = card if j == i else Scorecard.from_dict(card.to_dict())
            c.model = f"{model}:{labels[j]}"
            sp = specs[j]
            slots[j] = SweepPoint(series=sp.series, x=float(sp.x), settings=dict(sp.settings), scorecard=c,
                                  distance=dist, seconds=out.seconds if j == i else 0.0,
                                  executor=executor.name, worker=dict(out.worker or {}))
        result.points = [p for p in slots if p is not None]
        result.mark_pareto()
        result.seconds = time.perf_counter() - start
        if on_point is not None:
            for j in [i, *copies[i]]:
                on_point(slots[j], result)

    executor.map(factory, [(specs[i].fn, f"{model}:{labels[i]}", specs[i].others) for i in run], on_result=landed,
                 progress=progress)
    result.executor = executor.describe()
    result.seconds = time.perf_counter() - start
    last = result.points[-1] if result.points else None
    if last is not None:
        report(progress, 1.0, f"{len(result.points)} points; last: speciality {last.speciality(task):.3f}, "
                              f"general loss {last.general_loss:.3f}")
    return result


def _distance(work: WorkingCopy) -> float:
    """D(θ, θ0) of a working copy's current weights (forgetlab.core.taskvectors.distance; NaN where undefined)."""
    return float(distance(work.access, work.base))


class _SweepState:
    """A sweep worker's resident state: one working copy of the model (and the lm-eval task manager); called
    with a point `(merger, name)` it writes the point's weights in place, evaluates it and returns
    (Scorecard, D(θ, θ0))."""

    def __init__(self, pool, model: str, device: Optional[str], batch_size: int, max_general: Optional[int],
                 max_task: Optional[int], tasks: Sequence[str], benchmarks, manager=None, dtype=None):
        self.pool = pool
        self.work = WorkingCopy.load(pool, model, device=device, dtype=dtype)
        self.kw = dict(batch_size=batch_size, max_general=max_general, max_task=max_task, tasks=list(tasks))
        self.benchmarks, self.manager = None, None
        if benchmarks is not None and benchmarks.all_tasks:
            self.benchmarks = benchmarks
            self.manager = manager or task_manager(benchmarks.include, benchmarks.all_tasks)

    def _targets(self, others: Sequence[str]) -> list:
        return [self.work.tuned, *(LazyTensors(self.pool.checkpoint(m), self.work.names) for m in others)]

    def __call__(self, item, progress: Progress = None) -> tuple[Scorecard, float]:
        fn, name, *rest = item
        report(progress, 0.0, f"{name.partition(':')[2]}: writing weights")
        self.work.set(fn, self._targets(rest[0] if rest else ()))
        dist = _distance(self.work)
        card = evaluate(self.work.model, self.pool.tokenizer, self.pool.probes, name=name,
                        benchmarks=self.benchmarks, benchmark_manager=self.manager,
                        progress=scaled(progress, 0.05, 1.0), **self.kw)
        return card, dist


class _SweepFactory(PoolWorkerFactory):
    """Builds a `_SweepState` (the model's working copy) on a worker (`forgetlab.executors.PoolWorkerFactory`)."""

    local_only = ("manager",)     # the driver's lm-eval task manager, reused in process (rebuilt remotely)

    def __init__(self, pool, model, device, batch_size, max_general, max_task, tasks, benchmarks, manager=None,
                 dtype=None):
        super().__init__(pool)
        self.model, self.device, self.dtype = model, device, dtype
        self.members = [model]
        self.args = (batch_size, max_general, max_task, list(tasks), benchmarks)
        self.manager = manager

    def build(self, pool) -> _SweepState:
        return _SweepState(pool, self.model, self.device, *self.args, manager=self.manager, dtype=self.dtype)


def sweep_recipe(pool, model: str, kind: str, **kw) -> dict[str, Any]:
    """What a sweep records to be redone: its kind, pool (file and name), model and `kw` (grid, evaluation)."""
    return {"sweep": kind, "pool": pool_source(pool), "pool_name": getattr(pool, "name", None), "model": model, **kw}


def wise_ft_at(alpha: float) -> TensorMerger:
    """WiSE-FT at α (the registry's `wise_ft`: α = 0 writes θ0 and α = 1 writes θ1 bit for bit)."""
    return TensorMerger("wise_ft", {"alpha": alpha})


def _slerp(t: float) -> TensorMerger:
    """SLERP of θ0 and θ1 at t (the registry's `slerp`, mergekit's); t = 0 is θ0 and t = 1 is θ1, exactly."""
    if t <= 0 or t >= 1:
        return wise_ft_at(1.0 if t >= 1 else 0.0)
    return TensorMerger("slerp", {"t": t})


def _check_methods(methods: Sequence[str], choices: Sequence[str], what: str) -> list[str]:
    methods = list(methods or [])
    if not methods:
        raise ParameterError(f"Give at least one {what}: {', '.join(choices)}.")
    for m in methods:
        if m not in choices:
            raise ParameterError(f"Unknown {what} {m!r}; choose from {', '.join(choices)}.")
    return methods


def alpha_curve(pool, model: str, *, alphas: Sequence[float] = AlphaSettings.alphas,
                methods: Sequence[str] = AlphaSettings.methods, task: Optional[str] = None,
                device: Optional[str] = None, batch_size: int = SweepSettings.batch_size,
                max_general: Optional[int] = None, max_task: Optional[int] = None,
                tasks: Optional[Sequence[str]] = None, on_point: OnPoint = None,
                progress: Progress = None, benchmarks=None, executor=None, dtype=None) -> SweepResult:
    """WiSE-FT curve: evaluate θ(α) = (1 − α)·θ0 + α·θ1 at each α of `alphas` (default 0, 0.1, …, 1); with
    "slerp" in `methods`, also SLERP(θ0, θ1, t = α) (mergekit's: the angle between each pair of whole tensors,
    linear where they are nearly parallel, docs/methods.md#slerp) as a second series on the same axis.

    α = 0 is the base and α = 1 the fine-tuned model, bit for bit (shared by both series, evaluated once).
    `on_point(point, result)` is called after each point with the result so far.
    """
    grid = check_grid("alpha", alphas)
    methods = _check_methods(methods, ALPHA_METHODS, "interpolation")
    specs = []
    for m in methods:
        for a in grid:
            key = "base" if a <= 0 else ("ft" if a >= 1 else None)
            seen = any(sp.key == key for sp in specs) if key else False
            settings = {"alpha": a} if m == "wise-ft" else {"t": a}
            specs.append(SweepSpec(m, a, settings, wise_ft_at(a) if m == "wise-ft" else _slerp(a),
                               same_as=key if seen else None, key=key))
    extra = {} if methods == ["wise-ft"] else {"methods": methods}
    recipe = sweep_recipe(pool, model, "alpha", alphas=grid, **extra, task=task, max_general=max_general,
                     max_task=max_task, tasks=list(tasks) if tasks is not None else None)
    return run_specs(pool, model, "alpha", specs, task=task, recipe=recipe, device=device, batch_size=batch_size,
                max_general=max_general, max_task=max_task, tasks=tasks, on_point=on_point, progress=progress,
                benchmarks=benchmarks, executor=executor, dtype=dtype)


def _pruned(ratio: float, score: str) -> TensorMerger:
    """FAPM at `ratio` with `score` (the registry's `fapm`, λ = 1); ratio 0 is θ1 and ratio 1 is θ0, exactly."""
    if ratio <= 0:
        return wise_ft_at(1.0)
    if ratio >= 1:
        return wise_ft_at(0.0)
    return TensorMerger("fapm", {"ratio": ratio, "score": score})


def pruning_curve(pool, model: str, *, ratios: Sequence[float] = PruningSettings.ratios,
                  scores: Sequence[str] = PruningSettings.scores, task: Optional[str] = None,
                  device: Optional[str] = None, batch_size: int = SweepSettings.batch_size, max_general: Optional[int] = None, max_task: Optional[int] = None,
                  tasks: Optional[Sequence[str]] = None, on_point: OnPoint = None,
                  progress: Progress = None, benchmarks=None, executor=None, dtype=None) -> SweepResult:
    """FAPM pruning curve: θ = θ0 + mask ⊙ τ, mask keeping the entries of largest score so that ⌊ratio·n⌋
    entries of every tensor are zeroed (the registry's `fapm`), for each ratio and each score
    ("fapm" S = |τ| − mean|W0|·|τ|/|W0|, and the ablations "magnitude" S = |τ|, "relative" S = −|τ|/|W0|).

    Ratio 0 is the fine-tuned model and ratio 1 the base (identical across scores, evaluated once).
    """
    grid = check_grid("ratio", ratios)
    scores = list(scores)
    if not scores:
        raise ParameterError(f"Give at least one pruning score: {', '.join(PRUNING_SCORES)}.")
    for s in scores:
        if s not in PRUNING_SCORES:
            raise ParameterError(f"Unknown pruning score {s!r}; choose from {', '.join(PRUNING_SCORES)}.")
    specs = []
    for s in scores:
        for r in grid:
            key = "ft" if r <= 0 else ("base" if r >= 1 else None)
            seen = any(sp.key == key for sp in specs) if key else False
            specs.append(SweepSpec(s, r, {"ratio": r, "score": s}, _pruned(r, s), same_as=key if seen else None,
                               key=key))
    recipe = sweep_recipe(pool, model, "pruning", ratios=grid, scores=scores, task=task, max_general=max_general,
                     max_task=max_task, tasks=list(tasks) if tasks is not None else None)
    return run_specs(pool, model, "pruning", specs, task=task, recipe=recipe, device=device, batch_size=batch_size,
                max_general=max_general, max_task=max_task, tasks=tasks, on_point=on_point, progress=progress,
                benchmarks=benchmarks, executor=executor, dtype=dtype)


def _dare(drop: float, seed: int) -> TensorMerger:
    """DARE at drop rate p (the registry's `dare_linear`, λ = 1, masks seeded per tensor); p = 0 is θ1 and
    p = 1 is θ0, exactly."""
    if drop <= 0:
        return wise_ft_at(1.0)
    if drop >= 1:
        return wise_ft_at(0.0)
    return TensorMerger("dare_linear", {"drop": drop, "seed": seed, "rescale": "inverse"})  # the DARE paper's 1/(1 − p)


def _ties(keep: float) -> TensorMerger:
    """TIES trimming to `keep` (the registry's `ties`, per tensor, λ = 1: with one task vector the elected sign is
    sign(τ) and the disjoint mean the trimmed τ itself); keep 1 is θ1 and keep 0 is θ0, exactly."""
    if keep >= 1:
        return wise_ft_at(1.0)
    if keep <= 0:
        return wise_ft_at(0.0)
    return TensorMerger("ties", {"keep": keep, "scope": "tensor"})


def della_epsilon(density: float) -> float:
    """ε for a DELLA point at `density`: mergekit's default 0.15, narrowed to half the distance to 0 or 1 so that
    density ± ε stays inside (0, 1)."""
    return min(DELLA_EPSILON, density / 2, (1 - density) / 2)


def _della(density: float, seed: int) -> TensorMerger:
    """DELLA's MAGPRUNE of τ at `density` (the registry's `della`, one model: λ = 1, L1 rescale, ε from
    `della_epsilon`, masks seeded per tensor); density 1 is θ1 and 0 is θ0, exactly."""
    if density >= 1:
        return wise_ft_at(1.0)
    if density <= 0:
        return wise_ft_at(0.0)
    return TensorMerger("della", {"density": density, "epsilon": della_epsilon(density), "seed": seed})


def _sce(select_topk: float, n_models: int) -> TensorMerger:
    """SCE of θ1 and the pool's other fine-tuned models at `select_topk` (the registry's `sce`); 0 is θ0, exactly."""
    if select_topk <= 0:
        return wise_ft_at(0.0)
    return TensorMerger("sce", {"select_topk": select_topk}, n_models=n_models)


def density_curve(pool, model: str, *, drops: Sequence[float] = DensitySettings.drops,
                  keeps: Sequence[float] = DensitySettings.keeps, methods: Sequence[str] = DensitySettings.methods,
                  seed: int = DensitySettings.seed, task: Optional[str] = None, device: Optional[str] = None,
                  batch_size: int = SweepSettings.batch_size,
                  max_general: Optional[int] = None, max_task: Optional[int] = None,
                  tasks: Optional[Sequence[str]] = None, on_point: OnPoint = None,
                  progress: Progress = None, benchmarks=None, executor=None, dtype=None) -> SweepResult:
    """Density curves of one task vector: DARE θ0 + dare(τ, p) (drop each entry with probability p, rescale
    survivors by 1/(1 − p), seeded per tensor) over `drops`, and TIES θ0 + trim(τ, keep) (top keep fraction
    by |τ|) over `keeps`; x = density = 1 − p for DARE, keep for TIES. Density 1 is the fine-tuned model.
    "della" adds DELLA at density = each keep (`_della`), "sce" SCE at select_topk = each keep, merging θ1
    with the pool's other fine-tuned models (`_sce`; it needs at least one more)."""
    methods = _check_methods(methods, DENSITY_METHODS, "density method")
    others: tuple[str, ...] = ()
    if "sce" in methods:
        check_swept_model(pool, model)
        others = tuple(m for m in pool.model_names if m != model)
        if not others:
            raise ParameterError("SCE's density curve merges the model with the pool's other fine-tuned models "
                                 "(its selection needs the variance across task vectors), and the pool has no "
                                 "other; add one to the pool or leave sce out.")
    specs = []
    drop_grid = check_grid("drop", drops) if "dare" in methods else []
    keep_grid = check_grid("keep", keeps) if {"ties", "della", "sce"} & set(methods) else []
    for p in drop_grid:
        key = "ft" if p <= 0 else ("base" if p >= 1 else None)
        seen = any(sp.key == key for sp in specs) if key else False
        specs.append(SweepSpec("dare", 1.0 - p, {"drop": p, "seed": int(seed)}, _dare(p, int(seed)),
                           same_as=key if seen else None, key=key))
    for m in ("ties", "della", "sce"):
        if m not in methods:
            continue
        for k in keep_grid:
            key = "base" if k <= 0 else ("ft" if k >= 1 and m != "sce" else None)
            seen = any(sp.key == key for sp in specs) if key else False
            if m == "ties":
                spec = SweepSpec("ties", k, {"keep": k}, _ties(k))
            elif m == "della":
                spec = SweepSpec("della", k, {"density": k, "epsilon": della_epsilon(k), "seed": int(seed)},
                             _della(k, int(seed)))
            else:
                spec = SweepSpec("sce", k, {"select_topk": k, "models": [model, *others]}, _sce(k, 1 + len(others)),
                             others=others)
            spec.same_as, spec.key = (key if seen else None), key
            specs.append(spec)
    recipe = sweep_recipe(pool, model, "density", drops=drop_grid, keeps=keep_grid, methods=methods, seed=int(seed),
                     task=task, max_general=max_general, max_task=max_task,
                     tasks=list(tasks) if tasks is not None else None)
    return run_specs(pool, model, "density", specs, task=task, recipe=recipe, device=device, batch_size=batch_size,
                max_general=max_general, max_task=max_task, tasks=tasks, on_point=on_point, progress=progress,
                benchmarks=benchmarks, executor=executor, dtype=dtype)


def _hma(alphas: Sequence[float], config, names: Sequence[str]) -> TensorMerger:
    """HMA with one α per block of layers (the registry's `hma`)."""
    return TensorMerger("hma", {"alphas": list(alphas)}, config=config, names=names)


def hma_grid(pool, model: str, *, grid: Sequence[Sequence[float]] = HmaSettings.grid, task: Optional[str] = None,
             device: Optional[str] = None, batch_size: int = SweepSettings.batch_size, max_general: Optional[int] = None,
             max_task: Optional[int] = None, tasks: Optional[Sequence[str]] = None, on_point: OnPoint = None,
             progress: Progress = None, benchmarks=None, executor=None, dtype=None) -> SweepResult:
    """HMA grid: for each α tuple (α1 … αB), WiSE-FT with one α per block of decoder layers (B contiguous
    blocks of near-equal size; embeddings take α1, the final norm and lm_head αB) — docs/methods.md#hma.
    x = the tuple's mean α. Default grid: the MoFO rebuttal's 15 triples."""
    tuples = [list(t) for t in (grid or [])]
    if not tuples:
        raise ParameterError("The HMA grid is empty; give α tuples such as 0.1,0.2,0.3.")
    sizes = {len(t) for t in tuples}
    if len(sizes) != 1 or 0 in sizes:
        raise ParameterError(f"Every HMA tuple needs the same number of blocks (≥ 1); got sizes {sorted(sizes)}.")
    tuples = [[check_fraction("every HMA alpha", a) for a in t] for t in tuples]
    check_swept_model(pool, model)
    names = [n for n in pool.base.names()]
    specs = [SweepSpec("hma", sum(t) / len(t), {"alphas": t}, _hma(t, pool.config, names)) for t in tuples]
    recipe = sweep_recipe(pool, model, "hma", grid=tuples, task=task, max_general=max_general, max_task=max_task,
                     tasks=list(tasks) if tasks is not None else None)
    return run_specs(pool, model, "hma", specs, task=task, recipe=recipe, device=device, batch_size=batch_size,
                max_general=max_general, max_task=max_task, tasks=tasks, on_point=on_point, progress=progress,
                benchmarks=benchmarks, executor=executor, dtype=dtype)


# ------------------------------------------------------------------------------ the analyses and saved runs


SWEEPS: dict[str, Callable[..., SweepResult]] = {"alpha": alpha_curve, "pruning": pruning_curve,
                                                 "density": density_curve, "hma": hma_grid}
"""The curve of each kind declared here, looked up when its sweep runs (forgetlab.analysis.sweep_analysis)."""

ALPHA = sweep_analysis("alpha", AlphaSettings, SWEEPS, title="WiSE-FT α / SLERP t curve",
                       help="WiSE-FT θ(α) = (1 − α)·θ0 + α·θ1",
                       description="WiSE-FT θ(α) = (1 − α)·θ0 + α·θ1 at each α of the grid (and mergekit's SLERP at "
                                   "t = α with --methods wise-ft slerp).")
PRUNING = sweep_analysis("pruning", PruningSettings, SWEEPS, title="FAPM pruning curve (+ ablations)",
                         help="FAPM pruning ratios, with magnitude/relative ablations",
                         description="FAPM θ0 + mask ⊙ τ over pruning ratios (the share of each tensor's task-vector "
                                     "entries zeroed), with the magnitude and relative scores as ablations.")
DENSITY = sweep_analysis("density", DensitySettings, SWEEPS, title="DARE / TIES / DELLA / SCE density curve",
                         help="DARE drop rates, TIES keep fractions, DELLA and SCE densities against density",
                         description="DARE over drop rates and TIES (DELLA, SCE) over keep fractions, against the "
                                     "density (the share of τ's entries that survive).")
HMA = sweep_analysis("hma", HmaSettings, SWEEPS, title="HMA grid (α per block)",
                     help="HMA: one α per block of layers, over a grid of α tuples",
                     description="HMA: WiSE-FT with one α per block of decoder layers, for each α tuple of the grid "
                                 "(x = the tuple's mean α).")


def save_sweep(result: SweepResult, home_path: str | Path | None = None) -> Path:
    """Save a sweep under the workspace's runs/ (kind `sweep-<kind>`: recipe.json, results.json, results.csv), as
    its analysis saves it."""
    return ANALYSES.get(f"sweep-{result.kind}").save(result, home_path=home_path)


def load_sweep(path: str | Path) -> SweepResult:
    """Reopen a sweep of any kind saved by `save_sweep` (its analysis' `load`)."""
    kind = str(load_run(path).kind)
    analysis = analysis_for_kind(kind) if kind.startswith("sweep-") else None
    if analysis is None:
        raise WorkspaceError(f"{path} holds a {kind} run, not a sweep.")
    return analysis.load(path)


def list_sweeps(home_path: str | Path | None = None, model: Optional[str] = None) -> list[SavedRun]:
    """Saved sweeps of every kind (newest first), optionally of one model."""
    return [r for r in list_runs(home_path) if str(r.kind).startswith("sweep-")
            and (model is None or r.recipe.get("model") == model)]
