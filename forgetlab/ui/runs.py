"""Reopen and compare saved runs: generic figures from a run's results table, labels, downloads.

Every run saved by `forgetlab.core.workspace.save_run` has a recipe and (for tabular results) a results.csv.
A kind may register its own reopener (`register_reopener(kind, fn)`, fn(SavedRun) -> list[go.Figure]);
otherwise the figures are drawn from the table by shape:

- a numeric sweep column (alpha, ratio, keep, density, step, …) → one line chart per metric, a line per
  series (model / method / task / … column), coloured with `forgetlab.plots.color_for`;
- `layer` + `module` (or `level`) columns → a heatmap of the first metric;
- otherwise → a dot per row label of each metric (`dot_figure`: runs side by side, each value written with its
  difference to the first run, the value axis zoomed on the values rather than from 0).
An analysis' runs are redrawn by the analysis itself (`Analysis.figures` / `compare`, in the session's measure
where it draws one: fine-tunes). Comparing runs of a kind with a comparison (its analysis' or a registered one:
sweeps, fine-tunes) draws its page's own charts with one named series per run; other kinds stack their tables
with a `run` column and draw the generic figures with a line per run. Runs are named by what they are and what
sets them apart (`run_name`, `run_labels`: model and settings; the time only where those are the same), and
every chart shown here carries a title (`titled`), since the page's own headings do not come along.
"""
from __future__ import annotations

import inspect
import time
from typing import Callable

import pandas as pd
import plotly.graph_objects as go

from forgetlab.analysis.base import analysis_for_kind
from forgetlab.core.benchmarks import BenchmarkTable
from forgetlab.core.evaluate import Scorecard, scorecards_takeaway
from forgetlab.plots import axis_title, color_for, tell_apart, value_range
from forgetlab.plots.models import benchmark_bars, scorecards_figure

SWEEP_COLUMNS = ("alpha", "ratio", "keep", "density", "drop", "lam", "gamma", "step", "steps", "epoch", "x",
                 "point", "budget")
SERIES_COLUMNS = ("run", "model", "method", "task", "series", "curve", "variant", "optimizer", "level", "name",
                  "metric_name")
ID_COLUMNS = ("seed", "index", "Unnamed: 0")
SAME_FOR_ALL = ("kind", "created", "versions", "pool", "pool_name", "memory", "analysis", "evaluated")
"""Recipe entries that never tell two runs apart for a reader (when, where, with which versions)."""
MAX_FIGURES = 6

_REOPENERS: dict[str, Callable] = {}
_COMPARERS: dict[str, Callable] = {}


def register_reopener(kind: str, fn: Callable, compare: Callable | None = None) -> None:
    """Redraw runs of `kind` with their page's own charts on the Runs page.

    `fn(run) -> list[go.Figure]` reopens one run; `compare(runs) -> list[go.Figure]` (optional) draws several
    runs of the kind together. Either may take a second argument, `measure` (the session's speciality measure:
    "exact_match" or "answer_loss"). A kind ending in "*" matches every kind with that prefix ("sweep-*").
    """
    _REOPENERS[kind] = fn
    if compare is not None:
        _COMPARERS[kind] = compare


def _lookup(table: dict[str, Callable], kind: str) -> Callable | None:
    if kind in table:
        return table[kind]
    return next((fn for k, fn in table.items() if k.endswith("*") and kind.startswith(k[:-1])), None)


# -- the areas' own charts, imported lazily so that the Runs page works whatever areas are installed


def _scorecards(run, measure="exact_match"):
    cards = [Scorecard.from_dict(c) for c in run.results["cards"]]
    return [scorecards_figure(cards, measure or "exact_match", title="scorecards: forgetting and speciality")]


def _benchmarks(run):
    return [benchmark_bars(BenchmarkTable.from_dict(run.results))]


register_reopener("benchmarks", _benchmarks)
register_reopener("scorecards", _scorecards)


def _call(fn: Callable, arg, measure: str | None):
    """fn(arg, measure) when fn takes a measure, else fn(arg)."""
    try:
        takes = len(inspect.signature(fn).parameters) >= 2
    except (TypeError, ValueError):
        takes = False
    return fn(arg, measure) if takes and measure is not None else fn(arg)


def run_stamp(run) -> str:
    """When a run was made, as a reader tells two runs of the same settings apart: "12-06 09:18:44"."""
    return time.strftime("%m-%d %H:%M:%S", time.localtime(run.created))


