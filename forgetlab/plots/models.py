"""Figures of the Models page: scorecards, task-vector norms per layer × module, cosine matrix."""
from __future__ import annotations

from typing import Sequence

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from forgetlab.evaluate import Scorecard
from forgetlab.plots import color_map
from forgetlab.taskvec import CosineMatrix


def scorecard_bars(cards: Sequence[Scorecard]) -> go.Figure:
    """Two panels per model: held-out general loss (lower is better) and exact match per task (higher)."""
    rows = []
    for c in cards:
        rows.append({"model": c.model, "metric": "general loss (held-out text) ↓", "value": c.general_loss})
        for t in c.tasks.values():
            rows.append({"model": c.model, "metric": f"{t.task}: exact match ↑", "value": t.exact_match})
    df = pd.DataFrame(rows)
    fig = px.bar(df, x="metric", y="value", color="model", barmode="group",
                 color_discrete_map=color_map(df["model"].unique()))
    fig.update_layout(xaxis_title=None, yaxis_title=None, legend_title="model", margin=dict(t=30, b=10))
    return fig


def norms_heatmap(by_level: pd.DataFrame, value: str = "relative", title: str = "") -> go.Figure:
    """Layer × module heatmap of a task vector's norm (`norm` or `relative` = ‖τ‖/‖θ0‖)."""
    df = by_level[by_level["layer"] >= 0]
    grid = df.pivot_table(index="module", columns="layer", values=value)
    label = "‖τ‖ / ‖θ0‖" if value == "relative" else "‖τ‖"
    fig = px.imshow(grid, aspect="auto", color_continuous_scale="Viridis",
                    labels=dict(x="layer", y="module", color=label), title=title or None)
    fig.update_layout(margin=dict(t=40 if title else 10, b=10))
    return fig


def cosine_heatmap(cos: CosineMatrix) -> go.Figure:
    """Cosine similarity between task vectors, annotated."""
    df = cos.to_frame()
    fig = px.imshow(df, zmin=-1, zmax=1, color_continuous_scale="RdBu", text_auto=".2f",
                    labels=dict(color="cosine"))
    fig.update_layout(margin=dict(t=10, b=10))
    return fig
