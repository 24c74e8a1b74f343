"""Figures of sweeps and fine-tunes: the Pareto-front trace holds exactly the non-dominated points."""
from __future__ import annotations

from forgetlab.analysis.sweep_results import SweepPoint, SweepResult
from forgetlab.core.evaluate import Scorecard, TaskScore
from forgetlab.plots import color_for
from forgetlab.plots.forgetting import curves_figure, tradeoff_figure


def _point(series, x, spec, loss):
    card = Scorecard("m", loss, 2.0, 10, {"math": TaskScore("math", spec, 1.0, 4)})
    return SweepPoint(series, x, {"x": x}, card, distance=x)


def test_tradeoff_front_and_curves():
    res = SweepResult("pruning", "ft", "math", "ratio", [
        _point("fapm", 0.0, 0.9, 3.0), _point("fapm", 0.5, 0.8, 2.5), _point("fapm", 1.0, 0.1, 2.0),
        _point("magnitude", 0.5, 0.7, 2.8)])
    fig = tradeoff_figure(res)
    front = [t for t in fig.data if t.name == "Pareto front"][0]
    assert list(front.x) == [2.0, 2.5, 3.0] and list(front.y) == [0.1, 0.8, 0.9]
    assert [t.name for t in fig.data] == ["FAPM", "magnitude", "Pareto front"]      # names a person writes
    assert fig.data[0].line.color != fig.data[1].line.color
    assert fig.data[0].line.color == color_for("fapm")
    curves = curves_figure(res)
    assert len(curves.data) == 6      # 2 series × 3 panels
    assert list(curves.data[0].y) == [0.9, 0.8, 0.1]
    # one x-axis title, under the middle panel: three copies overlapped at 1000 px
    titles = [curves.layout[f"xaxis{i}"].title.text for i in ("", "2", "3")]
    assert titles == [None, "pruning ratio (share of τ zeroed)", None]


def _scored(series, x, em, answer_loss, general_loss):
    card = Scorecard("m", general_loss, 2.0, 10, {"math": TaskScore("math", em, answer_loss, 4)})
    return SweepPoint(series, x, {"x": x}, card, distance=x)


def test_answer_loss_measure_ranks_lower_loss_as_better():
    """Exact match 0 everywhere except one point: with exact match the front is (B, D); measured by answer
    loss (lower is better) it is (A, B): D has the worst answer loss, C is beaten by B on both axes."""
    import pytest

    from forgetlab.core.errors import ParameterError

    pts = [_scored("wise-ft", 0.0, 0.0, 1.0, 3.0), _scored("wise-ft", 0.3, 0.0, 2.0, 2.0),
           _scored("wise-ft", 0.6, 0.0, 2.5, 2.5), _scored("wise-ft", 1.0, 0.1, 3.0, 3.5)]
    res = SweepResult("alpha", "ft", "math", "alpha", pts)
    assert res.mark_pareto() == [False, True, False, True]
    res.measure = "answer_loss"
    assert res.mark_pareto() == [True, True, False, False]
    frame = res.to_frame()
    assert list(frame["speciality"]) == [1.0, 2.0, 2.5, 3.0] and set(frame["measure"]) == {"answer_loss"}
    fig = tradeoff_figure(res)
    front = [t for t in fig.data if t.name == "Pareto front"][0]
    assert list(front.x) == [2.0, 3.0] and list(front.y) == [2.0, 1.0]
    assert "answer loss (nats) ↓" in fig.layout.yaxis.title.text
    curves = curves_figure(res)
    assert list(curves.data[0].y) == [1.0, 2.0, 2.5, 3.0]
    assert curves.layout.annotations[0].text == "math answer loss (nats) ↓"
    # the measure is saved with the sweep, and an unknown one is refused with the choices
    assert SweepResult.from_dict(res.to_dict()).measure == "answer_loss"
    with pytest.raises(ParameterError, match="exact_match, answer_loss"):
        tradeoff_figure(res, measure="perplexity")