def _subject(recipe: dict) -> tuple[str, tuple[str, ...]]:
    """What a run was run on, in words, and the recipe entries that says."""
    r = recipe
    if r.get("start") is not None and r.get("task") is not None:
        return f"{r['start']} → {r['task']}", ("start", "task")
    if r.get("model") is not None:
        return str(r["model"]) + (f" vs {r['against']}" if r.get("against") else ""), ("model", "against")
    if isinstance(r.get("models"), list):
        models = [str(m) for m in r["models"]]
        return (", ".join(models) if len(models) <= 4 else f"{len(models)} models"), ("models",)
    key = "search" if r.get("search") else "method"
    return str(r.get(key) or ""), (key,)


def run_name(run) -> str:
    """What a run is, in words, without its time: its analysis' title (else its kind) and what it was run on —
    "WiSE-FT α / SLERP t curve · math", "text diff · math vs base", "fine-tune · base → math"."""
    analysis = analysis_for_kind(run.kind)
    title = analysis.title if analysis is not None else str(run.kind).replace("_", " ").replace("-", " ")
    subject = _subject(run.recipe)[0]
    return f"{title} · {subject}" if subject else title


def run_label(run) -> str:
    """A run as the Runs page lists it: `run_name` and `run_stamp`, e.g. "text diff · math vs base (12-06
    09:18:44)"."""
    return f"{run_name(run)} ({run_stamp(run)})"


def run_labels(runs) -> list[str]:
    """A legend name per run that tells compared runs apart by what differs between them (`plots.tell_apart`:
    the kind where they are of several, the model, then the recipe's settings, e.g. "math", "max general 32"); the time a run was made only where
    the settings are the same (and its id where that is the same too). One run alone gets its `run_name`."""
    runs = list(runs)
    if len(runs) < 2:
        return [run_name(r) for r in runs]
    items = [{"name": run_name(r) if len({x.kind for x in runs}) > 1 else _subject(r.recipe)[0],
              **{k: v for k, v in r.recipe.items() if k not in SAME_FOR_ALL + _subject(r.recipe)[1]}} for r in runs]
    stamps = [run_stamp(r) for r in runs]
    if len(set(stamps)) < len(stamps):          # made within one second (a script): the id tells them apart
        stamps = [f"{s} ({r.id[-6:]})" for s, r in zip(stamps, runs)]
    return tell_apart(items, names={"name": None}, ids=stamps)


def _numeric(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c]) and c not in ID_COLUMNS]


def sweep_column(frame: pd.DataFrame) -> str | None:
    """The column along which the run swept (first of SWEEP_COLUMNS that is numeric), or None."""
    numeric = set(_numeric(frame))
    return next((c for c in SWEEP_COLUMNS if c in numeric), None)


def series_columns(frame: pd.DataFrame) -> list[str]:
    """Categorical columns that name a series (model, method, task…), in SERIES_COLUMNS order."""
    return [c for c in SERIES_COLUMNS if c in frame.columns and not pd.api.types.is_numeric_dtype(frame[c])]


def metric_columns(frame: pd.DataFrame) -> list[str]:
    """Numeric columns that are measurements (not the sweep axis, a layer index or an id)."""
    skip = {sweep_column(frame), "layer", "head"}
    return [c for c in _numeric(frame) if c not in skip]


def _series_names(frame: pd.DataFrame, cols: list[str]) -> pd.Series:
    if not cols:
        return pd.Series(["all"] * len(frame), index=frame.index)
    return frame[cols].astype(str).agg(" · ".join, axis=1)


