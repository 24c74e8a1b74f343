"""Figures of the Models page: scorecards, task-vector norms per layer × module, cosine matrix."""
from __future__ import annotations

from typing import Sequence

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.core.taskvectors import CosineMatrix
from forgetlab.core.evaluate import Scorecard
from forgetlab.plots import MEASURE_TITLES, axis_title, color_map, forgetting_text, perplexity_text



def _benchmark_value(card: Scorecard, measure: str) -> float | None:
    """`TASK/METRIC` of the card's lm-eval results, None (no bar) when it was not evaluated."""
    task, _, metric = measure.partition("/")
    value = card.benchmarks.get(task, {}).get(metric)
    return float(value) if value is not None else None


def scorecards_figure(cards: Sequence[Scorecard], measure: str = "exact_match", *, title: str = "",
                      merged: Sequence[str] = ()) -> go.Figure:
    """Two panels with their own y axes, a bar per model (one colour per model on every chart, named in a
    legend below the chart rather than under each bar, so long names never crowd the axis):
    generality (left) and speciality per task in `measure` (exact match ↑ or answer loss ↓, right; or an
    lm-eval `TASK/METRIC` from the cards' benchmarks). Both axes start at 0, so bar heights compare honestly.
    Generality is the forgetting — general loss − the base's, in nats, each bar labelled with the perplexity
    change it means — when the cards hold the base (a delta view, which its axis title says: a few hundredths
    of a nat would be invisible on bars of ~5 nats from zero), else the general loss itself. Models named in
    `merged` are marked "(merge)" and drawn hatched."""
    names = [c.model for c in cards]
    colors = color_map(names)
    benchmark = "/" in str(measure)     # an lm-eval TASK/METRIC: one group of bars, from each card's benchmarks
    tasks = [measure] if benchmark else list(dict.fromkeys(t for c in cards for t in c.tasks))
    label = MEASURE_TITLES.get(measure, measure)
    base = next((c for c in cards if c.model == "base"), None)
    delta = base is not None and base.general_loss == base.general_loss
    fig = make_subplots(rows=1, cols=2, column_widths=[0.28, 0.72], horizontal_spacing=0.1)
    for card in cards:
        name = f"{card.model} (merge)" if card.model in merged else card.model
        pattern = dict(shape="/") if card.model in merged else None
        if delta:
            d = card.forgetting(base)
            general = dict(y=[d], text=[f"{d:+.3f}<br>{perplexity_text(d).removeprefix('perplexity ')}"],
                           textposition="outside", cliponaxis=False,
                           hovertemplate=(f"{name}<br>general loss {card.general_loss:.4f} (base "
                                          f"{base.general_loss:.4f})<br>forgetting {forgetting_text(d, 4)}"
                                          "<extra></extra>"))
        else:
            general = dict(y=[card.general_loss], hovertemplate=f"{name}<br>general loss %{{y:.4f}}<extra></extra>")
        fig.add_trace(go.Bar(x=["held-out text"], name=name, legendgroup=name,
                             marker=dict(color=colors[card.model], pattern=pattern), showlegend=False,
                             **general), row=1, col=1)
        ys = ([_benchmark_value(card, measure)] if benchmark else
              [getattr(card.tasks[t], measure) if t in card.tasks else None for t in tasks])
        fig.add_trace(go.Bar(x=tasks, y=ys, name=name, legendgroup=name,
                             marker=dict(color=colors[card.model], pattern=pattern),
                             hovertemplate=f"{name}<br>%{{x}}: {label} %{{y:.4f}}<extra></extra>"), row=1, col=2)
    general_title = "Δ general loss vs base, nats ↓" if delta else axis_title("general_loss")
    fig.update_yaxes(title_text=general_title, row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text=label, row=1, col=2, rangemode="tozero")
    if measure == "exact_match":
        fig.update_yaxes(range=[0, 1.02], row=1, col=2)
    fig.update_xaxes(title_text=f"forgetting (0 = base, {base.general_loss:.3f})" if delta else "generality",
                     row=1, col=1)
    fig.update_xaxes(title_text="speciality per task", row=1, col=2)
    fig.update_layout(barmode="group", title=title or None, height=420, legend_title_text="model",
                      uniformtext=dict(minsize=9, mode="show"),      # the forgetting labels stay readable
                      legend=dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0),
                      margin=dict(t=50 if title else 20, l=60, r=20, b=40))
    return fig


def scorecard_bars(cards: Sequence[Scorecard], measure: str = "exact_match") -> go.Figure:
    """The Models page's scorecard chart: `scorecards_figure` of the pool's models."""
    return scorecards_figure(cards, measure)


def norms_heatmap(by_level: pd.DataFrame, value: str = "relative", title: str = "") -> go.Figure:
    """Layer × module heatmap of a task vector's norm (`norm` or `relative` = ‖τ‖/‖θ0‖)."""
    df = by_level[by_level["layer"] >= 0]
    grid = df.pivot_table(index="module", columns="layer", values=value)
    label = "‖τ‖ / ‖θ0‖" if value == "relative" else "‖τ‖"
    fig = px.imshow(grid, aspect="auto", color_continuous_scale="Viridis",
                    labels=dict(x="layer", y="module", color=label), title=title or None)
    fig.update_layout(margin=dict(t=40 if title else 10, b=10))
    return fig


def cosine_heatmap(cos: CosineMatrix, title: str = "") -> go.Figure:
    """Cosine similarity between task vectors, annotated; `title` above (none by default: the page heads it)."""
    df = cos.to_frame()
    fig = px.imshow(df, zmin=-1, zmax=1, color_continuous_scale="RdBu", text_auto=".2f",
                    labels=dict(color="cosine"), title=title or None)
    fig.update_layout(margin=dict(t=40 if title else 10, b=10))
    return fig


def benchmark_bars(table) -> go.Figure:
    """A `forgetlab.core.benchmarks.BenchmarkTable` as grouped bars: one group per lm-eval `task/metric`, one bar
    per model (the models' colours)."""
    frame = table.to_frame()
    measures = [c for c in frame.columns if c != "model"]
    colors = color_map(list(frame["model"]))
    fig = go.Figure()
    for _, row in frame.iterrows():
        fig.add_trace(go.Bar(x=measures, y=[row[m] for m in measures], name=str(row["model"]),
                             marker={"color": colors[row["model"]]}))
    fig.update_layout(barmode="group", yaxis_title="value (lm-eval)", height=380, legend_title_text="model",
                      title=f"lm-eval benchmarks (limit {table.limit or 'all'} per task)",
                      margin={"t": 50, "b": 40, "l": 50, "r": 10})
    return fig
