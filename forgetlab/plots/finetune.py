"""Figures of the Fine-tune page: trajectories of generality, speciality and distance over steps, the
training loss, and the final speciality-vs-generality scatter with the Pareto front."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.analysis.measures import higher_is_better, pareto_mask
from forgetlab.core.errors import ForgetlabError
from forgetlab.plots import MEASURE_TITLES, axis_title, color_for, series_name
from forgetlab.plots.forgetting import GENERAL_AXIS, general_label, speciality_label
from forgetlab.train.results import FinetuneComparison, FinetuneRun


def _runs(data: FinetuneComparison | FinetuneRun | Sequence[FinetuneRun]) -> list[FinetuneRun]:
    if isinstance(data, FinetuneComparison):
        return list(data.runs)
    if isinstance(data, FinetuneRun):
        return [data]
    return list(data)


def runs_of(comparisons: Sequence[FinetuneComparison], ids: Sequence[str]) -> list[FinetuneRun]:
    """The runs of several saved fine-tunes for one chart, each named so that none shares a legend entry:
    a label used in more than one of them gets the start model and task when those differ, else the id."""
    every = [(run, comp, i) for comp, i in zip(comparisons, ids) for run in comp.runs]
    counts: dict[str, int] = {}
    for run, _, _ in every:
        counts[run.label] = counts.get(run.label, 0) + 1
    origins = {(c.start, c.task) for c in comparisons}
    out = []
    for run, comp, i in every:
        if counts[run.label] > 1:
            where = f"{comp.start}→{comp.task}" if len(origins) == len(comparisons) else str(i)
            run = replace(run, config=replace(run.config, label=f"{run.label} · {where}"))
        out.append(run)
    return out



def _final(run: FinetuneRun, measure: str, card=None) -> float:
    """The run's final speciality (or that of `card`, e.g. its start) in `measure`: exact match or answer loss
    on its task, or an lm-eval TASK/METRIC; NaN when it was not measured."""
    card = card if card is not None else run.final
    if card is None or ("/" not in measure and run.task not in card.tasks):
        return float("nan")
    try:
        return run.value(measure, card)
    except ForgetlabError:          # a benchmark the run did not evaluate
        return float("nan")


def _general(run: FinetuneRun, measure: str, card=None) -> float:
    """The run's final generality (or that of `card`) in `measure`: general loss or an lm-eval TASK/METRIC;
    NaN when it was not measured."""
    try:
        return run.generality(measure, card)
    except ForgetlabError:          # a benchmark the run did not evaluate
        return float("nan")


def _general_title(measure: str) -> str:
    """The generality's axis text: the held-out general loss in nats, or an lm-eval metric with its direction."""
    return GENERAL_AXIS if measure == "general_loss" else general_label(measure)


def _title(task: str, measure: str) -> str:
    """The speciality's axis text: "math exact match ↑", "math answer loss (nats) ↓", or an lm-eval metric with
    its direction (`plots.forgetting.speciality_label`)."""
    return speciality_label(task, measure)


def _legend_below(fig: go.Figure, y: float = -0.2) -> None:
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=y, xanchor="left", x=0), legend_title_text=None)


def trajectories_figure(data: FinetuneComparison | FinetuneRun | Sequence[FinetuneRun],
                        measure: str = "exact_match", general_measure: str = "general_loss", *,
                        title: str = "") -> go.Figure:
    """Three panels over training steps, one line per run (named as a person would: "MoFO 0.2"): generality
    in `general_measure` (held-out general loss ↓ or an lm-eval TASK/METRIC), speciality on the task in
    `measure` (exact match ↑, answer loss ↓ or an lm-eval TASK/METRIC) and D(θ, θ0) from the starting weights.
    One x-axis title, under the middle panel; the legend below; `title` above (none by default)."""
    runs = _runs(data)
    task = runs[0].task if runs else ""
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09, subplot_titles=(
        general_label(general_measure),
        _title(task, measure), "D(θ, θ0)"))
    for run in runs:
        df = run.trajectory()
        if df.empty:
            continue
        color, name = color_for(run.label), series_name(run.label)
        for col, key in enumerate((general_measure, measure, "distance"), start=1):
            if key not in df.columns:
                continue
            fig.add_trace(go.Scatter(x=df["step"], y=df[key], mode="lines+markers", name=name,
                                     legendgroup=run.label, showlegend=col == 1, line=dict(color=color)),
                          row=1, col=col)
    fig.update_xaxes(title_text="training step", row=1, col=2)
    fig.update_annotations(font_size=13)
    fig.update_layout(margin=dict(t=80 if title else 40, b=10, l=50, r=10), height=440 if title else 400,
                      title=title or None)
    _legend_below(fig, -0.22)
    return fig


