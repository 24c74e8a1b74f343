"""Figures of an attribution map (`forgetlab.analysis.attribution_results.AttributionResult`): a layer × module
heatmap of one d column, and the submodules on the speciality-vs-generality plane with their Pareto front."""
from __future__ import annotations

import math
from typing import Mapping, Optional

import pandas as pd
import plotly.graph_objects as go

from forgetlab.analysis.measures import pareto_mask
from forgetlab.plots import color_for, forgetting_text

LABELS = {"d_general_loss": "Δ general loss, nats (↓ better)", "d_speciality": "Δ exact match (↑ better)",
          "d_answer_loss": "Δ answer loss, nats (↓ better)"}
MAP_LABELS = {"only_this": "only this part of τ (θ0 + τk) vs the base",
              "leave_one_out": "all of τ but this part (θ0 + τ − τk) vs the fine-tune"}


def _point(frame: pd.DataFrame, which: str) -> pd.DataFrame:
    """The rows of one map at its 0/1 point (α = 1 for only_this, 0 for leave_one_out)."""
    a = 1.0 if which == "only_this" else 0.0
    f = frame[(frame["map"] == which) & (frame["alpha"] == a)]
    return f if len(f) else frame[frame["map"] == which]


def _column(row) -> str:
    if pd.isna(row["layer"]):
        return "in" if row["module"] == "embed" else "out"
    return str(int(row["layer"]))


def _row(row) -> str:
    if row["module"] == "layer":
        return "layer"
    if pd.isna(row["head"]):
        return row["module"]
    return f"expert {int(row['head'])}" if row["module"] == "expert" else f"{row['module']} h{int(row['head'])}"


def heatmap_figure(result, measure: str = "d_general_loss", which: str = "only_this") -> go.Figure:
    """Layer × module heatmap of `measure` (a d column) for one map; embeddings at "in", the final norm and
    lm_head at "out". Diverging colours centred on 0."""
    f = _point(result.to_frame(), which)
    cols = ["in", *[str(i) for i in sorted({int(v) for v in f["layer"].dropna()})], "out"]
    cols = [c for c in cols if any(_column(r) == c for _, r in f.iterrows())]
    rows = list(dict.fromkeys(_row(r) for _, r in f.sort_values(["module", "head"], na_position="last").iterrows()))
    z = [[math.nan] * len(cols) for _ in rows]
    text = [[""] * len(cols) for _ in rows]
    for _, r in f.iterrows():
        i, j = rows.index(_row(r)), cols.index(_column(r))
        z[i][j] = float(r[measure])
        value = (forgetting_text(float(r[measure]), 4) if measure == "d_general_loss"
                 else f"{float(r[measure]):+.4f}")
        text[i][j] = f"{r['key']}<br>{value}" + ("<br>τ = 0" if r["zero_tau"] else "")
    # for a loss, red = worse: reverse the scale so that a rise of the loss is red, a rise of speciality blue
    scale = "RdBu_r" if measure != "d_speciality" else "RdBu"
    # the title names the measure; which map it is the page says once, above both heatmaps (a long title
    # here was cut at half-page width, and a titled colour bar took a third of the plot)
    fig = go.Figure(go.Heatmap(z=z, x=cols, y=rows, text=text, hoverinfo="text", colorscale=scale, zmid=0,
                               colorbar={"thickness": 12}))
    fig.update_layout(title=LABELS.get(measure, measure), xaxis_title="layer", yaxis_title="module",
                      xaxis_type="category", margin={"l": 60, "r": 20, "t": 50, "b": 40},
                      height=160 + 40 * len(rows))
    return fig


LABELLED = 8      # the submodules named on the scatter: the farthest from the origin; the others on hover
CROWD = 0.1       # nor any point within this share of the largest distance from the origin (they overlap there)


