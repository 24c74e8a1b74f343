"""Figures of the Linearity page: NLS heatmap (layer × module), NLS by level with error bars, d(α) curves."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from forgetlab.analysis.linearity_results import NonlinearityResult
from forgetlab.plots import color_for

_ROW_ORDER = ("layer", "attn", "mlp")


def _row_label(level: str, head) -> str:
    return f"{level} {int(head)}" if level in ("head", "expert") else level


def nls_heatmap(result: NonlinearityResult) -> go.Figure:
    """Heatmap of mean NLS: one column per layer, one row per module (layer, attn, mlp, then each head, then each
    expert of a mixture of experts)."""
    df = result.to_frame()
    df = df[df["level"] != "model"].copy()
    if df.empty:
        fig = go.Figure()
        fig.add_annotation(text="only the model level was computed", showarrow=False)
        return fig
    df["row"] = [_row_label(lv, h) for lv, h in zip(df["level"], df["head"])]
    order = [r for r in _ROW_ORDER if r in set(df["row"])]
    for level in ("head", "expert"):
        order += [f"{level} {h}" for h in sorted({int(h) for h in df.loc[df["level"] == level, "head"].dropna()})]
    grid = df.pivot_table(index="row", columns="layer", values="nls_mean", aggfunc="first").reindex(order)
    std = df.pivot_table(index="row", columns="layer", values="nls_std", aggfunc="first").reindex(order)
    text = np.vectorize(lambda m, s: "" if np.isnan(m) else f"NLS {m:.4f} ± {s:.4f}")(grid.to_numpy(float),
                                                                                   std.to_numpy(float))
    fig = go.Figure(go.Heatmap(z=grid.to_numpy(float), x=[str(c) for c in grid.columns], y=list(grid.index),
                               colorscale="Viridis", colorbar=dict(title="NLS"), text=text,
                               hovertemplate="layer %{x} · %{y}<br>%{text}<extra></extra>"))
    fig.update_xaxes(type="category")
    fig.update_layout(xaxis_title="layer", yaxis_title="module", yaxis_autorange="reversed",
                      margin=dict(t=30, b=10), title=f"Non-linearity score, {result.model} on {result.task}")
    return fig


def level_bars(result: NonlinearityResult) -> go.Figure:
    """Mean NLS per level (over all samples of all its submodules) with ± std error bars."""
    df = result.by_level()
    fig = go.Figure(go.Bar(x=df["level"], y=df["nls_mean"],
                           error_y=dict(type="data", array=df["nls_std"].fillna(0), visible=True),
                           marker_color=[color_for(lv) for lv in df["level"]],
                           customdata=df["submodules"],
                           hovertemplate="%{x}: %{y:.4f}<br>%{customdata} submodule(s)<extra></extra>"))
    fig.update_layout(xaxis_title="level", yaxis_title="NLS (mean ± std)", margin=dict(t=30, b=10),
                      title="Non-linearity by level")
    return fig


def curves_figure(result: NonlinearityResult,
                  selection: Optional[Sequence[tuple]] = None) -> go.Figure:
    """d(α) curves (mean over samples, ± std band) with the ideal 1 − α line.

    ``selection``: (level, layer, head) triples to draw; default the model level and the mean curve of every
    other level (averaged over its submodules)."""
    alphas = np.asarray(result.alphas, dtype=float)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=alphas, y=1 - alphas, name="ideal 1 − α", mode="lines",
                             line=dict(color="black", dash="dash")))
    series = []
    if selection:
        for level, layer, head in selection:
            s = result.get(level, layer, head)
            label = level if layer is None else f"{_row_label(level, head)} · layer {layer}"
            series.append((label, level, s.curve, s.curve_std))
    else:
        for level in result.levels:
            subs = [s for s in result.scores if s.level == level]
            if not subs:
                continue
            d = np.concatenate([s.d for s in subs])
            with np.errstate(all="ignore"):
                mean, std = np.nanmean(d, axis=0), np.nanstd(d, axis=0)
            label = level if level == "model" else f"{level} (mean of {len(subs)})"
            series.append((label, level, mean, std))
    for label, level, mean, std in series:
        color = color_for(label if selection else level)
        fig.add_trace(go.Scatter(x=alphas, y=mean, name=label, mode="lines+markers", line=dict(color=color),
                                 error_y=dict(type="data", array=np.nan_to_num(std), visible=True, thickness=1)))
    # the formula in the title, not the y axis (a long axis title was cut at a 420 px chart height)
    fig.update_layout(xaxis_title="α", yaxis_title="d(α)", margin=dict(t=40, b=10), legend_title=None,
                      title="Distance curves d(α) = ‖f(θ0+ατ) − f(θ0+τ)‖ / ‖f(θ0) − f(θ0+τ)‖")
    return fig


def curves_table(result: NonlinearityResult) -> pd.DataFrame:
    """The d(α) table of every submodule (long format) for download."""
    return result.curves_frame()


def figures(result: NonlinearityResult) -> list[go.Figure]:
    """The linearity result's charts: the NLS heatmap, NLS by level, the d(α) curves."""
    return [nls_heatmap(result), level_bars(result), curves_figure(result)]
