"""What every forgetting sweep shares as an analysis (forgetlab.analysis.base.Analysis): the evaluation settings
(`SweepSettings`, which each kind's settings extend with its own grid), the checks, the memory estimate, the CLI's
report and exit status, the recipe a saved run records and the Runs page's figures — and `sweep_analysis`, which
makes the Analysis of one kind ("sweep-alpha", …: the kinds its saved runs have always carried) from its settings
and its curve.

The kinds are declared beside their curves: alpha, pruning, density and hma in forgetlab.analysis.sweeps, the
closed-form lines, rank and iso in forgetlab.analysis.closed_form_sweeps. `forgetlab sweep KIND`, the Forgetting
page, Ray (`points`: the points of a sweep run on the executor) and the Runs page all draw from them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Any, Callable, Mapping, Optional, Sequence

from forgetlab.analysis.base import ANALYSES, Analysis
from forgetlab.analysis.measures import (MEASURES, best_tradeoff, check_general_measure, check_measure,
                                         general_measure_field, higher_is_better, is_benchmark, limit_field,
                                         lm_eval_include_field, measure_benchmarks, measure_field, measure_label,
                                         value_text)
from forgetlab.analysis.sweep_memory import estimate_sweep
from forgetlab.analysis.sweep_results import SweepPoint, SweepResult
from forgetlab.core.evaluate import forgetting_text
from forgetlab.core.devicemap import DEVICE_MAP_HELP, MAX_MEMORY_HELP, PLACEMENTS, placement_for
from forgetlab.core.memory import MemoryEstimate, job_dtype
from forgetlab.core.progress import Progress, publish
from forgetlab.core.settings import count_field, device_field, dtype_field, setting
from forgetlab.executors import executor_lines
from forgetlab.plots.forgetting import CURVES, TRADEOFF, curves_figure, sweep_title, tradeoff_figure

SHOWN = ["series", "x", "speciality", "answer_loss", "general_loss", "distance", "pareto"]
"""The columns the CLI prints (every column goes to --out and the saved run)."""
GROUP_HELP = "forgetting curves: WiSE-FT α (and SLERP t), FAPM pruning, DARE/TIES/DELLA/SCE density, HMA grid"
ABOUT = ("Evaluate generality and speciality along a post-hoc fix's setting, with D(θ, θ0) and the Pareto front. One "
         "working copy of the model is rewritten in place per point.")

Curve = Callable[..., SweepResult]


@dataclass
class SweepSettings:
    """What every sweep kind evaluates: the fine-tuned `model` (its task vector is swept), the speciality `task`
    (None: the task named in the model's name, else the mean over tasks), the `tasks` evaluated, the evaluation
    budget, the measures (a benchmark measure `TASK/METRIC` runs those lm-eval tasks at every point), and where
    and in what precision the working copy runs. Each kind's settings add its grid."""

    model: Optional[str] = setting(None, help="the fine-tuned model of the pool to sweep", required=True,
                                   label="fine-tuned model")
    task: Optional[str] = setting(None, help="task whose exact match is the speciality (default: the task named in "
                                             "the model's name, else the mean over tasks)", label="speciality task")
    tasks: Optional[tuple[str, ...]] = setting(None, help="tasks to evaluate (default: all)", may_be_empty=True)
    max_general: Optional[int] = count_field(None, "at most this many general-text blocks")
    max_task: Optional[int] = count_field(None, "at most this many eval pairs per task")
    measure: str = measure_field("at every point")
    general_measure: str = general_measure_field("at every point")
    lm_eval_include: Optional[str] = lm_eval_include_field()
    limit: Optional[int] = limit_field()
    batch_size: int = count_field(16, "evaluation batch size")
    device: Optional[str] = device_field(default_cuda=True)
    device_map: Optional[str] = setting(None, help=DEVICE_MAP_HELP, choices=PLACEMENTS)
    max_memory: Optional[str] = setting(None, help=MAX_MEMORY_HELP, metavar="DEV=SIZE,…")
    dtype: Optional[str] = dtype_field("the working copy (θ0 + f(τ) is computed in float32)")


EVALUATION = tuple(f.name for f in fields(SweepSettings))
"""The settings every kind shares (the others are a kind's grid)."""


def grid_of(settings: SweepSettings) -> dict[str, Any]:
    """A kind's own settings (its grid) as the keyword arguments of its curve."""
    return {f.name: getattr(settings, f.name) for f in fields(settings) if f.name not in EVALUATION}


def placement_of(settings: SweepSettings) -> tuple[Any, Any]:
    """Where the working copy goes and in what dtype: the device, or a `Placement` when a device map is named,
    and the torch dtype (`job_dtype`: None is bfloat16 on cuda, float32 elsewhere)."""
    device = placement_for(settings.device, settings.device_map, settings.max_memory)
    return device, job_dtype(settings.dtype, device if isinstance(device, str) else None)


def curve_options(settings: SweepSettings, **more: Any) -> dict[str, Any]:
    """The keyword arguments of a kind's curve for these settings (its grid and the evaluation settings), plus
    `more` (progress, executor, on_point, benchmarks)."""
    device, dtype = placement_of(settings)
    return {**grid_of(settings), "task": settings.task,
            "tasks": list(settings.tasks) if settings.tasks is not None else None,
            "max_general": settings.max_general, "max_task": settings.max_task, "batch_size": settings.batch_size,
            "device": device, "dtype": dtype, **more}


class _Checked(Exception):
    """Raised by `checked_before_work`'s progress callback at the curve's first report."""


def checked_before_work(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Run `fn(*args, progress=…, **kwargs)` only up to its first progress report and stop there.

    Every curve checks its model, grid, task and probe data before its first report (the loading of the working
    copy): so the check raises the same ForgetlabError the run would, and loads no model."""
    def stop(fraction: float, message: str) -> None:
        raise _Checked

    try:
        fn(*args, progress=stop, **kwargs)
    except _Checked:
        return


def check_sweep(curves: Mapping[str, Curve], kind: str, settings: SweepSettings, pool=None) -> None:
    """What the declarations cannot say: the measures and the placement; with the pool, whatever the kind's curve
    refuses before its first point (model, grid, task, probe data), without loading a model. A benchmark
    measure's lm-eval task and metric are checked when the sweep starts (`measure_benchmarks`)."""
    check_measure(settings.measure)
    check_general_measure(settings.general_measure)
    placement_of(settings)
    if pool is not None:
        checked_before_work(curves[kind], pool, settings.model, **curve_options(settings))


def _snapshots(progress: Progress):
    """`on_point` for a watched job (the app's, whose progress can `publish`): a snapshot of the sweep after each
    point, drawn while it runs; None for a plain callback."""
    if not callable(getattr(progress, "publish", None)):
        return None
    return lambda point, so_far: publish(progress, replace(so_far, points=list(so_far.points)))


def run_sweep(curves: Mapping[str, Curve], kind: str, pool, settings: SweepSettings, progress: Progress = None,
              executor=None) -> SweepResult:
    """The sweep these settings describe: the kind's curve (looked up in `curves` when it runs), with the lm-eval
    benchmarks its measures need at every point; the result carries the measures, its Pareto front judged in
    them."""
    benchmarks = measure_benchmarks(pool, [settings.measure, settings.general_measure], settings.lm_eval_include,
                                    settings.limit)
    result = curves[kind](pool, settings.model, **curve_options(settings, progress=progress, executor=executor,
                                                                  on_point=_snapshots(progress),
                                                                  benchmarks=benchmarks))
    result.measure, result.general_measure = settings.measure, settings.general_measure
    result.mark_pareto()
    return result


def estimate(kind: str, pool, settings: SweepSettings) -> MemoryEstimate:
    """The sweep's peak (`estimate_sweep`); with a device map it is shown, never enforced."""
    device, dtype = placement_of(settings)
    return estimate_sweep(pool, settings.model, kind=kind, device=device, dtype=dtype,
                          batch_size=settings.batch_size, max_general=settings.max_general,
                          max_task=settings.max_task)


def recipe(result: SweepResult) -> dict:
    """What a saved sweep records: the recipe the sweep made (kind, pool, model, grid, evaluation), with its model
    and task."""
    out = dict(result.recipe)
    out.setdefault("model", result.model)
    out.setdefault("task", result.task)
    return out


def report(result: SweepResult) -> list:
    """The CLI's lines: what was swept and measured, where the points ran, the points that failed, the table."""
    measure, general = result.measure, result.general_measure
    speciality = measure if is_benchmark(measure) else f"{result.task or 'mean over tasks'} {measure_label(measure)}"
    lines: list = [f"{result.kind} sweep of {result.model} (speciality: {speciality}; generality: "
                   f"{measure_label(general)}; x = {result.x_name}; {len(result.points)} points in "
                   f"{result.seconds:.1f} s)"]
    lines += executor_lines(result.executor, result.points)
    lines += [f"FAILED {f['series']} {result.x_name}={f['x']:g}: {f['error']}" for f in result.failed]
    shown = SHOWN + (["generality"] if general != "general_loss" else [])
    return lines + [result.to_frame()[shown]]


def status(result: SweepResult) -> int:
    """1 when some points failed (their workers died), else 0."""
    return 1 if result.failed else 0


X_WORDS = {"alpha": "α", "ratio": "pruning ratio", "density": "density", "mean_alpha": "mean α", "beta": "β",
           "keep": "kept share of the rank"}
"""A swept setting (`SweepResult.x_name`) as the sentences name it."""


def point_words(result: SweepResult, point: SweepPoint) -> str:
    """A point of a sweep in words: its series and setting ("wise-ft at α 0.5")."""
    return f"{point.series} at {X_WORDS.get(result.x_name, result.x_name)} {point.x:g}"


def takeaway(result: SweepResult) -> list[str]:
    """The sweep in two sentences: its best trade-off — the Pareto point that keeps most speciality for least
    forgetting (`best_tradeoff`, docs/methods.md#best-tradeoff) — with its speciality and its general loss above
    the point that forgets least (nats), then the point with the most speciality and what it costs. Where exact
    match is the same at every point (a small model that never answers exactly), in answer loss, said so."""
    measure, general, points = result.measure, result.general_measure, result.points
    head = "Best trade-off"
    if measure == "exact_match" and len({p.speciality(result.task, measure) for p in points}) == 1:
        measure, head = "answer_loss", "Best trade-off in answer loss (exact match does not move along this sweep)"
    sign = 1.0 if higher_is_better(measure) else -1.0
    gsign = -1.0 if higher_is_better(general) else 1.0
    spec = [sign * p.speciality(result.task, measure) for p in points]
    loss = [gsign * p.generality(general) for p in points]
    best = best_tradeoff(spec, loss)
    if best is None:
        return []
    ok = [i for i in range(len(points)) if spec[i] == spec[i] and loss[i] == loss[i]]
    least = min(ok, key=lambda i: (loss[i], i))
    top = max(ok, key=lambda i: (spec[i], -loss[i], -i))
    where = f"on {result.task}" if result.task else "over the tasks"

    def kept(i: int) -> str:
        return value_text(measure, points[i].speciality(result.task, measure))

    def cost(i: int) -> str:
        if general == "general_loss":
            return f"{forgetting_text(loss[i] - loss[least])} of general loss"
        return value_text(general, points[i].generality(general))

    if best == least and general == "general_loss":
        lines = [f"{head}: {point_words(result, points[best])}, the point that forgets least, scores {kept(best)} "
                 f"{where}."]
    else:
        lines = [f"{head}: {point_words(result, points[best])} scores {kept(best)} {where} for {cost(best)}"
                 + (f", counted from {point_words(result, points[least])}, the point that forgets least."
                    if general == "general_loss" else ".")]
    if top != best:
        lines.append(f"The most skilled point, {point_words(result, points[top])}, reaches {kept(top)} for "
                     f"{cost(top)}.")
    else:
        lines.append("It is also the most skilled point: no other setting of the sweep does better on the task.")
    return lines


def _in(result: SweepResult, measure: Optional[str]) -> SweepResult:
    if measure in MEASURES:
        result.measure = measure
    return result


def figures(result: SweepResult, measure: Optional[str] = None) -> list:
    """The Forgetting page's curves and trade-off of one sweep (speciality in `measure` when it is built in)."""
    result = _in(result, measure)
    return [curves_figure(result, title=sweep_title(result, CURVES)),
            tradeoff_figure(result, title=sweep_title(result, TRADEOFF))]


def compare(results: Sequence[SweepResult], ids: Sequence[str], measure: Optional[str] = None) -> list:
    """Several sweeps on one trade-off chart and one set of curves, a named series per run."""
    results = [_in(r, measure) for r in results]
    return [tradeoff_figure(results, ids=ids, title=sweep_title(results, TRADEOFF)),
            curves_figure(results, ids=ids, title=sweep_title(results, CURVES))]


def sweep_analysis(kind: str, settings: type, curves: Mapping[str, Curve], *, title: str, help: str,
                   description: str) -> Analysis:
    """Declare the Analysis of one sweep kind: name and saved kind `sweep-<kind>`, command `forgetlab sweep
    <kind>`, its settings (a `SweepSettings`), its curve `curves[kind]`, and what every sweep shares (module
    docstring)."""
    return ANALYSES.add(f"sweep-{kind}", Analysis(
        f"sweep-{kind}", title, settings, partial(run_sweep, curves, kind), SweepResult, help=help,
        description=f"{description} {ABOUT}", command=("sweep", kind), checks=partial(check_sweep, curves, kind),
        estimate_fn=partial(estimate, kind), figures_fn=figures, compare_fn=compare, recipe=recipe, report=report,
        measured=True, points=True, group_help=GROUP_HELP, status=status, takeaway_fn=takeaway))
