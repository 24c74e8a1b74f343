"""Figures of the Forgetting page: speciality/generality/distance against the swept setting, and the
speciality-vs-generality trade-off of every series with its Pareto front (results in, go.Figure out)."""
from __future__ import annotations

import json
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.analysis.measures import (MEASURES, check_general_measure, check_measure, higher_is_better, is_benchmark,
                                         pareto_mask)
from forgetlab.analysis.sweep_results import SweepPoint, SweepResult
from forgetlab.plots import axis_title, color_map, series_name, spaced_labels, tell_apart

AXIS_LABELS = {"alpha": "α (0 = base, 1 = fine-tuned)", "ratio": "pruning ratio (share of τ zeroed)",
               "density": "density (share of τ kept)", "mean_alpha": "mean block α"}
KIND_NAMES = {"alpha": "WiSE-FT", "sweep-alpha": "WiSE-FT", "pruning": "pruning", "sweep-pruning": "pruning",
              "density": "DARE/TIES", "sweep-density": "DARE/TIES", "hma": "HMA", "sweep-hma": "HMA",
              "lines": "LiNeS", "sweep-lines": "LiNeS", "rank": "TSV rank", "sweep-rank": "TSV rank",
              "iso": "Iso-C", "sweep-iso": "Iso-C"}
# the setting written on each marker of the trade-off ("α 0.3"): no hovering needed to read a curve
POINT_LABELS = {"alpha": "α", "ratio": "ratio", "density": "density", "mean_alpha": "mean α"}
SETTING_NAMES = {"alphas": "α", "ratios": "ratios", "drops": "drop", "keeps": "keep", "max_task": "pairs per task",
                 "max_general": "general blocks", "scores": "scores", "methods": "methods", "seed": "seed",
                 "grid": "α tuples", "measure": "measure", "device": "device"}


def _hover(p: SweepPoint, task, measure: str, general_measure: str = "general_loss") -> str:
    name = measure if is_benchmark(measure) else MEASURES[measure][0]
    general = (f"<br>{general_measure} {p.generality(general_measure):.4f}" if general_measure != "general_loss"
               else "")
    return (f"{p.series}<br>{json.dumps(p.settings)}<br>{name} {p.speciality(task, measure):.3f}"
            f"{general}<br>general loss {p.general_loss:.4f}<br>D(θ, θ0) {p.distance:.4f}")


def speciality_label(task: str | None, measure: str) -> str:
    """Axis text of the speciality measure, with its unit and direction: "math exact match ↑", "mean answer
    loss (nats) ↓"; a benchmark metric by its name: "zoo_math/acc ↑" (it names its own task)."""
    if is_benchmark(check_measure(measure)):
        return f"{measure} {'↑' if higher_is_better(measure) else '↓'}"
    return f"{task or 'mean'} {axis_title(measure)}"


def general_label(general_measure: str) -> str:
    """Axis text of the generality measure: "general loss (nats) ↓" or a benchmark metric
    "zoo_wiki_cloze/acc ↑"."""
    if check_general_measure(general_measure) == "general_loss":
        return axis_title("general_loss")
    return f"{general_measure} {'↑' if higher_is_better(general_measure) else '↓'}"


TRADEOFF = "speciality vs generality, every setting"
CURVES = "speciality, general loss and distance along the setting"
"""What the trade-off and the curves show, for their titles (`sweep_title`) where no page heads them (Runs)."""

GENERAL_AXIS = "general loss on held-out text (nats, ↓ better)"
"""The x axis of the speciality-vs-generality charts when generality is the held-out general loss."""


_SAME_FOR_ALL = ("created", "versions", "pool", "pool_name", "sweep", "model", "task", "kind")


