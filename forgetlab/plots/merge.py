"""Figures of the Merge page: generality and speciality of a merge beside its base and parents."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.plots import color_map


def scorecard_figure(frame: pd.DataFrame, title: str = "") -> go.Figure:
    """Bars per model: general-text loss (generality, lower is better) and exact match per task
    (speciality, higher is better). `frame` is forgetlab.merge.workflow.cards_frame(...)."""
    tasks = [c.split("/")[0] for c in frame.columns if c.endswith("/exact_match")]
    colors = color_map([str(m) for m in frame["model"]])
    fig = make_subplots(rows=1, cols=2, column_widths=[0.35, 0.65], horizontal_spacing=0.12,
                        subplot_titles=("general-text loss ↓", "exact match per task ↑"))
    for _, row in frame.iterrows():
        name = str(row["model"])
        fig.add_trace(go.Bar(x=[name], y=[row["general_loss"]], name=name, marker_color=colors[name],
                             legendgroup=name, showlegend=False,
                             hovertemplate=f"{name}<br>general loss %{{y:.4f}}<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Bar(x=tasks, y=[row[f"{t}/exact_match"] for t in tasks], name=name,
                             marker_color=colors[name], legendgroup=name,
                             hovertemplate=f"{name}<br>%{{x}}: exact match %{{y:.3f}}<extra></extra>"), row=1, col=2)
    fig.update_layout(barmode="group", title=title or None, height=440,
                      legend=dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0),
                      margin=dict(t=60 if title else 40, l=40, r=20, b=40))
    fig.update_yaxes(range=[0, 1.02], row=1, col=2)
    return fig
