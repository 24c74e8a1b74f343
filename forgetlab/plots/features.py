"""Figures of the Features page: the t-SNE map (colour = task, symbol = model) and the cluster distances."""
from __future__ import annotations

import plotly.graph_objects as go

from forgetlab.analysis.features import TsneResult
from forgetlab.plots import color_for

SYMBOLS = ("circle", "diamond", "square", "x", "triangle-up", "star", "cross", "triangle-down", "pentagon",
           "hexagon")


def tsne_scatter(result: TsneResult, title: str = "") -> go.Figure:
    """One point per (model, task, sample): coloured by task (same colour as everywhere), shaped by model."""
    df = result.coords
    models = list(dict.fromkeys(df["model"]))
    fig = go.Figure()
    for t, grp_t in df.groupby("task", sort=False):
        for m, grp in grp_t.groupby("model", sort=False):
            fig.add_trace(go.Scatter(
                x=grp["x"], y=grp["y"], mode="markers", name=f"{t} · {m}", legendgroup=str(t),
                marker=dict(color=color_for(str(t)), symbol=SYMBOLS[models.index(m) % len(SYMBOLS)], size=8,
                            line=dict(width=0.5, color="white")),
                customdata=grp["sample"],
                hovertemplate=f"task {t}<br>model {m}<br>sample %{{customdata}}<extra></extra>"))
    meta = result.meta or {}
    where = meta.get("level", "")
    if meta.get("layer") is not None:
        where += f" · layer {meta['layer']}"
    if meta.get("head") is not None:
        where += f" · head {meta['head']}"
    fig.update_layout(title=title or f"t-SNE of {where} features ({result.backend}, perplexity "
                                     f"{result.perplexity:g})",
                      xaxis_title="t-SNE 1", yaxis_title="t-SNE 2", margin=dict(t=40, b=10),
                      legend_title="task · model")
    return fig


def distance_bars(result: TsneResult) -> go.Figure:
    """Average distance between task clusters per model (PCA space; a larger value = better separated tasks)."""
    s = result.cluster_summary()
    fig = go.Figure(go.Bar(x=s["model"], y=s["mean_distance_pca"], marker_color=[color_for(m) for m in s["model"]]))
    fig.update_layout(xaxis_title="model", yaxis_title="task-centroid distance (PCA)",
                      title="Mean distance between task clusters (higher: tasks better separated)",
                      margin=dict(t=40, b=10))
    return fig
