"""Figures of a task sequence: the score matrix R of each chain as a heatmap, each task's score over the stages
(the moment a task is forgotten), the general loss over the stages, and OP against BWT across the chains with
their Pareto front."""
from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.analysis.measures import MEASURES, higher_is_better, pareto_mask
from forgetlab.analysis.sequence_metrics import sequence_metrics
from forgetlab.plots import color_for, spaced_labels
from forgetlab.train.sequence_results import SequenceResult

STAGE_AXIS = "after training on"


def score_label(score: str) -> str:
    """The plain name of a score of R with its direction ("exact match (higher is better)")."""
    label = MEASURES.get(score, (score, True))[0]
    return f"{label} ({'higher' if higher_is_better(score) else 'lower'} is better)"


def stage_names(result: SequenceResult) -> list[str]:
    """The rows of R in words: "base", then "1 · math", "2 · code", …"""
    return ["base", *[f"{i + 1} · {t}" for i, t in enumerate(result.order)]]


def heatmaps(result: SequenceResult, score: str = "exact_match", methods: Sequence[str] | None = None) -> go.Figure:
    """R of each chain side by side: rows are the stages (the base on top), columns the tasks, each cell the
    task's score after that stage, written in the cell."""
    methods = list(methods or result.methods)
    cols = min(4, max(1, len(methods)))
    rows = math.ceil(len(methods) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=methods, horizontal_spacing=0.06,
                        vertical_spacing=min(0.3, 0.5 / rows) if rows > 1 else 0.0, shared_yaxes=True)
    values = [result.matrix(m, score) for m in methods]
    lo = min(float(v.min()) for v in values)
    hi = max(float(v.max()) for v in values)
    scale = "Viridis" if higher_is_better(score) else "Viridis_r"
    for k, (m, r) in enumerate(zip(methods, values)):
        fig.add_trace(go.Heatmap(z=r, x=list(result.order), y=stage_names(result), zmin=lo, zmax=hi,
                                 colorscale=scale, showscale=k == 0, text=[[f"{v:.2f}" for v in row] for row in r],
                                 texttemplate="%{text}", hovertemplate=f"{m}<br>%{{y}} → %{{x}}: %{{z:.3f}}"
                                                                       "<extra></extra>",
                                 colorbar=dict(title=MEASURES.get(score, (score,))[0])),
                      row=k // cols + 1, col=k % cols + 1)
    fig.update_yaxes(autorange="reversed")
    # slanted task names (level ones overlap in narrow panels), with room below them for the next row's titles
    fig.update_xaxes(tickangle=-45)
    fig.update_layout(title=f"Every task's {score_label(score)}, stage by stage",
                      height=300 * rows + 80, margin=dict(t=90))
    return fig


def task_lines(result: SequenceResult, score: str = "exact_match", methods: Sequence[str] | None = None) -> go.Figure:
    """One panel per task: its score over the stages, a line per chain; the stage that trained on the task is
    marked, so a drop after it is the moment the task is forgotten."""
    methods = list(methods or result.methods)
    fig = make_subplots(rows=1, cols=len(result.order), subplot_titles=list(result.order), shared_yaxes=True)
    names = stage_names(result)
    for j, task in enumerate(result.order):
        for m in methods:
            r = result.matrix(m, score)
            fig.add_trace(go.Scatter(x=names, y=r[:, j], mode="lines+markers", name=m, legendgroup=m,
                                     showlegend=j == 0, line=dict(color=color_for(m)),
                                     hovertemplate=f"{m}<br>{task} after %{{x}}: %{{y:.3f}}<extra></extra>"),
                          row=1, col=j + 1)
        fig.add_vline(x=j + 1, line_dash="dot", line_color="grey", row=1, col=j + 1)
    fig.update_yaxes(title_text=score_label(score), row=1, col=1)
    fig.update_xaxes(title_text=STAGE_AXIS)
    fig.update_layout(title="Each task over the stages (dotted: the stage that trained on it)", height=380)
    return fig


def general_loss_figure(result: SequenceResult, methods: Sequence[str] | None = None) -> go.Figure:
    """The general held-out loss after each stage, a line per chain."""
    fig = go.Figure()
    names = stage_names(result)
    for m in methods or result.methods:
        fig.add_trace(go.Scatter(x=names, y=[s.general_loss for s in result.stages_of(m)], mode="lines+markers",
                                 name=m, line=dict(color=color_for(m))))
    fig.update_layout(title="General held-out loss after each stage (nats, lower is better)",
                      xaxis_title=STAGE_AXIS, yaxis_title="general loss (nats)", height=360)
    return fig


def op_bwt_figure(result: SequenceResult, score: str = "exact_match", bwt: str = "bwt_trace") -> go.Figure:
    """OP against BWT, a point per chain, with the Pareto front of the chains no other beats on both (for a loss
    both are better lower)."""
    metrics = [sequence_metrics(result.matrix(m, score), higher_is_better(score)) for m in result.methods]
    op = [m.op for m in metrics]
    back = [getattr(m, bwt) for m in metrics]
    sign = 1.0 if higher_is_better(score) else -1.0
    front = pareto_mask([sign * v for v in op], [-sign * v for v in back])
    fig = go.Figure()
    labels = spaced_labels(result.methods, op, back)
    for m, x, y, on, text in zip(result.methods, op, back, front, labels):
        fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers+text", text=[text], textposition="top center",
                                 name=m, marker=dict(size=14 if on else 10, color=color_for(m),
                                                     line=dict(width=2 if on else 0, color="black")),
                                 hovertemplate=f"{m}<br>OP %{{x:.3f}}<br>BWT %{{y:.3f}}<extra></extra>"))
    pts = sorted((x, y) for x, y, on in zip(op, back, front) if on)
    if len(pts) > 1:
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines", name="Pareto front",
                                 line=dict(dash="dash", color="black")))
    what = MEASURES.get(score, (score,))[0]
    fig.update_layout(title=f"Overall performance against backward transfer ({what}; outlined: the Pareto front)",
                      xaxis_title=f"OP: mean {what} over the tasks after the last stage",
                      yaxis_title=f"BWT ({'TRACE' if bwt == 'bwt_trace' else 'GEM'}): change of earlier tasks since "
                                  "their own stage", height=420)
    fig.add_hline(y=0.0, line_dash="dot", line_color="grey")
    return fig


def figures(result: SequenceResult, measure: str = "exact_match") -> list[go.Figure]:
    """The Sequence page's charts: the heatmaps, each task over the stages, OP against BWT and the general
    loss."""
    score = measure if measure in MEASURES else "exact_match"
    return [heatmaps(result, score), task_lines(result, score), op_bwt_figure(result, score),
            general_loss_figure(result)]
