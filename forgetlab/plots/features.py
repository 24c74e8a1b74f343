"""Figures of the Features page: the t-SNE map (colour = task, symbol = model) and the cluster distances."""
from __future__ import annotations

import plotly.graph_objects as go

from forgetlab.analysis.features_results import TsneResult
from forgetlab.plots import color_for

SYMBOLS = ("circle", "diamond", "square", "x", "triangle-up", "star", "cross", "triangle-down", "pentagon",
           "hexagon")


LEVEL_NAMES = {"model": "last hidden state", "layer": "decoder layer", "attn": "attention", "mlp": "MLP",
               "head": "attention head", "expert": "expert"}


def submodule_title(meta: dict) -> str:
    """Where the features come from, said once: "decoder layer 3", "MLP of layer 1", "head 2 of layer 3",
    "expert 1 of layer 0", "last hidden state" (the level's name and the layer are not repeated)."""
    level, layer, head = meta.get("level") or "", meta.get("layer"), meta.get("head")
    if level == "layer" and layer is not None:
        return f"decoder layer {layer}"
    if level == "head" and layer is not None:
        return f"head {head} of layer {layer}" if head is not None else f"the heads of layer {layer}"
    if level == "expert" and layer is not None and head is not None:
        return f"expert {head} of layer {layer}"
    name = LEVEL_NAMES.get(level, level)
    return f"{name} of layer {layer}" if layer is not None else name


def tsne_scatter(result: TsneResult, title: str = "") -> go.Figure:
    """One point per (model, task, sample): coloured by task (same colour as everywhere), shaped by model.

    The legend has one entry per task (its colour) and one per model (its symbol), not one per pair: seven
    models × three tasks made 21 entries that ran off the plot. Clicking a task's entry hides its points."""
    df = result.coords
    models = list(dict.fromkeys(df["model"]))
    tasks = list(dict.fromkeys(df["task"]))
    fig = go.Figure()
    for t, grp_t in df.groupby("task", sort=False):
        for m, grp in grp_t.groupby("model", sort=False):
            fig.add_trace(go.Scatter(
                x=grp["x"], y=grp["y"], mode="markers", name=f"{t} · {m}", legendgroup=f"task {t}",
                showlegend=False,
                marker=dict(color=color_for(str(t)), symbol=SYMBOLS[models.index(m) % len(SYMBOLS)], size=8,
                            line=dict(width=0.5, color="white")),
                customdata=grp["sample"],
                hovertemplate=f"task {t}<br>model {m}<br>sample %{{customdata}}<extra></extra>"))
    # legend-only entries (no points): colour = task, symbol = model
    for i, t in enumerate(tasks):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=str(t), legendgroup=f"task {t}",
                                 legendgrouptitle_text="task (colour)" if i == 0 else None,
                                 marker=dict(color=color_for(str(t)), symbol="circle", size=9)))
    for i, m in enumerate(models):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=str(m), legendgroup=f"model {m}",
                                 legendgrouptitle_text="model (symbol)" if i == 0 else None, hoverinfo="skip",
                                 marker=dict(color="#4d4d4d", symbol=SYMBOLS[i % len(SYMBOLS)], size=9)))
    fig.update_layout(title=title or f"t-SNE of {submodule_title(result.meta or {})} features "
                                     f"({result.backend}, perplexity {result.perplexity:g})",
                      xaxis_title="t-SNE 1", yaxis_title="t-SNE 2", margin=dict(t=40, b=10),
                      legend=dict(orientation="h", yanchor="top", y=-0.15, xanchor="left", x=0,
                                  groupclick="togglegroup"),
                      height=560)
    return fig


def distance_bars(result: TsneResult) -> go.Figure:
    """Average distance between task clusters per model (PCA space; a larger value = better separated tasks)."""
    s = result.cluster_summary()
    fig = go.Figure(go.Bar(x=s["model"], y=s["mean_distance_pca"], marker_color=[color_for(m) for m in s["model"]]))
    fig.update_layout(xaxis_title="model", yaxis_title="task-centroid distance (PCA)",
                      title="Mean distance between task clusters (higher: tasks better separated)",
                      margin=dict(t=40, b=10))
    return fig


def figures(result: TsneResult) -> list[go.Figure]:
    """The feature map's charts: the t-SNE scatter and the distances between task clusters."""
    return [tsne_scatter(result), distance_bars(result)]
