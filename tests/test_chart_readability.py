"""Charts a reader gets right (issue 43, item 5): point labels that do not pile up, axes with their units and
round ticks, lines on top of each other told apart, comparison axes that show the gap between close values,
labels clear of reference lines, legends and titles in words, and tables without "None"."""
from __future__ import annotations

import math

import pandas as pd

from forgetlab.analysis.retention import merge_retention
from forgetlab.analysis.sweep_results import SweepPoint, SweepResult
from forgetlab.analysis.textdiff_results import TextDiffResult
from forgetlab.core.evaluate import Scorecard, TaskScore
from forgetlab.plots import axis_title, spaced_labels, tell_apart, value_range
from forgetlab.plots.forgetting import curves_figure, tradeoff_figure
from forgetlab.plots.merge import label_positions, retention_figure
from forgetlab.plots.textdiff import lens_figure
from forgetlab.ui.runs import dot_figure


def _point(alpha, em, loss):
    return SweepPoint("wise-ft", alpha, {"alpha": alpha},
                      Scorecard("m", loss, 2.0, 10, {"math": TaskScore("math", em, 1.0, 4)}), distance=alpha)


def _clashes(texts, xs, ys, char_width=0.009, height=0.08):
    """Pairs of written labels whose points are closer than a label (the rule `spaced_labels` keeps)."""
    sx, sy = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    kept = [i for i, t in enumerate(texts) if t]
    return [(i, j) for i in kept for j in kept if i < j
            and abs(xs[i] - xs[j]) / sx < char_width * (max(len(texts[i]), len(texts[j])) + 1)
            and abs(ys[i] - ys[j]) / sy < height]


def test_close_alpha_points_do_not_write_their_labels_over_each_other():
    # the demo's WiSE-FT curve: the first points barely move the general loss, the last ones a lot
    alphas = [i / 10 for i in range(11)]
    losses = [5.7044, 5.7063, 5.7116, 5.7194, 5.7290, 5.7401, 5.7538, 5.7708, 5.7945, 5.8323, 5.8971]
    fig = tradeoff_figure(SweepResult("alpha", "math", "math", "alpha",
                                      [_point(a, 0.0, g) for a, g in zip(alphas, losses)]))
    curve = fig.data[0]
    texts = list(curve.text)
    assert _clashes(texts, list(curve.x), list(curve.y)) == []
    assert texts[0] == "α 0" and texts[-1] == "α 1"               # the ends are always named
    assert texts[1] == "" and texts[2] == ""                       # 0.1 and 0.2 sat on α 0
    assert sum(bool(t) for t in texts) >= 7                        # the spread-out points keep theirs
    assert all(f"{a:g}" in h for a, h in zip(alphas, curve.hovertext))   # hovering still names every point


def test_spaced_labels_keep_far_points_and_drop_the_ones_that_would_overlap():
    assert spaced_labels(["a", "b", "c"], [0.0, 0.001, 1.0], [0.0, 0.0, 0.0]) == ["a", "", "c"]
    assert spaced_labels(["a", "b", "c"], [0.0, 0.001, 1.0], [0.0, 1.0, 0.0]) == ["a", "b", "c"]   # apart in y
    assert spaced_labels(["a", "b", "c"], [0.0, 0.001, 1.0], [0.0] * 3, first=[1]) == ["", "b", "c"]   # priority
    assert spaced_labels(["a", "b"], [math.nan, 1.0], [0.0, 0.0]) == ["", "b"]


def test_loss_axes_say_their_unit():
    res = SweepResult("alpha", "math", "math", "alpha", [_point(a, a, 5.0 + a) for a in (0.0, 0.5, 1.0)])
    assert "nats" in tradeoff_figure(res).layout.xaxis.title.text
    assert "general loss (nats) ↓" in [a.text for a in curves_figure(res).layout.annotations]
    res.measure = "answer_loss"
    assert tradeoff_figure(res).layout.yaxis.title.text == "speciality: math answer loss (nats) ↓"
    assert axis_title("general_loss") == "general loss (nats) ↓" and axis_title("exact_match") == "exact match ↑"
    assert axis_title("math/answer_loss") == "math answer loss (nats) ↓"
    assert axis_title("forgetting") == "forgetting (nats) ↓"        # a unit already in the name is not repeated
    from forgetlab.plots.attribution import LABELS
    assert all("nats" in LABELS[k] for k in ("d_general_loss", "d_answer_loss"))


def _lens(rows):
    return TextDiffResult(model="math", against="base", source="heldout", tokens=pd.DataFrame(), docs=[], lens=rows)


