"""Figures of the Merge page: generality and speciality of a merge beside its base and parents."""
from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.analysis.search_results import SearchResult
from forgetlab.core.evaluate import Scorecard
from forgetlab.executors import worker_label
from forgetlab.plots import color_map, forgetting_text, perplexity_text
from forgetlab.plots.forgetting import GENERAL_AXIS, speciality_label
from forgetlab.plots.models import scorecards_figure


def scorecard_figure(cards: Sequence[Scorecard], measure: str = "exact_match", *, title: str = "",
                     merged: Sequence[str] = ()) -> go.Figure:
    """General-text loss (↓) and speciality per task (`measure`: exact match ↑ or answer loss ↓) of merges
    (`merged`, hatched) beside their base and parents, on separate axes (`plots.models.scorecards_figure`)."""
    return scorecards_figure(cards, measure, title=title, merged=merged)


def label_positions(values, every=(), inside_share: float = 0.15) -> list[str]:
    """Where each bar's value label goes: "inside" (in the middle of the bar, away from any reference line drawn
    across the bars' tops, such as a parent's 100 %) for a bar at least `inside_share` of the tallest bar
    (`every`: all bars of the panel, default `values`) high, "outside" for a shorter one, whose label then sits
    low, far below such a line."""
    finite = [abs(float(v)) for v in (every or values) if v is not None and v == v]
    tallest = max(finite, default=0.0) or 1.0
    return ["inside" if v is not None and v == v and abs(float(v)) >= inside_share * tallest else "outside"
            for v in values]


def retention_figure(result, labels: Mapping[str, str] | None = None, *, title: str = "",
                     colors: Mapping[str, str] | None = None) -> go.Figure:
    """What merges kept (`forgetlab.analysis.retention.MergeRetention`), on two panels that both start at 0.

    Left: for each parent's own task, the share of that parent's gain over the base each merge kept, in %
    (100 % = the parent's level, dashed, behind the bars; 0 = the base's), one bar per merge, its value written
    inside it (`label_positions`: outside only for a short bar) so that the line never strikes a label
    (`labels`: merge → legend name;
    `colors`: merge → colour, by default each merge name's own).
    Right: forgetting, general loss − the base's in nats (a delta view: 0 is the base), for every parent and
    merge, each bar labelled with the perplexity change it means (exp(Δ) − 1)."""
    labels = dict(labels or {})
    name = lambda m: labels.get(m, m)        # noqa: E731
    fig = make_subplots(rows=1, cols=2, column_widths=[0.62, 0.38], horizontal_spacing=0.12,
                        subplot_titles=(f"each parent's own-task gain kept ({result.measure.replace('_', ' ')}; "
                                        "dashed: the parent)",
                                        "forgetting (Δ general loss vs base)"))
    colors = {**color_map(result.merges), **(colors or {})}
    parent_colors = color_map(result.parents)
    cats = {}
    for r in result.rows:
        cats.setdefault((r.parent, r.task), f"{r.task or '?'} (parent {r.parent})")
    kept = [100 * r.retention for r in result.rows if r.merge in result.merges and r.retention == r.retention]
    for m in result.merges:
        rows = [r for r in result.rows if r.merge == m]
        ys = [100 * r.retention if r.retention == r.retention else None for r in rows]
        fig.add_trace(go.Bar(
            x=[cats[(r.parent, r.task)] for r in rows], y=ys, name=name(m), legendgroup=m,
            marker=dict(color=colors[m], pattern=dict(shape="/", solidity=0.15)),
            text=[f"{y:.0f} %" if y is not None else "n/a" for y in ys], textposition=label_positions(ys, kept),
            insidetextanchor="middle", textangle=0, cliponaxis=False,
            insidetextfont=dict(color="#222222", size=12),    # on the light hatching, not the bar's contrast colour
            hovertext=[f"{name(m)} on {r.task}: {100 * r.retention:.0f} % of {r.parent}'s gain<br>base "
                       f"{abs(r.base):.3f} → {r.parent} {abs(r.parent_score):.3f}, merge {abs(r.merged):.3f}"
                       if r.retention == r.retention else f"{r.parent}: no own-task gain to keep" for r in rows],
            hoverinfo="text"), row=1, col=1)
    # the parent's own level, behind the bars (their labels sit inside them, clear of it)
    fig.add_hline(y=100, line_dash="dash", line_color="#444444", layer="below", row=1, col=1)
    forgetting = result.forgetting
    models = [*result.parents, *result.merges]
    fig.add_trace(go.Bar(
        x=[name(m) for m in models], y=[forgetting[m] for m in models], showlegend=False,
        marker=dict(color=[parent_colors.get(m) or colors[m] for m in models],
                    pattern=dict(shape=["" if m in parent_colors else "/" for m in models])),
        text=[f"{forgetting[m]:+.3f}<br>{perplexity_text(forgetting[m]).removeprefix('perplexity ')}" for m in models],
        textposition="outside", cliponaxis=False,
        hovertext=[f"{name(m)}: {forgetting_text(forgetting[m], 4)}" for m in models], hoverinfo="text"),
        row=1, col=2)
    fig.update_yaxes(title_text="% of the parent's own-task gain ↑", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=f"Δ general loss, nats ↓ (0 = base {result.base_general_loss:.3f})",
                     rangemode="tozero", row=1, col=2)
    fig.update_layout(barmode="group", title=title or None, height=460, legend_title_text="merge",
                      legend=dict(orientation="h", yanchor="top", y=-0.25, xanchor="left", x=0),
                      margin=dict(t=60 if title else 40, l=60, r=20, b=40))
    return fig


def search_figure(result: SearchResult, title: str = "merge search: every merge it evaluated") -> go.Figure:
    """A merge search (`forgetlab.analysis.search_results.SearchResult`) on the speciality-vs-generality plane:
    every evaluated point coloured by its evaluation order, the base, the Pareto front (dashed step line), the best
    point (star) and, for the constrained objective, the forgetting bound (dotted vertical line); `title` above
    (it names the chart wherever it is shown: the Merge page, Runs, a download)."""
    ok = [p for p in result.points if p.error is None]
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[p.general_loss for p in ok], y=[p.speciality for p in ok], mode="markers", name="evaluated merges",
        marker=dict(size=9, color=[p.index for p in ok], colorscale="Viridis", showscale=True,
                    colorbar=dict(title="order", thickness=12)),
        hovertext=[f"point {p.index}: {', '.join(f'{v:.3f}' for v in p.values)}"
                   + (f"; α {', '.join(f'{a:.2f}' for a in p.alphas)}" if p.alphas else "")
                   + f"<br>speciality {p.speciality:.4f}, forgetting {forgetting_text(p.forgetting, 4)}"
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
    fig.update_layout(xaxis_title=GENERAL_AXIS, title=title or None,
                      yaxis_title=f"speciality: {speciality_label(result.settings.get('task'), result.measure)}",
                      margin=dict(t=50 if title else 30, b=10, l=60, r=10), height=420, legend_title_text=None,
                      legend=dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0))
    return fig
