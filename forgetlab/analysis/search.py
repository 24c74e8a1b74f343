"""Merge search: CMA-ES over a merge method's per-model weights (and optionally per-block α as in HMA),
maximising speciality while bounding forgetting — what mergekit-evolve does, on forgetlab's measures.

A candidate x = (v1 … vN[, α1 … αB]) sets the recipe's per-model parameter (`weights` for linear / task
arithmetic / TIES / DARE, `lam` for PCB…) to v1 … vN and, with `hma_blocks=B`, scales the merged task vector
per block of decoder layers: θ = θ0 + αb·(merge(θ0, θ1…θN; v) − θ0) for the tensors of block b (blocks and the
placement of embeddings / head as in docs/methods.md's HMA). Each candidate is merged in memory from the base and
fine-tuned weights that every worker holds resident, written into the worker's working copy of the model, and
evaluated on the pool's **probe** split (speciality: exact match, or answer loss, on the tasks; generality:
general-text loss). Forgetting = general loss − the base's general loss (`Scorecard.forgetting`).

Objectives (CMA-ES minimises J; s = speciality oriented so that higher is better, f = forgetting):
- ``constrained`` (default): J = −s + 10·max(0, f − max_forgetting); the best point is the feasible one
  (f ≤ max_forgetting) with the highest s (ties: lower f), else the one with the least excess forgetting;
- ``weighted``: J = −s + forgetting_weight·f; the best point minimises J.

The points run on an executor (`forgetlab.executors`: in process, or on Ray actors kept for the whole search);
CMA-ES is seeded, so the same search gives the same points locally and on Ray. Every point records its worker.

`ANALYSIS` ("search") is the search as an analysis (forgetlab.analysis.base): `forgetlab search RECIPE --pool POOL`,
the Merge page's search panel and the Runs page all go through it; its result lives in `search_results`.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch
import yaml

from forgetlab.analysis.base import ANALYSES, Analysis, Output
from forgetlab.analysis.measures import higher_is_better, measure_benchmarks, pareto_mask
from forgetlab.analysis.search_memory import estimate_search, resident_dtype
from forgetlab.analysis.search_results import SearchPoint, SearchResult, takeaway
from forgetlab.core.benchmarks import checked_manager, pick, require_task, task_manager
from forgetlab.core.checkpoints import load_model, open_checkpoint
from forgetlab.core.errors import MissingDependencyError, ParameterError, ProbeDataError
from forgetlab.core.evaluate import evaluate
from forgetlab.core.memory import dtype_name, job_dtype, large_frees_to_os
from forgetlab.core.progress import Progress, publish, report, scaled
from forgetlab.core.settings import count_field, device_field, dtype_field, setting
from forgetlab.executors import ExecutorError, PoolWorkerFactory, executor_lines, make_executor
from forgetlab.merge import merge_state_dicts
from forgetlab.merge.recipe_io import load_recipe
from forgetlab.merge.recipes import ModelEntry
from forgetlab.merge.registry import get_method
from forgetlab.merge.working_copy import TensorMerger
from forgetlab.plots.merge import search_figure

OBJECTIVES = ("constrained", "weighted")
SEARCH_MEASURES = ("exact_match", "answer_loss")
PENALTY = 10.0
SEED_MAX = 2**32 - 2        # CMA-ES is seeded with seed + 1, within numpy's legacy seeds (< 2**32)


# ---------------------------------------------------------------------------------------------- workers


def _per_model_param(method: str, name: Optional[str]):
    spec = get_method(method)
    numeric = [p for p in spec.params if p.per_model and p.type in ("float", "floats")]
    if name is None:  # the models' weights where the method has them (not a per-model sparsity knob such as keep)
        return next((p for p in numeric if p.name == "weights"), numeric[0] if numeric else None)
    for p in numeric:
        if p.name == name or p.model_key == name:
            return p
    raise ParameterError(f"{method} has no per-model numeric parameter {name!r}; searchable ones: "
                         f"{', '.join(p.name for p in numeric) or 'none (use hma_blocks to search block α)'}.")


def searchable_param(method: str) -> Optional[str]:
    """The per-model numeric parameter `search` tunes for `method` by default (`weights` where it has them, else
    its first one, e.g. `lam` of PCB), or None when the method has none."""
    spec = _per_model_param(method, None)
    return spec.name if spec is not None else None


class _SearchState:
    """A search worker: base and fine-tuned weights resident (`resident_dtype`, on the CPU), one working copy of
    the model on the job's device in its dtype."""

    def __init__(self, pool, method: str, params: dict, param: Optional[str], base_ref: str,
                 model_refs: Sequence[str], device: Optional[str], eval_kw: dict, benchmarks=None,
                 scalars: Sequence[str] = (), dtype=None):
        self.pool, self.method, self.params, self.param = pool, method, dict(params), param
        self.scalars = list(scalars)
        dt = job_dtype(dtype, device)
        base = open_checkpoint(base_ref)
        tuned = [open_checkpoint(r, base=base) for r in model_refs]
        held = resident_dtype(dt, [base, *tuned])
        self.base = base.state_dict(held)
        self.fts = [c.state_dict(held) for c in tuned]
        self.config = base.config
        self.model = load_model(base, device=device, dtype=dt)
        self.dev = next(self.model.parameters()).device
        self.live = dict(self.model.named_parameters())
        self.eval_kw = dict(eval_kw)
        if benchmarks is not None and benchmarks.all_tasks:     # lm-eval tasks run on every candidate

            self.eval_kw.update(benchmarks=benchmarks,
                                benchmark_manager=task_manager(benchmarks.include, benchmarks.all_tasks))

    def _write(self, state: Mapping[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, p in self.live.items():
                p.copy_(state[name].to(device=self.dev, dtype=p.dtype))

    def __call__(self, item, progress: Progress = None):
        """Merge the candidate `item` (None: the base) into the working copy and evaluate it on the probe split.
        On the CPU inside `large_frees_to_os`, so a long search's freed merges and logits go back to the system
        instead of piling up as heap from candidate to candidate."""
        with large_frees_to_os(self.dev):
            return self._evaluate(item, progress)

    def _evaluate(self, item, progress: Progress = None):
        if item is None:
            self._write(self.base)
            name = "base"
        else:
            values, scalars, alphas = item
            params = dict(self.params)
            if self.param is not None:
                params[self.param] = [float(v) for v in values]
            params.update({n: float(v) for n, v in zip(self.scalars, scalars)})
            merged = merge_state_dicts(self.method, self.base, self.fts, config=self.config, **params)
            if alphas:      # then HMA between the base and that merge: one α per block of layers
                hma = TensorMerger("hma", {"alphas": list(alphas)}, config=self.config, names=list(self.base))
                for n, t in merged.items():
                    if t.is_floating_point() and n in self.base:
                        merged[n] = hma(n, self.base[n], t.to(torch.float32), owned=False)
            self._write(merged)
            del merged
            name = "candidate"
        return evaluate(self.model, self.pool.tokenizer, self.pool.probes, name=name, split="probe",
                        progress=progress, **self.eval_kw)


class _SearchFactory(PoolWorkerFactory):
    """Builds a `_SearchState` on a worker (`forgetlab.executors.PoolWorkerFactory`; it reads the checkpoints
    itself, so only the pool's base and probe data travel)."""

    members: Sequence[str] = ()

    def build(self, pool) -> _SearchState:
        return _SearchState(pool, *self.args)


# ---------------------------------------------------------------------------------------------- driver


def _label(pool, ref: str) -> str:
    """A short name for a recipe's model: its pool name, else its folder's name."""
    for name, e in pool.entries.items():
        if ref == name or Path(e.ref).resolve() == Path(ref).resolve():
            return name
    return Path(ref).name or ref


def _scores(card, task: Optional[str], measure: str) -> tuple[float, float]:
    """(speciality in `measure`, answer loss) of a candidate's scorecard: on `task`, else the mean over tasks;
    an lm-eval `TASK/METRIC` measure is read from the card's benchmarks."""
    if "/" in measure:
        return pick(card.benchmarks, measure), _scores(card, task, "answer_loss")[1]
    if task is not None and task in card.tasks:
        em, al = card.tasks[task].exact_match, card.tasks[task].answer_loss
    else:
        em = card.speciality(None)
        al = sum(t.answer_loss for t in card.tasks.values()) / max(1, len(card.tasks))
    return (em if measure == "exact_match" else al), al


def search_scalars(method: str, param: Optional[str] = None, scalars: Optional[Sequence[str]] = None) -> list[str]:
    """The method-wide parameters a search tunes: `scalars` when given, else the method's own choice
    (`MethodSpec.extra["search_scalars"]`: lines' α and β) when no per-model `param` is named."""
    spec = get_method(method)
    if scalars is None:
        return list(spec.extra.get("search_scalars", ())) if param is None else []
    names = list(scalars)
    for n in names:
        p = spec.param(n)
        if p.type != "float" or p.per_model:
            raise ParameterError(f"{method}: {n} is not a single number that a search can tune.")
    return names


def _checked(recipe, pool, *, budget: int, objective: str, measure: str, task: Optional[str], param: Optional[str],
             bounds: tuple[float, float], hma_blocks: int, benchmarks, scalars: Optional[Sequence[str]] = None,
             sigma0: float = 0.3, popsize: Optional[int] = None, seed: int = 0):
    """The search's checks of its settings (see `check_search`); returns (recipe, the searched parameter's spec
    or None, (low, high), the searched method-wide parameters)."""

    recipe = load_recipe(recipe)
    if objective not in OBJECTIVES:
        raise ParameterError(f"Unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}.")
    if "/" in str(measure):
        require_task(measure, benchmarks)
        checked_manager(benchmarks)
    elif measure not in SEARCH_MEASURES:
        raise ParameterError(f"Unknown measure {measure!r}; choose one of {', '.join(SEARCH_MEASURES)} or an "
                             "lm-eval metric TASK/METRIC.")
    if int(budget) < 1:
        raise ParameterError(f"budget must be at least 1 evaluation; got {budget}.")
    if int(hma_blocks) < 0:
        raise ParameterError(f"hma_blocks must be ≥ 0; got {hma_blocks}.")
    if int(hma_blocks) > pool.anatomy.num_layers:
        raise ParameterError(f"hma_blocks must be at most the model's {pool.anatomy.num_layers} layers (one α per "
                             f"block of layers); got {hma_blocks}.")
    if not 0 < float(sigma0) < math.inf:
        raise ParameterError(f"sigma0 (CMA-ES's first step size) must be a finite number > 0, e.g. 0.3; got {sigma0}.")
    if popsize is not None and int(popsize) < 2:
        raise ParameterError(f"popsize must be at least 2 (CMA-ES compares candidates), or left out for CMA-ES's "
                             f"default; got {popsize}.")
    if not 0 <= int(seed) <= SEED_MAX:
        raise ParameterError(f"seed must be a whole number from 0 to 2**32 − 2 (CMA-ES is seeded with seed + 1); got "
                             f"{seed}.")
    lo, hi = float(bounds[0]), float(bounds[1])
    if not lo < hi:
        raise ParameterError(f"bounds must be LOW < HIGH; got {bounds}.")
    if pool.probes is None or not pool.probes.tasks or not pool.probes.general:
        raise ProbeDataError("The merge search evaluates on the pool's probe split: the pool needs task probe files "
                             "and held-out general text (pool.yaml probes).")
    pool.check_tasks([task] if task is not None else [])
    names = search_scalars(recipe.method, param, scalars)
    pspec = None if (names and param is None) else _per_model_param(recipe.method, param)
    if pspec is None and not hma_blocks and not names:
        raise ParameterError(f"{recipe.method} has no per-model weight to search; pick another method or search "
                             "per-block α with hma_blocks.")
    if pspec is not None and pspec.range and (lo < pspec.range[0] or hi > pspec.range[1]):
        raise ParameterError(f"bounds {bounds} leave {pspec.name}'s range {pspec.range}.")
    recipe.validated_params()
    return recipe, pspec, (lo, hi), names


def check_search(recipe, pool, *, budget: int = 30, objective: str = "constrained", measure: str = "exact_match",
                 task: Optional[str] = None, param: Optional[str] = None, bounds: tuple[float, float] = (0.0, 2.0),
                 hma_blocks: int = 0, benchmarks=None, scalars: Optional[Sequence[str]] = None, sigma0: float = 0.3,
                 popsize: Optional[int] = None, seed: int = 0, **_ignored) -> None:
    """Raise the ForgetlabError that `search(recipe, pool, ...)` would raise for these settings (recipe, budget,
    objective, measure, task, parameter, bounds, blocks, CMA-ES's step size, population and seed, probe data),
    without loading a model: the app checks a search before starting it in the background. Other `search`
    keyword arguments are accepted and ignored."""
    _checked(recipe, pool, budget=budget, objective=objective, measure=measure, task=task, param=param,
             bounds=bounds, hma_blocks=hma_blocks, benchmarks=benchmarks, scalars=scalars, sigma0=sigma0,
             popsize=popsize, seed=seed)


def search(recipe, pool, *, budget: int = 30, objective: str = "constrained", max_forgetting: float = 0.05,
           forgetting_weight: float = 1.0, measure: str = "exact_match", task: Optional[str] = None,
           param: Optional[str] = None, bounds: tuple[float, float] = (0.0, 2.0), hma_blocks: int = 0,
           sigma0: float = 0.3, popsize: Optional[int] = None, seed: int = 0, device: Optional[str] = None,
           dtype=None, batch_size: int = 16, max_general: Optional[int] = None, max_task: Optional[int] = None,
           executor=None, on_point=None, progress: Progress = None, benchmarks=None,
           scalars: Optional[Sequence[str]] = None) -> SearchResult:
    """CMA-ES merge search (module docstring). `recipe`: a `forgetlab.merge.recipes.Recipe` or its file/dict;
    its per-model values (or the parameter's default) are the start. `budget` counts candidate evaluations
    (the start included; the base's own evaluation is extra). `on_point(point, result)` after each point.
    `measure` may be an lm-eval `TASK/METRIC` of the tasks in `benchmarks` (a BenchmarkSpec), run on every
    candidate as mergekit-evolve scores merges. `scalars`: method-wide numeric parameters searched too (default:
    the method's choice, e.g. lines' α and β, searched instead of its per-model weights), within `bounds` and
    their own ranges. `dtype` (None: bfloat16 on cuda, float32 elsewhere) is the working copy's precision; the
    merges are computed in float32 per tensor and the losses reduced in float32. Its peak per worker:
    `forgetlab.analysis.search_memory`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")           # cma warns that matplotlib is missing (no plots needed)
            import cma
    except ImportError:  # pragma: no cover - cma is a dependency
        raise MissingDependencyError("The merge search needs the cma package: pip install cma") from None
    recipe, pspec, (lo, hi), scalar_names = _checked(recipe, pool, budget=budget, objective=objective,
                                                     measure=measure, task=task, param=param, bounds=bounds,
                                                     hma_blocks=hma_blocks, benchmarks=benchmarks, scalars=scalars,
                                                     sigma0=sigma0, popsize=popsize, seed=seed)
    base_params = recipe.validated_params()
    n = len(recipe.models)
    start: list[float] = []
    if pspec is not None:
        v = base_params.get(pspec.name, pspec.default)
        start = [float(x) for x in (v if isinstance(v, (list, tuple)) else [v] * n)]
        start = [min(hi, max(lo, x)) for x in start]

    mspec = get_method(recipe.method)
    s_lows = [max(lo, mspec.param(n).range[0]) if mspec.param(n).range else lo for n in scalar_names]
    s_highs = [min(hi, mspec.param(n).range[1]) if mspec.param(n).range else hi for n in scalar_names]
    s0 = [min(h, max(low, float(base_params[n]))) for n, low, h in zip(scalar_names, s_lows, s_highs)]
    ns = len(start) + len(s0)
    x0 = start + s0 + [1.0] * int(hma_blocks)
    lows = [lo] * len(start) + s_lows + [0.0] * int(hma_blocks)
    highs = [hi] * len(start) + s_highs + [1.0] * int(hma_blocks)
    models = [_label(pool, m.model) for m in recipe.models]
    eval_kw = dict(batch_size=batch_size, max_general=max_general, max_task=max_task)
    refs = [pool.resolve_ref(m.model) for m in recipe.models]
    dt = job_dtype(dtype, device)
    factory = _SearchFactory(pool, recipe.method, base_params, pspec.name if pspec else None,
                             pool.resolve_ref(recipe.base), refs, device, eval_kw, benchmarks, scalar_names, dt)
    executor = make_executor(executor)
    settings = dict(budget=int(budget), seed=int(seed), sigma0=float(sigma0), bounds=[lo, hi], scalars=scalar_names,
                    hma_blocks=int(hma_blocks), task=task, popsize=popsize, dtype=dtype_name(dt), **eval_kw,
                    benchmarks=benchmarks.to_dict() if benchmarks is not None else None)
    t_start = time.perf_counter()
    report(progress, 0.0, "starting the workers")
    with executor.workers(factory, progress=scaled(progress, 0.0, 0.1)) as workers:
        first = workers.map([None])[0]
        if not first.ok:
            raise ExecutorError(f"The base could not be evaluated on a worker: {first.error}")
        base_card = first.value
        base_spec, _ = _scores(base_card, task, measure)
        result = SearchResult(recipe.method, pspec.name if pspec else None, models, objective, measure,
                              float(max_forgetting), float(forgetting_weight), base_card.general_loss, base_spec,
                              recipe=recipe.to_dict(), settings=settings, executor={"name": executor.name},
                              scalar_names=scalar_names)
        sign = 1.0 if higher_is_better(measure) else -1.0

        def run(xs: list[list[float]]) -> list[float]:
            items = [(x[: len(start)], x[len(start):ns], x[ns:] or None) for x in xs]
            outs = workers.map(items, progress=None)
            js = []
            for x, out in zip(xs, outs):
                p = SearchPoint(len(result.points), [float(v) for v in x[: len(start)]],
                                [float(v) for v in x[ns:]] or None, [float(v) for v in x[len(start):ns]] or None,
                                executor=executor.name,
                                seconds=out.seconds, worker=dict(out.worker or {}), error=out.error)
                if out.ok:
                    card = out.value
                    p.speciality, p.answer_loss = _scores(card, task, measure)
                    p.general_loss = card.general_loss
                    p.forgetting = card.forgetting(base_card)
                    s = sign * p.speciality
                    p.objective = (-s + PENALTY * max(0.0, p.forgetting - max_forgetting) if objective == "constrained"
                                   else -s + forgetting_weight * p.forgetting)
                    if math.isnan(p.objective):
                        p.objective = float("inf")
                result.points.append(p)
                _finish(result)
                report(progress, 0.1 + 0.9 * len(result.points) / budget,
                       f"{len(result.points)}/{budget}: speciality {p.speciality:.3f}, forgetting {p.forgetting:+.4f}")
                if on_point is not None:
                    on_point(p, result)
                js.append(p.objective)
            return js

        run([list(x0)])
        if budget > 1 and x0:
            opts = {"bounds": [lows, highs], "seed": int(seed) + 1, "verbose": -9, "maxfevals": budget - 1}
            if popsize:
                opts["popsize"] = int(popsize)
            es = cma.CMAEvolutionStrategy(x0, sigma0, opts)
            while not es.stop() and len(result.points) < budget:
                xs = [list(map(float, x)) for x in es.ask()]
                xs = xs[: budget - len(result.points)]
                js = run(xs)
                if len(xs) < es.popsize:
                    break
                es.tell(xs, js)
    result.executor = executor.describe()
    best = result.best_point
    if best is not None:
        out = tuned_recipe(recipe, pspec, best.values, dict(zip(scalar_names, best.scalars or [])))
        result.best_recipe = out.to_dict()
        if best.alphas:
            result.best_recipe["forgetlab"] = {"hma_block_alphas": [round(a, 6) for a in best.alphas]}
    result.seconds = time.perf_counter() - t_start
    report(progress, 1.0, "search done")
    return result


def tuned_recipe(recipe, param=None, values: Sequence[float] = (), scalars: Optional[Mapping[str, float]] = None):
    """`recipe` with the values a search found, rounded to 6 digits: `values[i]` under model i's key of the
    per-model parameter `param` (a `forgetlab.merge.registry.ParamSpec`; its method-wide value is dropped) and
    `scalars` (name → value) as method-wide parameters. The best recipe of a merge search, and PCB's λ found
    (`forgetlab.analysis.lambda_search`)."""
    entries = list(recipe.models)
    if param is not None:
        key = param.model_key or param.name
        entries = [ModelEntry(m.model, {**m.params, key: round(v, 6)}) for m, v in zip(recipe.models, values)]
    params = {k: v for k, v in recipe.params.items() if param is None or k != param.name}
    params.update({n: round(v, 6) for n, v in (scalars or {}).items()})
    return type(recipe)(recipe.method, recipe.base, entries, params, recipe.dtype, recipe.seed, recipe.name,
                        recipe.pool)


def _finish(result: SearchResult) -> None:
    """Mark the Pareto front (speciality up, general loss down) and pick the best point."""

    ok = [p for p in result.points if p.error is None]
    sign = 1.0 if higher_is_better(result.measure) else -1.0
    flags = pareto_mask([sign * p.speciality for p in ok], [p.general_loss for p in ok])
    for p in result.points:
        p.pareto = False
    for p, f in zip(ok, flags):
        p.pareto = f
    if not ok:
        result.best = None
        return
    if result.objective == "constrained":
        feasible = [p for p in ok if p.forgetting <= result.max_forgetting]
        if feasible:
            best = max(feasible, key=lambda p: (sign * p.speciality, -p.forgetting, -p.index))
        else:
            best = min(ok, key=lambda p: (p.forgetting, p.index))
    else:
        best = min(ok, key=lambda p: (p.objective, p.index))
    result.best = best.index


# ------------------------------------------------------------------------------------------ the analysis


@dataclass
class SearchSettings:
    """What a merge search explores: the `recipe` (its file, or its YAML text) whose per-model parameter (or
    method-wide numbers, or HMA block α) CMA-ES tunes within `bounds` for `budget` evaluations, toward
    `objective`, on the pool's probe split."""

    recipe: Optional[str] = setting(None, help="a merge recipe (forgetlab or mergekit YAML); its weights are the "
                                               "start", positional=True)
    budget: int = count_field(30, "candidate evaluations, the start included")
    objective: str = setting("constrained", choices=OBJECTIVES,
                             help="constrained: best speciality with forgetting ≤ --max-forgetting; weighted: "
                                  "speciality − W·forgetting")
    max_forgetting: float = setting(0.05, help="bound on forgetting = general loss − the base's, in nats",
                                    label="forgetting bound (nats of held-out loss)")
    forgetting_weight: float = setting(1.0, help="W of the weighted objective")
    measure: str = setting("exact_match", help="speciality measure: exact_match (higher is better), answer_loss "
                                               "(lower is better), or an lm-eval metric TASK/METRIC (e.g. "
                                               "zoo_math/acc), run on every candidate")
    lm_eval_include: Optional[str] = setting(None, help="folder of local lm-eval task YAMLs (default: the pool's "
                                                        "probes.benchmarks.include)", metavar="DIR")
    limit: Optional[int] = count_field(None, "at most this many examples per lm-eval task")
    task: Optional[str] = setting(None, help="task of the speciality (default: the mean over the pool's tasks)")
    param: Optional[str] = setting(None, help="per-model parameter to search (default: the method's first, e.g. "
                                              "weights, or lam for pcb)")
    bounds: tuple[float, ...] = setting((0.0, 2.0), help="LOW,HIGH of the per-model values")
    hma_blocks: int = setting(0, range=(0, None), help="also search one α ∈ [0, 1] per block of layers scaling the "
                                                       "merged task vector (HMA)")
    sigma0: float = setting(0.3, help="CMA-ES initial step size")
    popsize: Optional[int] = setting(None, range=(2, None), help="CMA-ES population (at least 2; default: cma's "
                                                                 "4 + 3 ln n)")
    seed: int = setting(0, range=(0, SEED_MAX), help="CMA-ES seed (a whole number from 0 to 2**32 − 2)")
    max_general: Optional[int] = count_field(None, "at most this many general-text blocks")
    max_task: Optional[int] = count_field(None, "at most this many probe pairs per task")
    batch_size: int = count_field(16, "evaluation batch size")
    device: Optional[str] = device_field(default_cuda=True)
    dtype: Optional[str] = dtype_field("each worker's working copy (the merges are computed in float32 per tensor)")
    scalars: Optional[tuple[str, ...]] = setting(None, cli=False, help="method-wide numbers searched too "
                                                                       "(default: the method's choice, e.g. lines' "
                                                                       "α and β)")


def settings_benchmarks(pool, settings: SearchSettings):
    """The lm-eval tasks a benchmark `measure` runs on every candidate (`measure_benchmarks`), or None."""
    return measure_benchmarks(pool, [settings.measure], settings.lm_eval_include, settings.limit)


def _search_options(settings: SearchSettings) -> dict[str, Any]:
    values = {k: getattr(settings, k) for k in SearchSettings.__dataclass_fields__}
    for k in ("recipe", "lm_eval_include", "limit"):
        values.pop(k)
    values["bounds"] = tuple(settings.bounds)
    values["scalars"] = list(settings.scalars) if settings.scalars is not None else None
    return values


def check_settings(settings: SearchSettings, pool=None) -> None:
    """What the declarations cannot say: a recipe is given and `bounds` is LOW,HIGH; with the pool, everything
    `check_search` checks (without loading a model)."""
    if settings.recipe is None:
        raise ParameterError("A search needs a recipe: the merge whose parameters it tunes.")
    if len(settings.bounds) != 2:
        raise ParameterError(f"bounds takes LOW,HIGH (e.g. --bounds 0,2); got {list(settings.bounds)}.")
    if pool is not None:
        check_search(settings.recipe, pool, benchmarks=settings_benchmarks(pool, settings),
                     **_search_options(settings))


def compute(pool, settings: SearchSettings, progress: Progress = None, executor=None) -> SearchResult:
    """`search` with these settings on `executor`'s workers; a snapshot of the result after each point is
    published to `progress` (`forgetlab.core.progress.publish`: the app draws the points as they arrive)."""
    def on_point(point, partial) -> None:
        publish(progress, replace(partial, points=list(partial.points)))

    return search(settings.recipe, pool, benchmarks=settings_benchmarks(pool, settings), executor=executor,
                  progress=progress, on_point=on_point, **_search_options(settings))


def estimate(pool, settings: SearchSettings):
    """One worker's peak (`estimate_search`)."""
    return estimate_search(settings.recipe, pool, device=settings.device, dtype=settings.dtype,
                           batch_size=settings.batch_size, max_general=settings.max_general,
                           max_task=settings.max_task)


def recipe(result: SearchResult) -> dict:
    """What a saved search records (besides its pool): the method, the input recipe, the settings and the
    objective."""
    return {"search": result.method, "recipe": result.recipe, **result.settings, "objective": result.objective,
            "measure": result.measure, "max_forgetting": result.max_forgetting,
            "forgetting_weight": result.forgetting_weight}


def best_recipe_yaml(result: SearchResult) -> Optional[str]:
    """The best recipe as YAML (what `--save-recipe` writes), or None when no point could be evaluated."""
    return yaml.safe_dump(result.best_recipe, sort_keys=False) if result.best_point is not None else None


def searched_what(result: SearchResult) -> str:
    """What the search tuned, in words: the method-wide numbers, the per-model parameter, or block α."""
    return ", ".join(result.scalar_names) or result.param or "block α"


def cli_report(result: SearchResult) -> list:
    """The CLI's lines: what was searched and how long it took, where the points ran, every point, the best
    one and its recipe."""
    lines: list = [f"{result.method} search over {searched_what(result)} of {', '.join(result.models)}: "
                   f"{len(result.points)} points in {result.seconds:.1f} s (objective {result.objective}; base general "
                   f"loss {result.base_general_loss:.4f}, base speciality {result.base_speciality:.4f})"]
    lines += executor_lines(result.executor, result.points)
    lines.append(result.to_frame().drop(columns=["executor", "worker_host", "error"]))
    best = result.best_point
    if best is None:
        return lines + ["no point could be evaluated"]
    missed = result.objective == "constrained" and best.forgetting > result.max_forgetting
    lines.append(f"best: point {best.index} — speciality {best.speciality:.4f}, forgetting {best.forgetting:+.4f}"
                 f"{' (no point met the bound)' if missed else ''}")
    return lines + [best_recipe_yaml(result).rstrip("\n")]


ANALYSIS = ANALYSES.add("search", Analysis(
    "search", "merge search", SearchSettings, compute, SearchResult,
    help="merge search: CMA-ES over per-model weights (and HMA block α) maximising speciality while bounding "
         "forgetting",
    description="Evaluate merges of a recipe's models on the pool's probe split, searching the method's per-model "
                "weights with CMA-ES; prints every point, the Pareto front and the best recipe, and saves the run.",
    checks=check_settings, estimate_fn=estimate, figures_fn=lambda result: [search_figure(result)], recipe=recipe,
    report=cli_report, status=lambda result: 0 if result.best_point is not None else 1, takeaway_fn=takeaway,
    outputs=(Output("--save-recipe", "write the best recipe to this YAML file", text=best_recipe_yaml,
                    metavar="FILE.yaml"),),
    points=True, pool_arg="option", pool_help="pool.yaml whose probe split (tasks + general text) judges merges"))