def loss_figure(data: FinetuneComparison | FinetuneRun | Sequence[FinetuneRun], *, title: str = "") -> go.Figure:
    """The training loss (answer tokens, nats) per step, one line per run; `title` above (none by default)."""
    fig = go.Figure()
    for run in _runs(data):
        df = run.train.loss_frame()
        fig.add_trace(go.Scatter(x=df["step"], y=df["loss"], mode="lines", name=series_name(run.label),
                                 line=dict(color=color_for(run.label))))
    fig.update_layout(xaxis_title="training step", yaxis_title=axis_title("train_loss"), title=title or None,
                      margin=dict(t=50 if title else 20, b=10, l=60, r=10), height=420)
    _legend_below(fig, -0.2)
    return fig


def final_scatter(data: FinetuneComparison | FinetuneRun | Sequence[FinetuneRun],
                  measure: str = "exact_match", general_measure: str = "general_loss", *,
                  title: str = "") -> go.Figure:
    """Final speciality (y, `measure`: exact match ↑, answer loss ↓ or an lm-eval TASK/METRIC) against final
    generality (x, `general_measure`: held-out general loss ↓ or an lm-eval TASK/METRIC) per run, the starting
    model as a grey diamond, and the Pareto front of the runs as a dashed step line. Runs are told apart by
    colour and the legend (labels on the points collided when runs end close together); `title` above (none
    by default)."""
    runs = _runs(data)
    higher = higher_is_better(measure)
    label = MEASURE_TITLES.get(measure, measure)
    glabel = "general loss" if general_measure == "general_loss" else general_measure
    fig = go.Figure()
    if runs and runs[0].start_card is not None and runs[0].task in runs[0].start_card.tasks:
        start = runs[0].start_card
        fig.add_trace(go.Scatter(x=[_general(runs[0], general_measure, start)], y=[_final(runs[0], measure, start)],
                                 mode="markers", name=f"start ({runs[0].start})",
                                 marker=dict(symbol="diamond", size=13, color=color_for("base")),
                                 hovertemplate=f"start ({runs[0].start})<br>{glabel} %{{x:.4f}}<br>"
                                               f"{label} %{{y:.4f}}<extra></extra>"))
    for run in runs:
        name = series_name(run.label)
        fig.add_trace(go.Scatter(x=[_general(run, general_measure)], y=[_final(run, measure)], mode="markers",
                                 name=name,
                                 marker=dict(size=13, color=color_for(run.label), line=dict(width=1, color="white")),
                                 hovertemplate=f"{name}<br>{glabel} %{{x:.4f}}<br>{label} %{{y:.4f}}"
                                               "<extra></extra>"))
    if runs:
        sign = 1.0 if higher else -1.0
        gsign = -1.0 if higher_is_better(general_measure) else 1.0     # the mask wants a loss
        flags = pareto_mask([sign * _final(r, measure) for r in runs],
                            [gsign * _general(r, general_measure) for r in runs])
        front = sorted((r for r, f in zip(runs, flags) if f), key=lambda r: gsign * _general(r, general_measure))
        fig.add_trace(go.Scatter(x=[_general(r, general_measure) for r in front],
                                 y=[_final(r, measure) for r in front], mode="lines", name="Pareto front",
                                 line=dict(color="black", dash="dash", shape="hv"), hoverinfo="skip"))
    task = runs[0].task if runs else ""
    fig.update_layout(xaxis_title=_general_title(general_measure), yaxis_title=_title(task, measure),
                      title=title or None, margin=dict(t=50 if title else 20, b=10, l=60, r=10), height=420)
    _legend_below(fig, -0.2)
    return fig