def figures_from_frame(frame: pd.DataFrame, title: str = "") -> list[go.Figure]:
    """Generic figures for a results table (see the module docstring for the rules), titled and with axis
    titles as a person writes them, units included (`plots.axis_title`: "general loss (nats) ↓")."""
    if frame is None or frame.empty:
        return []
    metrics = metric_columns(frame)[:MAX_FIGURES]
    if not metrics:
        return []
    head = f"{title}: " if title else ""
    x = sweep_column(frame)
    series_cols = series_columns(frame)
    names = _series_names(frame, series_cols)
    figs = []
    if x is not None:
        for m in metrics:
            fig = go.Figure()
            for name in dict.fromkeys(names):
                part = frame[names == name].sort_values(x)
                colour_key = name.split(" · ")[0]
                fig.add_trace(go.Scatter(x=part[x], y=part[m], mode="lines+markers", name=name,
                                         line={"color": color_for(colour_key)},
                                         marker={"color": color_for(colour_key)}))
            fig.update_layout(title=f"{head}{axis_title(m)} along {axis_title(x)}", xaxis_title=axis_title(x),
                              yaxis_title=axis_title(m), height=360, margin={"t": 50, "b": 40, "l": 50, "r": 10})
            figs.append(fig)
        return figs
    level_col = "module" if "module" in frame.columns else ("level" if "level" in frame.columns else None)
    if "layer" in frame.columns and level_col is not None and "run" not in frame.columns:
        m = metrics[0]
        table = frame.pivot_table(index="layer", columns=level_col, values=m, aggfunc="mean")
        fig = go.Figure(go.Heatmap(z=table.values, x=[str(c) for c in table.columns],
                                   y=[str(i) for i in table.index], colorscale="Viridis",
                                   colorbar={"title": axis_title(m)}))
        fig.update_layout(title=f"{head}{axis_title(m)} per layer × {level_col}", xaxis_title=level_col,
                          yaxis_title="layer", height=420, margin={"t": 50, "b": 40, "l": 50, "r": 10})
        return [fig]
    row_cols = [c for c in series_cols if c != "run"] or [c for c in frame.columns if c not in metrics][:1]
    rows = _series_names(frame, row_cols) if row_cols else pd.Series(frame.index.astype(str), index=frame.index)
    return [dot_figure(frame, m, rows, title=f"{head}{axis_title(m)}") for m in metrics]


def dot_figure(frame: pd.DataFrame, metric: str, rows: pd.Series, title: str = "") -> go.Figure:
    """One metric of a table as dots, one per row (`rows`: its label) — and per run, side by side in the run's
    colour with the run's name in the legend, when the table stacks runs (a `run` column). The first run's dots
    are written with their values, the other runs' with their difference to the first run's (above and below
    in turn, so that neighbouring labels never meet); the value axis spans the
    values with a margin (`plots.value_range`), not from 0, so that 4.68 against 4.74 is a visible gap (bars
    from 0 made it two equal bars)."""
    runs = frame["run"].astype(str) if "run" in frame.columns else None
    groups = list(dict.fromkeys(runs)) if runs is not None else [""]
    first = {r: v for r, v in zip(rows[runs == groups[0]], frame.loc[runs == groups[0], metric])} \
        if runs is not None else {}
    fig = go.Figure()
    for g in groups:
        sel = runs == g if runs is not None else pd.Series(True, index=frame.index)
        values = [float(v) for v in frame.loc[sel, metric]]
        labels = list(rows[sel])
        text = [f"{v:.4g}" if g == groups[0] or lab not in first else f"{v - float(first[lab]):+.3g}"
                for v, lab in zip(values, labels)]
        position = "bottom center" if groups.index(g) % 2 else "top center"     # neighbours' labels never meet
        colours = color_for(g) if runs is not None else [color_for(lab) for lab in labels]
        fig.add_trace(go.Scatter(x=labels, y=values, mode="markers+text", name=g or metric, text=text,
                                 textposition=position, cliponaxis=False,
                                 marker={"color": colours, "size": 12, "line": {"width": 1, "color": "white"}},
                                 hovertemplate=f"{g + '<br>' if g else ''}%{{x}}: %{{y:.6g}}<extra></extra>"))
    note = f"the first run's values, then each other run's difference to them (first: {groups[0]})" \
        if runs is not None and len(groups) > 1 else ""
    fig.update_layout(title={"text": title, "subtitle": {"text": note}} if note else title, scattermode="group",
                      yaxis={"title": axis_title(metric), "range": value_range(frame[metric], margin=0.25)},
                      height=380 if note else 360, showlegend=runs is not None,
                      legend={"orientation": "h", "yanchor": "top", "y": -0.15, "xanchor": "left", "x": 0},
                      margin={"t": 80 if note else 50, "b": 40, "l": 60, "r": 10})
    return fig


def titled(figs: list[go.Figure], name: str) -> list[go.Figure]:
    """`figs` with a title on every figure that has none (a page heads its charts with its own words; reopened
    on the Runs page or downloaded they must name themselves): "<name>: <y axis> vs <x axis>" (or the panels'
    titles)."""
    for fig in figs:
        if fig.layout.title.text:
            continue
        y, x = fig.layout.yaxis.title.text, fig.layout.xaxis.title.text
        panels = [a.text for a in fig.layout.annotations if a.text and a.yref == "paper" and a.y >= 1.0]
        single = not {"xaxis2", "yaxis2"} & set(fig.layout.to_plotly_json())     # one panel, one value axis
        what = ", ".join(panels) if panels else (f"{y} vs {x}" if single and y and x else "")
        fig.update_layout(title=f"{name}: {what}" if what else name)
        fig.update_layout(margin={"t": max(fig.layout.margin.t or 0, 60)})
    return figs


