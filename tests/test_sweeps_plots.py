"""Figures of sweeps and fine-tunes: the Pareto-front trace holds exactly the non-dominated points."""
from __future__ import annotations

from forgetlab.evaluate import Scorecard, TaskScore
from forgetlab.plots import color_for
from forgetlab.plots.forgetting import curves_figure, tradeoff_figure
from forgetlab.sweeps import SweepPoint, SweepResult


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
    assert [t.name for t in fig.data] == ["fapm", "magnitude", "Pareto front"]
    assert fig.data[0].line.color == color_for("fapm")
    curves = curves_figure(res)
    assert len(curves.data) == 6      # 2 series × 3 panels
    assert list(curves.data[0].y) == [0.9, 0.8, 0.1]