def test_logit_lens_axes_pick_their_own_round_ticks_and_tick_whole_layers():
    rows = [{"depth": d, "loss_base": 7.0 - d, "loss_model": 7.01 - d, "rise": 0.0096 + 0.0101 * d, "tokens": 9}
            for d in range(4)]
    fig = lens_figure(_lens(rows))
    # an overlaying right axis copies the left one's grid unless told otherwise: ticks at 0.0096 / 0.0197 / …
    assert fig.layout.yaxis2.tickmode == "auto" and fig.layout.yaxis.tickmode == "auto"
    assert fig.layout.yaxis2.rangemode == "tozero"
    assert fig.layout.xaxis.dtick == 1                              # depths are whole layers, not 0.5
    assert "nats" in fig.layout.yaxis.title.text and "nats" in fig.layout.yaxis2.title.text


def test_logit_lens_lines_on_top_of_each_other_are_told_apart_and_said_so():
    same = [{"depth": d, "loss_base": 7.0 - d, "loss_model": 7.001 - d, "rise": 0.001, "tokens": 9}
            for d in range(4)]
    base, model = [t for t in lens_figure(_lens(same)).data if t.type == "scatter"]
    assert base.line.dash != model.line.dash and base.marker.symbol != model.marker.symbol
    assert base.name == "base" and "on top of base" in model.name and "0.001 nats" in model.name
    apart = [{**r, "loss_model": r["loss_base"] + 0.5} for r in same]
    _, model = [t for t in lens_figure(_lens(apart)).data if t.type == "scatter"]
    assert model.name == "math"                                     # apart: no note


def test_value_range_shows_the_gap_between_close_values_and_keeps_zero_where_it_is_close():
    lo, hi = value_range([4.68, 4.74])
    assert 4.5 < lo < 4.68 and 4.74 < hi < 4.9                      # not from 0: the gap fills the axis
    assert (4.74 - 4.68) / (hi - lo) > 0.5
    assert value_range([0.1, 0.9])[0] == 0.0                       # near 0 relative to the spread: from 0
    assert value_range([-0.9, -0.1])[1] == 0.0
    assert value_range([3.0, 3.0])[0] < 3.0 < value_range([3.0, 3.0])[1]
    assert value_range([math.nan]) is None


def test_runs_compared_as_dots_named_by_their_settings_with_values_and_differences():
    frame = pd.DataFrame({"run": ["max general 32"] * 2 + ["max general 64"] * 2, "model": ["base", "math"] * 2,
                          "general_loss": [4.68, 4.74, 4.69, 4.76]})
    fig = dot_figure(frame, "general_loss", frame["model"], title="scorecards: general loss (nats) ↓")
    assert [t.name for t in fig.data] == ["max general 32", "max general 64"]
    assert list(fig.data[0].text) == ["4.68", "4.74"] and list(fig.data[1].text) == ["+0.01", "+0.02"]
    assert fig.data[0].textposition != fig.data[1].textposition        # side by side, labels above and below
    lo, hi = fig.layout.yaxis.range
    assert lo > 4.5 and lo < 4.68 and hi > 4.76                     # the data with a margin, not from 0
    assert fig.layout.yaxis.title.text == "general loss (nats) ↓" and fig.layout.scattermode == "group"
    assert "difference to them (first: max general 32)" in fig.layout.title.subtitle.text


def test_tell_apart_names_what_differs_and_falls_back_to_ids():
    items = [{"name": "text diff · math vs base", "max_general": 32},
             {"name": "text diff · math vs base", "max_general": 64}]
    assert tell_apart(items, names={"name": None}) == ["max general 32", "max general 64"]
    same = [{"name": "x", "seed": 0}, {"name": "x", "seed": 0}]
    assert tell_apart(same, ids=["09:18", "09:20"]) == ["09:18", "09:20"]
    assert tell_apart([{"a": 1}]) == [""]


def _card(name, loss, em):
    return Scorecard(name, loss, 2.0 ** loss, 100, {t: TaskScore(t, v, 2.0 - v, 4) for t, v in em.items()})


CARDS = [_card("base", 4.70, {"math": 0.0, "code": 0.1}), _card("math", 4.74, {"math": 0.9, "code": 0.1}),
         _card("code", 4.75, {"math": 0.0, "code": 0.9}), _card("avg", 4.71, {"math": 0.88, "code": 0.5}),
         _card("ties", 4.72, {"math": 0.92, "code": 0.86})]