def sweep_labels(results: Sequence[SweepResult], ids: Sequence[str] | None = None) -> list[str]:
    """A short name per sweep that tells compared sweeps apart: what differs between them among kind, model,
    task and the recipe's settings (e.g. "ft0", "pruning · ft1", "max_task=8"); where that is not enough,
    the sweep's id from `ids` (e.g. its run id) or its number (`plots.tell_apart`). One sweep alone gets an
    empty name."""
    results = list(results)
    keys = sorted({k for r in results for k in r.recipe} - set(_SAME_FOR_ALL))
    items = [{"kind": KIND_NAMES.get(r.kind, r.kind), "model": r.model, "task": r.task or "mean",
              **{f"recipe:{k}": r.recipe.get(k) for k in keys}} for r in results]
    names = {"kind": None, "model": None, "task": None,
             **{f"recipe:{k}": SETTING_NAMES.get(k, k.replace("_", " ")) for k in keys}}
    return tell_apart(items, names, ids)


def _series(results: Sequence[SweepResult], ids: Sequence[str] | None):
    """(result, series, legend name, colour) per series of every sweep; colours from `color_map` on the
    names, except that a compared sweep of one series is coloured by its own label (e.g. its model's colour)."""
    rows = []
    for res, label in zip(results, sweep_labels(results, ids)):
        for series in res.series:
            name = f"{label} · {series_name(series)}" if label else series_name(series)
            key = f"{label} · {series}" if label else series      # colours: by the raw names (stable)
            rows.append((res, series, name, label if label and len(res.series) == 1 else key))
    colors = color_map([key for *_, key in rows])
    return [(res, series, name, colors[key]) for res, series, name, key in rows]


def curves_figure(results: SweepResult | Sequence[SweepResult], ids: Sequence[str] | None = None, *,
                  title: str = "") -> go.Figure:
    """Three panels against the swept setting, one line per series (of every sweep given, named by
    `sweep_labels`): speciality (the sweep's task in its measure: exact match ↑ or answer loss ↓), held-out
    general loss (nats ↓) and D(θ, θ0); `title` above them (none by default: the page heads it)."""
    results = [results] if isinstance(results, SweepResult) else list(results)
    first = results[0] if results else SweepResult("alpha", "", None, "alpha")
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09, subplot_titles=(
        speciality_label(first.task, first.measure), general_label(first.general_measure), "D(θ, θ0)"))
    for res, series, name, color in _series(results, ids):
        pts = sorted((p for p in res.points if p.series == series), key=lambda p: p.x)
        xs = [p.x for p in pts]
        hover = [_hover(p, res.task, res.measure, res.general_measure) for p in pts]
        for col, ys in enumerate(([p.speciality(res.task, res.measure) for p in pts],
                                  [p.generality(res.general_measure) for p in pts],
                                  [p.distance for p in pts]), start=1):
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=name, legendgroup=name,
                                     showlegend=col == 1, line=dict(color=color), hovertext=hover,
                                     hoverinfo="text"), row=1, col=col)
    # one x-axis title under the middle panel (three copies of a long title overlapped at 1000 px)
    fig.update_xaxes(title_text=AXIS_LABELS.get(first.x_name, first.x_name), row=1, col=2)
    fig.update_annotations(font_size=13)
    fig.update_layout(margin=dict(t=80 if title else 40, b=10, l=50, r=10), legend_title_text=None,
                      height=440 if title else 400, title=title or None,
                      legend=dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0))
    return fig


def sweep_title(results: SweepResult | Sequence[SweepResult], what: str) -> str:
    """A chart's title naming what it shows of which sweeps: "WiSE-FT sweep of math: speciality vs generality";
    several sweeps of one kind or model say so once ("sweeps of math: …")."""
    results = [results] if isinstance(results, SweepResult) else list(results)
    kinds = list(dict.fromkeys(KIND_NAMES.get(r.kind, r.kind) for r in results))
    models = list(dict.fromkeys(r.model for r in results))
    head = f"{kinds[0]} sweep" if len(kinds) == 1 else "sweeps"
    head = f"{head}{'s' if len(results) > 1 and len(kinds) == 1 else ''} of {', '.join(models)}"
    return f"{head}: {what}"


