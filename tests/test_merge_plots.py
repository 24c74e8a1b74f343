"""Merge page figures: one bar group per model, distinct colours, values from the scorecards."""
from __future__ import annotations

from forgetlab.evaluate import Scorecard, TaskScore
from forgetlab.merge.workflow import cards_frame
from forgetlab.plots import color_map
from forgetlab.plots.merge import scorecard_figure


def _card(name, loss, em):
    return Scorecard(name, loss, 2.0 ** loss, 100, {t: TaskScore(t, v, 2.0 - v, 4) for t, v in em.items()})


def test_scorecard_figure_has_generality_and_speciality_bars():
    cards = [_card("base", 3.0, {"math": 0.0, "copy": 0.1}), _card("ft0", 3.5, {"math": 0.9, "copy": 0.1}),
             _card("m", 3.2, {"math": 0.7, "copy": 0.6})]
    frame = cards_frame(cards, merged=["m"])
    assert list(frame["role"]) == ["base", "parent", "merge"]
    assert frame["speciality"].round(3).tolist() == [0.05, 0.5, 0.65]
    fig = scorecard_figure(cards, merged=["m"])
    assert len(fig.data) == 6
    general = [t for t in fig.data if t.xaxis == "x"]
    assert [float(t.y[0]) for t in general] == [3.0, 3.5, 3.2]
    special = [t for t in fig.data if t.xaxis == "x2"]
    assert list(special[2].x) == ["math", "copy"] and list(special[2].y) == [0.7, 0.6]
    assert len({t.marker.color for t in general}) == 3
    assert [t.name for t in special] == ["base", "ft0", "m (merge)"]          # the merge is named and hatched
    assert special[2].marker.pattern.shape == "/" and not special[0].marker.pattern.shape
    assert fig.layout.yaxis.title.text == "general loss ↓" and fig.layout.yaxis2.title.text == "exact match ↑"
    loss = scorecard_figure(cards, "answer_loss", merged=["m"])                  # the other measure, own axis
    assert [list(t.y) for t in loss.data if t.xaxis == "x2"][2] == [1.3, 1.4]
    assert loss.layout.yaxis2.title.text == "answer loss ↓"


def test_colour_map_resolves_collisions():
    names = [f"model-{i}" for i in range(12)]
    colors = color_map(names)
    assert len(set(colors.values())) == 12