def outer_labels(keys, xs, ys, k: int = LABELLED, crowd: float = CROWD) -> list[str]:
    """The text of each point of a scatter: its key for the `k` points farthest from the origin (each axis
    scaled by its largest |value|, so both count alike) that are at least `crowd` of the way out; "" for the
    rest, which crowd near the origin and whose labels overlapped there. Points with a non-finite
    coordinate are never labelled."""
    def scale(vals) -> float:
        finite = [abs(float(v)) for v in vals if math.isfinite(float(v))]
        return max(finite, default=0.0) or 1.0

    sx, sy = scale(xs), scale(ys)
    dist = [math.hypot(float(x) / sx, float(y) / sy) for x, y in zip(xs, ys)]
    ranked = sorted((i for i, d in enumerate(dist) if math.isfinite(d) and d >= crowd),
                    key=lambda i: -dist[i])[:max(0, k)]
    keep = set(ranked)
    return [str(key) if i in keep else "" for i, key in enumerate(keys)]


def tradeoff_figure(result, which: str = "only_this", measure: str = "exact_match",
                    nls: Optional[Mapping[str, float]] = None) -> go.Figure:
    """Every submodule of one map at x = Δ general loss, y = Δ speciality (exact match, or −Δ answer loss so
    that up is better), the Pareto front (`forgetlab.analysis.measures.pareto_mask`: up and left) drawn as a line; the
    LABELLED points farthest from the origin carry their key (`outer_labels`), every point names itself on hover. With
    `nls` (key → non-linearity score from a linearity run) the points are coloured by NLS, else by module."""
    f = _point(result.to_frame(), which).reset_index(drop=True)
    y = f["d_speciality"] if measure == "exact_match" else -f["d_answer_loss"]
    ylabel = LABELS["d_speciality"] if measure == "exact_match" else "−Δ answer loss, nats (↑ better)"
    front = pareto_mask(list(y), list(f["d_general_loss"]))
    labels = pd.Series(outer_labels(f["key"], f["d_general_loss"], y), index=f.index)
    hover = [f"{k}<br>Δ general loss {forgetting_text(g, 4)}<br>{ylabel}: {s:+.4f}<br>share of ‖τ‖²: {t:.3f}"
             for k, g, s, t in zip(f["key"], f["d_general_loss"], y, f["tau_share"])]
    fig = go.Figure()
    if nls:
        vals = [nls.get(k, math.nan) for k in f["key"]]
        fig.add_trace(go.Scatter(x=f["d_general_loss"], y=y, mode="markers+text", text=labels,
                                 textposition="top center", hovertext=hover, hoverinfo="text", name="submodules",
                                 marker={"size": 11, "color": vals, "colorscale": "Viridis", "showscale": True,
                                         "colorbar": {"title": "NLS", "thickness": 12}}))
    else:
        for module in dict.fromkeys(f["module"]):
            m = f["module"] == module
            fig.add_trace(go.Scatter(x=f["d_general_loss"][m], y=y[m], mode="markers+text", text=labels[m],
                                     textposition="top center", hovertext=[h for h, b in zip(hover, m) if b],
                                     hoverinfo="text", name=module, marker={"size": 11, "color": color_for(module)}))
    pts = sorted((g, s) for g, s, on in zip(f["d_general_loss"], y, front) if on)
    if pts:
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines", name="Pareto front",
                                 line={"dash": "dot", "color": "#4d4d4d"}))
    fig.update_layout(title=MAP_LABELS.get(which, which), xaxis_title=LABELS["d_general_loss"], yaxis_title=ylabel,
                      margin={"l": 60, "r": 20, "t": 50, "b": 40},
                      # below the plot: at the right it sat on the NLS colour bar
                      legend={"orientation": "h", "yanchor": "top", "y": -0.18, "xanchor": "left", "x": 0})
    return fig


def figures(result, measure: str = "exact_match") -> list[go.Figure]:
    """The map's charts with speciality in `measure` (exact_match, or answer_loss): the heatmaps of Δ general loss
    and Δ speciality, and the trade-off of the only-this map."""
    spec = "d_speciality" if measure == "exact_match" else "d_answer_loss"
    return [heatmap_figure(result, "d_general_loss"), heatmap_figure(result, spec),
            tradeoff_figure(result, measure=measure)]