def point_label(x_name: str, x: float) -> str:
    """The text on a trade-off marker: "α 0.3", "ratio 0.9", "density 0.2"; another setting by its name."""
    return f"{POINT_LABELS.get(x_name, x_name)} {x:g}"


def tradeoff_figure(results: SweepResult | Sequence[SweepResult], *, task: str | None = None,
                    measure: str | None = None, show_front: bool = True,
                    ids: Sequence[str] | None = None, general_measure: str | None = None,
                    title: str = "") -> go.Figure:
    """Speciality (y: exact match ↑ or answer loss ↓, `measure`, default the first sweep's) against held-out
    general loss (↓, x) for every point of every series of the given sweeps (compared sweeps named by
    `sweep_labels`, with `ids` telling identical settings apart), each marker labelled with its setting
    (`point_label`: "α 0.3") where the label would not cover another's (`plots.spaced_labels`: each curve's
    ends first; hovering names every point); the Pareto front over all of them is drawn
    as a dashed step line and its points ringed; `title` above (none by default: the page heads it)."""
    results = [results] if isinstance(results, SweepResult) else list(results)
    task = task if task is not None else (results[0].task if results else None)
    measure = check_measure(measure or (results[0].measure if results else "exact_match"))
    sign = 1.0 if higher_is_better(measure) else -1.0
    general = check_general_measure(general_measure or (results[0].general_measure if results else "general_loss"))
    gsign = -1.0 if higher_is_better(general) else 1.0       # the mask wants a loss (lower is better)
    fig = go.Figure()
    everything: list[SweepPoint] = []
    drawn = []
    for res, series, name, color in _series(results, ids):
        pts = sorted((p for p in res.points if p.series == series), key=lambda p: p.x)
        ends = [len(everything), len(everything) + len(pts) - 1] if pts else []
        everything.extend(pts)
        drawn.append((res, name, color, pts, ends))
    # the setting beside each point, except where it would cover another point's (close α points piled up)
    texts = spaced_labels([point_label(res.x_name, p.x) for res, _, _, pts, _ in drawn for p in pts],
                          [p.generality(general) for p in everything],
                          [p.speciality(task, measure) for p in everything],
                          first=[i for *_, ends in drawn for i in ends])
    start = 0
    for res, name, color, pts, _ in drawn:
        fig.add_trace(go.Scatter(
            x=[p.generality(general) for p in pts], y=[p.speciality(task, measure) for p in pts],
            mode="lines+markers+text", name=name, line=dict(color=color, width=1), marker=dict(size=8),
            text=texts[start:start + len(pts)], textposition="top left",
            textfont=dict(size=10, color=color), hovertext=[_hover(p, task, measure, general) for p in pts],
            hoverinfo="text"))
        start += len(pts)
    if show_front and everything:
        flags = pareto_mask([sign * p.speciality(task, measure) for p in everything],
                            [gsign * p.generality(general) for p in everything])
        front = sorted((p for p, f in zip(everything, flags) if f), key=lambda p: p.generality(general))
        if front:
            fig.add_trace(go.Scatter(
                x=[p.generality(general) for p in front], y=[p.speciality(task, measure) for p in front],
                mode="lines+markers",
                name="Pareto front", line=dict(color="black", dash="dash", shape="hv"),
                marker=dict(size=14, symbol="circle-open", color="black"), hoverinfo="skip"))
    fig.update_layout(xaxis_title=GENERAL_AXIS if general == "general_loss" else
                      f"generality: {general_label(general)}",
                      yaxis_title=f"speciality: {speciality_label(task, measure)}",
                      margin=dict(t=50 if title else 20, b=10, l=60, r=10), legend_title_text=None, height=440,
                      title=title or None,
                      legend=dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0))
    return fig
