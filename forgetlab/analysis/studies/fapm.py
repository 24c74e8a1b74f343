"""FAPM's relative axes (`fapm-relative`): the pruning-ratio sweep of FAPM (`forgetlab sweep pruning`, one per
fine-tune, its points reused as they are) reported as the paper reports it — per ratio, the share of the fine-tuning
gain kept and the share of the forgetting recovered (docs/methods.md#relative-shares), averaged over the pool's
fine-tunes and, for the forgetting, over its general measures: the held-out general loss and each general lm-eval
benchmark the pool configures (`probes.benchmarks.general`, the first metric each reports).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import pandas as pd
import plotly.graph_objects as go

from forgetlab.analysis.measures import lm_eval_include_field, limit_field, measure_benchmarks
from forgetlab.analysis.retention import relative_frame
from forgetlab.analysis.study import StudyInfo, Verdict, study_analysis
from forgetlab.analysis.sweep_memory import estimate_sweep
from forgetlab.analysis.sweeps import PRUNING_SCORES, PruningSettings, check_grid, default_task, pruning_curve
from forgetlab.core.benchmarks import BenchmarkSpec, checked_manager, reported_metrics
from forgetlab.core.errors import ParameterError
from forgetlab.core.memory import job_dtype
from forgetlab.core.progress import report, scaled
from forgetlab.core.settings import count_field, device_field, dtype_field, setting
from forgetlab.plots.relative import relative_figure

PAPER_RATIO = 0.9
"""FAPM's default pruning ratio, the paper's operating point (docs/methods.md#fapm)."""
KEPT_CLAIM, RECOVERED_CLAIM = 0.97, 0.5
"""What the claim asks at the operating point: ≥ 97 % of the task gain kept (the paper: "99 % accuracy on downstream
tasks") and at least half of the forgetting recovered (the paper: forgetting alleviated "to a mere 1 %")."""

INFO = StudyInfo(name="fapm-relative", paper="FAPM", artifact="relative results (Tables 1–4 of the rebuttal)",
                 page="forgetting", title="gain kept and forgetting recovered (%) against FAPM's pruning ratio",
                 claim=f"at its default ratio {PAPER_RATIO:g}, FAPM keeps ~99 % of the fine-tuning gain while "
                       "alleviating forgetting \"to a mere 1 %\" (Llama3-8B, Qwen2-7B): here, ≥ "
                       f"{100 * KEPT_CLAIM:.0f} % of the gain kept and ≥ {100 * RECOVERED_CLAIM:.0f} % of the "
                       "forgetting recovered.")


@dataclass
class FapmRelativeSettings:
    """The fine-tunes, the ratio grid and series, the measures and the evaluation budget of the study."""

    models: Optional[tuple[str, ...]] = setting(None, help="the fine-tunes to prune (default: every full fine-tune "
                                                           "of the pool)", label="fine-tuned models")
    ratios: tuple[float, ...] = setting((0.0, 0.5, 0.8, 0.9, 0.95, 1.0), help="pruning ratios (zeroed share); 0 "
                                        "(the fine-tune) and 1 (the base) are the references and must be in",
                                        range=(0.0, 1.0), label="pruning ratios")
    scores: tuple[str, ...] = setting(("fapm",), help="series: fapm magnitude relative (the paper's ablations)",
                                      choices=PRUNING_SCORES, cli_choices=False)
    measure: str = setting("exact_match", help="speciality on each model's own task: exact_match or answer_loss",
                           choices=("exact_match", "answer_loss"))
    general_measures: Optional[tuple[str, ...]] = setting(
        None, help="generality measures averaged (general_loss, lm-eval TASK/METRIC; default: general_loss and the "
                   "first metric of each general benchmark of the pool)", metavar="M[,M…]")
    operating_ratio: float = setting(PAPER_RATIO, help="the ratio the claim is judged at (the paper's default)",
                                     range=(0.0, 1.0))
    lm_eval_include: Optional[str] = lm_eval_include_field()
    limit: Optional[int] = limit_field()
    max_general: Optional[int] = count_field(None, "at most this many general-text blocks")
    max_task: Optional[int] = count_field(None, "at most this many eval pairs per task")
    batch_size: int = count_field(16, "evaluation batch size")
    device: Optional[str] = device_field(default_cuda=True)
    dtype: Optional[str] = dtype_field("the working copy (θ0 + mask ⊙ τ is computed in float32)")


def models_of(pool, settings: FapmRelativeSettings) -> dict[str, Optional[str]]:
    """Model → its own task (from its name, `default_task`): the given models, else every full fine-tune."""
    names = list(settings.models) if settings.models else [m for m, e in pool.entries.items() if not e.adapter]
    if not names:
        raise ParameterError(f"The pool {pool.name} has no full fine-tune to prune; pass --models or add one.")
    pool.check_models(names)
    return {m: default_task(pool, m) for m in names}


def general_benchmarks(pool, settings: FapmRelativeSettings) -> tuple[list[str], Optional[BenchmarkSpec]]:
    """The general measures averaged and the lm-eval benchmarks they need: the given ones, else general_loss and,
    per general benchmark of the pool, the first metric lm-eval reports for it (a group, whose metrics only a run
    reveals, is left out)."""
    if settings.general_measures:
        measures = list(settings.general_measures)
        return measures, measure_benchmarks(pool, measures, settings.lm_eval_include, settings.limit)
    spec = pool.probes.benchmarks if pool.probes is not None else None
    if spec is None or not spec.general:
        return ["general_loss"], None
    spec = BenchmarkSpec(general=list(spec.general), include=settings.lm_eval_include or spec.include,
                         limit=settings.limit if settings.limit is not None else spec.limit)
    manager = checked_manager(spec)
    measures = ["general_loss"]
    for task in spec.general:
        metrics = reported_metrics(task, manager, spec.include)
        if metrics:
            measures.append(f"{task}/{metrics[0]}")
    return measures, BenchmarkSpec(general=[m.partition("/")[0] for m in measures[1:]], include=spec.include,
                                   limit=spec.limit)


def check(settings: FapmRelativeSettings, pool=None) -> None:
    """The grid holds 0 and 1 (the references), the scores are known; with the pool, the models are."""
    grid = check_grid("ratio", settings.ratios)
    if 0.0 not in grid or 1.0 not in grid:
        raise ParameterError(f"--ratios must hold 0 (the fine-tune) and 1 (the base), the references of the shares; "
                             f"got {grid}.")
    bad = [s for s in settings.scores if s not in PRUNING_SCORES] or ([] if settings.scores else ["none"])
    if bad:
        raise ParameterError(f"--scores takes {', '.join(PRUNING_SCORES)}; got {', '.join(bad)}.")
    if pool is not None:
        models_of(pool, settings)


def sweep_settings(pool, settings: FapmRelativeSettings, model: str, task: Optional[str],
                   general_measure: str = "general_loss") -> PruningSettings:
    """The `forgetlab sweep pruning` run of one model that the study reuses (its own task evaluated only)."""
    return PruningSettings(model=model, task=task, tasks=(task,) if task else None, ratios=tuple(settings.ratios),
                           scores=tuple(settings.scores), measure=settings.measure, general_measure=general_measure,
                           lm_eval_include=settings.lm_eval_include, limit=settings.limit,
                           max_general=settings.max_general, max_task=settings.max_task,
                           batch_size=settings.batch_size, device=settings.device, dtype=settings.dtype)


def compute(pool, settings: FapmRelativeSettings, progress=None, executor=None) -> pd.DataFrame:
    """One pruning sweep per fine-tune, each on the relative axes (`relative_frame`), then per (series, ratio) the
    mean over the models of gain kept and forgetting recovered (%), each model's gain kept and each general
    measure's recovered share (mean over the models) beside them."""
    check(settings, pool)
    own = models_of(pool, settings)
    measures, benchmarks = general_benchmarks(pool, settings)
    device = settings.device
    dtype = job_dtype(settings.dtype, device)
    frames = []
    for i, (model, task) in enumerate(own.items()):
        part = scaled(progress, i / len(own), (i + 1) / len(own))
        result = pruning_curve(pool, model, ratios=settings.ratios, scores=settings.scores, task=task,
                               tasks=[task] if task else None, device=device, batch_size=settings.batch_size,
                               max_general=settings.max_general, max_task=settings.max_task, progress=part,
                               benchmarks=benchmarks, executor=executor, dtype=dtype)
        result.measure = settings.measure
        frames.append(relative_frame(result, settings.measure, measures).assign(model=model))
    report(progress, 1.0, f"{len(own)} pruning sweeps on relative axes")
    return relative_table(pd.concat(frames, ignore_index=True), settings.operating_ratio)


def _mean(values) -> float:
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(finite) / len(finite) if finite else float("nan")


def relative_table(frames: pd.DataFrame, operating_ratio: float = PAPER_RATIO) -> pd.DataFrame:
    """`relative_frame` rows of several models (column `model`) → the study's table: one row per (series, ratio)
    with `gain_kept_pct` and `forgetting_recovered_pct` (the means over the models where defined, in %),
    `operating` (the claim's ratio), then `gain_kept:<model>` and `recovered:<measure>` (%)."""
    models = list(dict.fromkeys(frames["model"]))
    recovered = [c for c in frames.columns if c.startswith("recovered:")]
    rows = []
    for (series, x), part in frames.groupby(["series", "x"], sort=False):
        row = {"series": series, "ratio": float(x), "operating": bool(math.isclose(x, operating_ratio)),
               "gain_kept_pct": 100 * _mean(part["gain_kept"]),
               "forgetting_recovered_pct": 100 * _mean(part["forgetting_recovered"]), "models": len(part)}
        for m in models:
            row[f"gain_kept:{m}"] = 100 * _mean(part.loc[part["model"] == m, "gain_kept"])
        for c in recovered:
            row[c] = 100 * _mean(part[c])
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["series", "ratio"], kind="stable").reset_index(drop=True)


