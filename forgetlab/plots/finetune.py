"""Figures of the Fine-tune page: trajectories of generality, speciality and distance over steps, the
training loss, and the final speciality-vs-generality scatter with the Pareto front."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.plots import color_for
from forgetlab.sweeps import pareto_mask
from forgetlab.train.runs import FinetuneComparison, FinetuneRun


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


def trajectories_figure(data: FinetuneComparison | FinetuneRun | Sequence[FinetuneRun]) -> go.Figure:
    """Three panels over training steps, one line per run: held-out general loss (↓), exact match on the
    task (↑) and D(θ, θ0) from the starting weights."""
    runs = _runs(data)
    task = runs[0].task if runs else ""
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08, subplot_titles=(
        "general loss (held-out) ↓", f"speciality: {task} exact match ↑", "D(θ, θ0)"))
    for run in runs:
        df = run.trajectory()
        if df.empty:
            continue
        color = color_for(run.label)
        for col, key in enumerate(("general_loss", "exact_match", "distance"), start=1):
            if key not in df.columns:
                continue
            fig.add_trace(go.Scatter(x=df["step"], y=df[key], mode="lines+markers", name=run.label,
                                     legendgroup=run.label, showlegend=col == 1, line=dict(color=color)),
                          row=1, col=col)
    for col in (1, 2, 3):
        fig.update_xaxes(title_text="step", row=1, col=col)
    fig.update_layout(margin=dict(t=40, b=10), legend_title="run", height=380)
    return fig


def loss_figure(data: FinetuneComparison | FinetuneRun | Sequence[FinetuneRun]) -> go.Figure:
    """The training loss (answer tokens) per step, one line per run."""
    fig = go.Figure()
    for run in _runs(data):
        df = run.train.loss_frame()
        fig.add_trace(go.Scatter(x=df["step"], y=df["loss"], mode="lines", name=run.label,
                                 line=dict(color=color_for(run.label))))
    fig.update_layout(xaxis_title="step", yaxis_title="training loss", margin=dict(t=20, b=10), height=300)
    return fig


def final_scatter(data: FinetuneComparison | FinetuneRun | Sequence[FinetuneRun]) -> go.Figure:
    """Final speciality (↑, y) against final general loss (↓, x) per run, the starting model as a grey
    diamond, and the Pareto front of the runs as a dashed step line."""
    runs = _runs(data)
    fig = go.Figure()
    if runs and runs[0].start_card is not None:
        start = runs[0].start_card
        fig.add_trace(go.Scatter(x=[start.general_loss], y=[start.tasks[runs[0].task].exact_match],
                                 mode="markers+text", name=f"start ({runs[0].start})", text=[runs[0].start],
                                 textposition="top center", marker=dict(symbol="diamond", size=12,
                                                                        color=color_for("base"))))
    for run in runs:
        fig.add_trace(go.Scatter(x=[run.general_loss], y=[run.speciality], mode="markers+text", name=run.label,
                                 text=[run.label], textposition="top center",
                                 marker=dict(size=12, color=color_for(run.label))))
    if runs:
        flags = pareto_mask([r.speciality for r in runs], [r.general_loss for r in runs])
        front = sorted((r for r, f in zip(runs, flags) if f), key=lambda r: r.general_loss)
        fig.add_trace(go.Scatter(x=[r.general_loss for r in front], y=[r.speciality for r in front],
                                 mode="lines", name="Pareto front",
                                 line=dict(color="black", dash="dash", shape="hv"), hoverinfo="skip"))
    task = runs[0].task if runs else ""
    fig.update_layout(xaxis_title="general loss on held-out text (↓ better)",
                      yaxis_title=f"{task} exact match (↑ better)", margin=dict(t=20, b=10), height=400)
    return fig
