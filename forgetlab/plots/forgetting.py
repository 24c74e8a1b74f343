"""Figures of the Forgetting page: speciality/generality/distance against the swept setting, and the
speciality-vs-generality trade-off of every series with its Pareto front (results in, go.Figure out)."""
from __future__ import annotations

import json
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.plots import color_for
from forgetlab.sweeps import SweepPoint, SweepResult, pareto_mask

AXIS_LABELS = {"alpha": "α (0 = base, 1 = fine-tuned)", "ratio": "pruning ratio (share of τ zeroed)",
               "density": "density (share of τ kept)", "mean_alpha": "mean block α"}


def _hover(p: SweepPoint, task) -> str:
    return (f"{p.series}<br>{json.dumps(p.settings)}<br>speciality {p.speciality(task):.3f}"
            f"<br>general loss {p.general_loss:.4f}<br>D(θ, θ0) {p.distance:.4f}")


def curves_figure(result: SweepResult) -> go.Figure:
    """Three panels against the swept setting, one line per series: speciality (exact match on the sweep's
    task, ↑), held-out general loss (↓) and D(θ, θ0)."""
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.1, subplot_titles=(
        f"{result.task or 'mean'} exact match ↑", "general loss ↓", "D(θ, θ0)"))
    for series in result.series:
        pts = sorted((p for p in result.points if p.series == series), key=lambda p: p.x)
        xs = [p.x for p in pts]
        color = color_for(series)
        hover = [_hover(p, result.task) for p in pts]
        for col, ys in enumerate(([p.speciality(result.task) for p in pts], [p.general_loss for p in pts],
                                  [p.distance for p in pts]), start=1):
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=series, legendgroup=series,
                                     showlegend=col == 1, line=dict(color=color), hovertext=hover,
                                     hoverinfo="text"), row=1, col=col)
    label = AXIS_LABELS.get(result.x_name, result.x_name)
    for col in (1, 2, 3):
        fig.update_xaxes(title_text=label, row=1, col=col)
    fig.update_layout(margin=dict(t=40, b=10), legend_title="series", height=380)
    return fig


def tradeoff_figure(results: SweepResult | Sequence[SweepResult], *, task: str | None = None,
                    show_front: bool = True) -> go.Figure:
    """Speciality (↑, y) against held-out general loss (↓, x) for every point of every series of the given
    sweeps; the Pareto front over all of them is drawn as a dashed step line and its points ringed."""
    results = [results] if isinstance(results, SweepResult) else list(results)
    task = task if task is not None else (results[0].task if results else None)
    fig = go.Figure()
    everything: list[tuple[str, SweepPoint]] = []
    for res in results:
        prefix = f"{res.kind}:" if len(results) > 1 else ""
        for series in res.series:
            pts = sorted((p for p in res.points if p.series == series), key=lambda p: p.x)
            name = f"{prefix}{series}"
            everything.extend((name, p) for p in pts)
            fig.add_trace(go.Scatter(
                x=[p.general_loss for p in pts], y=[p.speciality(task) for p in pts], mode="lines+markers",
                name=name, line=dict(color=color_for(series), width=1), marker=dict(size=8),
                text=[f"{res.x_name}={p.x:g}" for p in pts], hovertext=[_hover(p, task) for p in pts],
                hoverinfo="text"))
    if show_front and everything:
        flags = pareto_mask([p.speciality(task) for _, p in everything], [p.general_loss for _, p in everything])
        front = sorted((p for (_, p), f in zip(everything, flags) if f), key=lambda p: p.general_loss)
        if front:
            fig.add_trace(go.Scatter(
                x=[p.general_loss for p in front], y=[p.speciality(task) for p in front], mode="lines+markers",
                name="Pareto front", line=dict(color="black", dash="dash", shape="hv"),
                marker=dict(size=14, symbol="circle-open", color="black"), hoverinfo="skip"))
    fig.update_layout(xaxis_title="general loss on held-out text (↓ better)",
                      yaxis_title=f"speciality: {task or 'mean'} exact match (↑ better)",
                      margin=dict(t=20, b=10), legend_title="series", height=420)
    return fig
