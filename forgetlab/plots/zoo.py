"""Figures of the demo zoo's build: the base learning while it pre-trains."""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.zoo.watch import PretrainingSnapshot


def pretraining_figure(snapshots: Sequence[PretrainingSnapshot]) -> go.Figure:
    """Against the pre-training step: the base's loss on held-out Wikipedia text (nats per token ↓, left axis)
    and how many watched held-out facts it answers in the pre-training text's form and in the tasks' own format
    (right axis)."""
    steps = [s.step for s in snapshots]
    total = len(snapshots[-1].answers) if snapshots else 0
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=steps, y=[s.loss for s in snapshots], mode="lines+markers", name="held-out loss",
                             line={"color": "#1f77b4"},
                             hovertemplate="step %{x}<br>held-out loss %{y:.3f}<extra></extra>"), secondary_y=False)
    fig.add_trace(go.Scatter(x=steps, y=[s.known for s in snapshots], mode="lines+markers",
                             name="facts known (pre-training form)", line={"color": "#2ca02c"},
                             hovertemplate=f"step %{{x}}<br>%{{y}} of {total} known<extra></extra>"), secondary_y=True)
    fig.add_trace(go.Scatter(x=steps, y=[s.correct for s in snapshots], mode="lines+markers",
                             name="answered in the task's format", line={"color": "#d62728", "dash": "dot"},
                             hovertemplate=f"step %{{x}}<br>%{{y}} of {total} answered<extra></extra>"),
                  secondary_y=True)
    last = snapshots[-1].steps if snapshots else 1
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 10, "b": 10},
                      legend={"orientation": "h", "x": 0, "y": -0.3})
    fig.update_xaxes(title="pre-training step", range=[0, last])
    fig.update_yaxes(title="held-out loss (nats) ↓", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title=f"watched facts (of {total})", range=[0, max(total, 1) + 0.5], secondary_y=True,
                     showgrid=False, dtick=max(1, total // 3))
    return fig
