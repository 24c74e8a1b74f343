"""Reopen and compare saved runs: generic figures from a run's results table, labels, downloads.

Every run saved by `forgetlab.core.workspace.save_run` has a recipe and (for tabular results) a results.csv.
A kind may register its own reopener (`register_reopener(kind, fn)`, fn(SavedRun) -> list[go.Figure]);
otherwise the figures are drawn from the table by shape:

- a numeric sweep column (alpha, ratio, keep, density, step, …) → one line chart per metric, a line per
  series (model / method / task / … column), coloured with `forgetlab.plots.color_for`;
- `layer` + `module` (or `level`) columns → a heatmap of the first metric;
- otherwise → grouped bars of each metric per row label.
An analysis' runs are redrawn by the analysis itself (`Analysis.figures` / `compare`, in the session's measure
where it draws one: fine-tunes). Comparing runs of a kind with a comparison (its analysis' or a registered one:
sweeps, fine-tunes) draws its page's own charts with one named series per run; other kinds stack their tables
with a `run` column and draw the generic figures with a line per run.
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
from forgetlab.plots import color_for
from forgetlab.plots.models import benchmark_bars, scorecards_figure

SWEEP_COLUMNS = ("alpha", "ratio", "keep", "density", "drop", "lam", "gamma", "step", "steps", "epoch", "x",
                 "point", "budget")
SERIES_COLUMNS = ("run", "model", "method", "task", "series", "curve", "variant", "optimizer", "level", "name",
                  "metric_name")
ID_COLUMNS = ("seed", "index", "Unnamed: 0")
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
    return [scorecards_figure(cards, measure or "exact_match")]


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


def run_label(run) -> str:
    """A short label for a run: its kind and creation time (plus the id suffix that makes it unique)."""
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(run.created))
    return f"{run.kind} {stamp} ({run.id[-6:]})"


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
    """Generic figures for a results table (see the module docstring for the rules)."""
    if frame is None or frame.empty:
        return []
    metrics = metric_columns(frame)[:MAX_FIGURES]
    if not metrics:
        return []
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
            fig.update_layout(title=f"{title} {m} vs {x}".strip(), xaxis_title=x, yaxis_title=m,
                              height=360, margin={"t": 50, "b": 40, "l": 50, "r": 10})
            figs.append(fig)
        return figs
    level_col = "module" if "module" in frame.columns else ("level" if "level" in frame.columns else None)
    if "layer" in frame.columns and level_col is not None and "run" not in frame.columns:
        m = metrics[0]
        table = frame.pivot_table(index="layer", columns=level_col, values=m, aggfunc="mean")
        fig = go.Figure(go.Heatmap(z=table.values, x=[str(c) for c in table.columns],
                                   y=[str(i) for i in table.index], colorscale="Viridis", colorbar={"title": m}))
        fig.update_layout(title=f"{title} {m} per layer × {level_col}".strip(), xaxis_title=level_col,
                          yaxis_title="layer", height=420, margin={"t": 50, "b": 40, "l": 50, "r": 10})
        return [fig]
    row_cols = [c for c in series_cols if c != "run"] or [c for c in frame.columns if c not in metrics][:1]
    rows = _series_names(frame, row_cols) if row_cols else pd.Series(frame.index.astype(str), index=frame.index)
    groups = frame["run"].astype(str) if "run" in frame.columns else pd.Series(["value"] * len(frame),
                                                                                index=frame.index)
    for m in metrics:
        fig = go.Figure()
        for g in dict.fromkeys(groups):
            sel = groups == g
            colours = [color_for(g if "run" in frame.columns else r) for r in rows[sel]]
            fig.add_trace(go.Bar(x=rows[sel], y=frame.loc[sel, m], name=g, marker={"color": colours}))
        fig.update_layout(title=f"{title} {m}".strip(), barmode="group", yaxis_title=m, height=360,
                          showlegend="run" in frame.columns, margin={"t": 50, "b": 40, "l": 50, "r": 10})
        figs.append(fig)
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
    analysis = analysis_for_kind(run.kind)
    if analysis is not None and analysis.figures_fn is not None:
        try:
            return analysis.figures(analysis.load(run.path), measure)
        except Exception:  # noqa: BLE001 - fall back to the generic charts of the saved table
            return figures_from_frame(run.frame(), title=run.kind)
    fn = _lookup(_REOPENERS, run.kind)
    if fn is not None:
        try:
            return list(_call(fn, run, measure))
        except Exception:  # noqa: BLE001 - fall back to the generic charts of the saved table
            pass
    return figures_from_frame(run.frame(), title=run.kind)


def compare_frame(runs) -> pd.DataFrame:
    """The results tables of several runs stacked, with a `run` column holding `run_label(run)`."""
    parts = []
    for run in runs:
        frame = run.frame()
        if frame is not None and not frame.empty:
            parts.append(frame.assign(run=run_label(run)))
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
    if analysis is not None and analysis.compare_fn is not None:
        try:
            return analysis.compare([analysis.load(r.path) for r in runs], [r.id[-6:] for r in runs], measure)
        except Exception:  # noqa: BLE001 - the generic comparison still works from the tables
            return figures_from_frame(compare_frame(runs), title=f"{kind}:")
    fn = _lookup(_COMPARERS, kind)
    if fn is not None:
        try:
            return list(_call(fn, runs, measure))
        except Exception:  # noqa: BLE001 - the generic comparison still works from the tables
            pass
    return figures_from_frame(compare_frame(runs), title=f"{kind}:")


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