def run_takeaway(run) -> list[str]:
    """What a saved run means, in the sentences its action ended with: its analysis' takeaway, or for a set of
    scorecards (the Models page's Evaluate) `scorecards_takeaway`; [] for another kind or a run that cannot be
    read (its charts and table say the rest)."""
    analysis = analysis_for_kind(run.kind)
    try:
        if analysis is not None:
            return analysis.takeaway(analysis.load(run.path))
        if run.kind == "scorecards":
            return scorecards_takeaway([Scorecard.from_dict(c) for c in run.results["cards"]])
    except Exception:  # noqa: BLE001 - an old or foreign run: no sentence rather than an error box
        return []
    return []


def run_figures(run, measure: str | None = None) -> list[go.Figure]:
    """The charts of one saved run (speciality in `measure` where the kind shows it): its analysis' figures,
    else its kind's registered reopener, else (or if that fails on an old or foreign run) `figures_from_frame`
    of its results table."""
    return titled(_run_figures(run, measure), run_name(run))


def _run_figures(run, measure: str | None) -> list[go.Figure]:
    analysis = analysis_for_kind(run.kind)
    if analysis is not None and analysis.figures_fn is not None:
        try:
            return analysis.figures(analysis.load(run.path), measure)
        except Exception:  # noqa: BLE001 - fall back to the generic charts of the saved table
            return figures_from_frame(run.frame(), title=run_name(run))
    fn = _lookup(_REOPENERS, run.kind)
    if fn is not None:
        try:
            return list(_call(fn, run, measure))
        except Exception:  # noqa: BLE001 - fall back to the generic charts of the saved table
            pass
    return figures_from_frame(run.frame(), title=run_name(run))


def compare_frame(runs) -> pd.DataFrame:
    """The results tables of several runs stacked, with a `run` column naming each run by what sets it apart
    from the others (`run_labels`)."""
    parts = []
    runs = list(runs)
    for run, label in zip(runs, run_labels(runs)):
        frame = run.frame()
        if frame is not None and not frame.empty:
            parts.append(frame.assign(run=label))
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    return out[["run", *[c for c in out.columns if c != "run"]]]


def compare_figures(runs, measure: str | None = None) -> list[go.Figure]:
    """Runs of one kind on shared charts: the kind's own comparison, drawn by its page's plotting functions
    (e.g. every sweep on one trade-off chart) when it has one, else the generic figures with one line (or
    bar group) per run."""
    kinds = {r.kind for r in runs}
    if len(kinds) != 1:
        return []
    kind = next(iter(kinds))
    analysis = analysis_for_kind(kind)
    title = f"{analysis.title if analysis is not None else kind}, {len(runs)} runs"
    if analysis is not None and analysis.compare_fn is not None:
        try:
            return titled(analysis.compare([analysis.load(r.path) for r in runs], [run_stamp(r) for r in runs],
                                           measure), title)
        except Exception:  # noqa: BLE001 - the generic comparison still works from the tables
            return figures_from_frame(compare_frame(runs), title=title)
    fn = _lookup(_COMPARERS, kind)
    if fn is not None:
        try:
            return titled(list(_call(fn, runs, measure)), title)
        except Exception:  # noqa: BLE001 - the generic comparison still works from the tables
            pass
    return figures_from_frame(compare_frame(runs), title=title)


def figure_html(fig: go.Figure) -> str:
    """A standalone HTML file of the figure (plotly.js embedded, so it opens offline)."""
    return fig.to_html(include_plotlyjs=True, full_html=True)


def runs_table(runs) -> pd.DataFrame:
    """One row per run: id, kind, created (local time), the recipe's main settings, folder."""
    rows = []
    for run in runs:
        recipe = {k: v for k, v in run.recipe.items()
                  if k not in ("kind", "created", "versions", "pool", "evaluated") and v is not None
                  and not isinstance(v, (dict, list))}
        summary = " · ".join(f"{k.replace('_', ' ')} {v:g}" if isinstance(v, float) else f"{k.replace('_', ' ')} {v}"
                             for k, v in list(recipe.items())[:5])
        rows.append({"id": run.id, "kind": run.kind,
                     "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.created)),
                     "settings": summary, "folder": str(run.path)})
    return pd.DataFrame(rows, columns=["id", "kind", "created", "settings", "folder"])