def figure(table: pd.DataFrame) -> go.Figure:
    """Gain kept and forgetting recovered (%) against the pruning ratio, per series, the operating point marked."""
    frame = table.assign(gain_kept=table["gain_kept_pct"] / 100,
                         forgetting_recovered=table["forgetting_recovered_pct"] / 100)
    marked = table.loc[table["operating"].astype(bool), "ratio"]
    return relative_figure(frame, x="ratio", mark=float(marked.iloc[0]) if len(marked) else None,
                           title="FAPM: gain kept and forgetting recovered<br><sub>mean over the fine-tunes</sub>")


def verdict(table: pd.DataFrame, settings=None) -> Verdict:
    """At the operating ratio of the fapm series: gain kept ≥ KEPT_CLAIM and forgetting recovered ≥
    RECOVERED_CLAIM."""
    at = table[(table["series"] == "fapm") & table["operating"].astype(bool)]
    if at.empty:
        return Verdict("the fapm series has no point at the operating ratio.", None)
    row = at.iloc[0]
    kept, rec = row["gain_kept_pct"], row["forgetting_recovered_pct"]
    measured = (f"FAPM at ratio {row['ratio']:g}: keeps {kept:.1f} % of the gain and recovers {rec:.1f} % of the "
                f"forgetting (mean over {int(row['models'])} fine-tune(s)).")
    if not (math.isfinite(kept) and math.isfinite(rec)):
        return Verdict(measured, None, "a share is undefined: the fine-tunes gained or forgot nothing")
    misses = []
    if kept < 100 * KEPT_CLAIM:
        misses.append(f"it keeps {kept:.1f} % < {100 * KEPT_CLAIM:.0f} % of the gain")
    if rec < 100 * RECOVERED_CLAIM:
        misses.append(f"it recovers {rec:.1f} % < {100 * RECOVERED_CLAIM:.0f} % of the forgetting")
    return Verdict(measured, not misses, "; ".join(misses))


def estimate(pool, settings: FapmRelativeSettings):
    """The peak of one pruning sweep (the sweeps run one after another)."""
    model = next(iter(models_of(pool, settings)))
    return estimate_sweep(pool, model, kind="pruning", device=settings.device,
                          dtype=job_dtype(settings.dtype, settings.device), batch_size=settings.batch_size,
                          max_general=settings.max_general, max_task=settings.max_task)


def singles(pool, settings: FapmRelativeSettings) -> list[tuple[str, object]]:
    """The `forgetlab sweep pruning` runs the study is made of: one per model and general benchmark measure (the
    general loss is measured by every run)."""
    measures, _ = general_benchmarks(pool, settings)
    extra = [m for m in measures if m != "general_loss"] or ["general_loss"]
    return [("sweep-pruning", sweep_settings(pool, settings, model, task, extra[0]))
            for model, task in models_of(pool, settings).items()]


STUDY = study_analysis(INFO, FapmRelativeSettings, compute, figure, verdict, checks=check, points=True,
                       estimate=estimate, singles=singles)