def test_retention_labels_sit_inside_the_bars_clear_of_the_dashed_parent_line():
    res = merge_retention(CARDS, ["avg", "ties"], {"math": "math", "code": "code"})
    fig = retention_figure(res)
    line = fig.layout.shapes[0]
    assert line.y0 == 100 and line.line.dash == "dash" and line.layer == "below"
    for trace in fig.data[:2]:
        for y, where in zip(trace.y, trace.textposition):
            # a label written above a bar near 100 % is what the line struck through
            assert where == "inside" or y < 60, (trace.name, y, where)
        assert trace.insidetextanchor == "middle"
    assert label_positions([100.0, 97.0, 3.0]) == ["inside", "inside", "outside"]


def test_merge_table_parent_rows_hold_their_own_shares_not_empty_cells():
    from forgetlab.ui.merge_compare import judge_frame

    class Pool:
        task_names = ["math", "code"]

    frame = judge_frame(Pool(), CARDS, ["avg", "ties"], "exact_match")
    assert not frame.isna().any().any()                             # nothing the app would show as "None"
    parents = frame[frame["role"] == "parent"].set_index("model")
    assert parents.loc["math", "math kept %"] == 100.0 and parents.loc["code", "code kept %"] == 100.0
    assert parents.loc["math", "code kept %"] == 0.0           # math's model has none of code's gain
    assert parents.loc["math", "mean kept %"] == 50.0          # the mark a merge must beat
    merges = frame[frame["role"] == "merge"].set_index("model")
    assert round(merges.loc["ties", "math kept %"], 3) == round(100 * 0.92 / 0.9, 3)


def test_untitled_charts_get_the_run_name_and_what_a_single_panel_shows():
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from forgetlab.ui.runs import titled

    one = go.Figure(go.Scatter(x=[1], y=[2])).update_layout(xaxis_title="training step", yaxis_title="loss (nats)")
    two = make_subplots(rows=1, cols=2).update_yaxes(title_text="Δ general loss", row=1, col=1)
    kept = go.Figure().update_layout(title="logit lens")
    titled([one, two, kept], "fine-tune · base → math")
    assert one.layout.title.text == "fine-tune · base → math: loss (nats) vs training step"
    assert two.layout.title.text == "fine-tune · base → math"          # several panels: their axes say it
    assert kept.layout.title.text == "logit lens"                      # a chart's own title stays


def test_tables_drop_blank_columns_and_show_the_charts_measure_only():
    from forgetlab.ui.tables import filled, measure_view, styled

    frame = pd.DataFrame({"name": ["a", "b"], "notes": ["", None], "score": [float("nan"), 1.0],
                          "math kept %": [97.22222, 33.3333]})
    assert list(filled(frame).columns) == ["name", "score", "math kept %"]      # a column of blanks takes width
    assert styled(frame).to_html().count("97.2<") == 1                           # a share in %: one decimal
    cards = pd.concat([Scorecard(m, 4.7, 110.0, 10, {t: TaskScore(t, 0.5, 1.2, 4) for t in ("math", "code")}
                                 ).to_frame() for m in ("base", "math")], ignore_index=True)
    shown = measure_view(cards, "exact_match")
    assert list(shown.columns) == ["model", "general_loss", "perplexity", "math/exact_match", "code/exact_match"]
    assert "math/answer_loss" in measure_view(cards, "answer_loss").columns
    assert measure_view(cards, "zoo_math/acc").equals(cards)                    # a benchmark: every column


def test_compared_runs_are_named_by_what_differs_and_by_time_only_when_nothing_does(tmp_path, monkeypatch):
    from forgetlab.core import workspace as ws
    from forgetlab.ui.runs import run_label, run_labels, run_name

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    frame = pd.DataFrame({"model": ["base"], "general_loss": [4.7]})
    for i, (model, task) in enumerate([("math", "math"), ("math", "code"), ("math", "code")]):
        ws.save_run("textdiff", {"model": model, "against": "base", "task": task, "max_general": 32},
                    {"a": 1}, frame=frame, run_id=f"r{i}")
    runs = sorted(ws.list_runs(), key=lambda r: r.id)
    assert run_name(runs[0]) == "text diff · math vs base" and run_label(runs[0]).startswith(run_name(runs[0]))
    assert run_labels(runs[:2]) == ["task math", "task code"]       # the setting that differs, not a time stamp
    same = run_labels(runs[1:])
    assert len(set(same)) == 2 and all(":" in label for label in same)   # identical settings: when each was made
