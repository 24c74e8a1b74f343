"""Figures of the Merge page: generality and speciality of a merge beside its base and parents."""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from forgetlab.core.evaluate import Scorecard
from forgetlab.plots.models import scorecards_figure


def scorecard_figure(cards: Sequence[Scorecard], measure: str = "exact_match", *, title: str = "",
                     merged: Sequence[str] = ()) -> go.Figure:
    """General-text loss (↓) and speciality per task (`measure`: exact match ↑ or answer loss ↓) of merges
    (`merged`, hatched) beside their base and parents, on separate axes (`plots.models.scorecards_figure`)."""
    return scorecards_figure(cards, measure, title=title, merged=merged)


def search_figure(result) -> go.Figure:
    """A merge search (`forgetlab.analysis.search.SearchResult`) on the speciality-vs-generality plane: every evaluated
    point coloured by its evaluation order, the base, the Pareto front (dashed step line), the best point
    (star) and, for the constrained objective, the forgetting bound (dotted vertical line)."""
    from forgetlab.executors import worker_label
    from forgetlab.plots.forgetting import speciality_label

    ok = [p for p in result.points if p.error is None]
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[p.general_loss for p in ok], y=[p.speciality for p in ok], mode="markers", name="evaluated merges",
        marker=dict(size=9, color=[p.index for p in ok], colorscale="Viridis", showscale=True,
                    colorbar=dict(title="order", thickness=12)),
        hovertext=[f"point {p.index}: {', '.join(f'{v:.3f}' for v in p.values)}"
                   + (f"; α {', '.join(f'{a:.2f}' for a in p.alphas)}" if p.alphas else "")
                   + f"<br>speciality {p.speciality:.4f}, forgetting {p.forgetting:+.4f}"
                   + (f"<br>worker {worker_label(p.worker)}" if p.worker else "") for p in ok],
        hoverinfo="text"))
    fig.add_trace(go.Scatter(x=[result.base_general_loss], y=[result.base_speciality], mode="markers", name="base",
                             marker=dict(size=13, symbol="diamond", color="#444444")))
    front = sorted((p for p in ok if p.pareto), key=lambda p: p.general_loss)
    if front:
        fig.add_trace(go.Scatter(x=[p.general_loss for p in front], y=[p.speciality for p in front],
                                 mode="lines", name="Pareto front", line=dict(color="black", dash="dash", shape="hv"),
                                 hoverinfo="skip"))
    best = result.best_point
    if best is not None and best.error is None:
        fig.add_trace(go.Scatter(x=[best.general_loss], y=[best.speciality], mode="markers", name="best",
                                 marker=dict(size=18, symbol="star", color="#d62728",
                                             line=dict(color="black", width=1))))
    if result.objective == "constrained":
        fig.add_vline(x=result.base_general_loss + result.max_forgetting, line_dash="dot", line_color="#888888",
                      annotation_text="forgetting bound", annotation_position="top")
    fig.update_layout(xaxis_title="general loss on held-out text (↓ better)",
                      yaxis_title=f"speciality: {speciality_label(result.settings.get('task'), result.measure)}",
                      margin=dict(t=30, b=10, l=60, r=10), height=420, legend_title_text=None,
                      legend=dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0))
    return fig
