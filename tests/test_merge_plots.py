"""Merge page figures: one bar group per model, distinct colours, values from the scorecards."""
from __future__ import annotations

from forgetlab.core.evaluate import Scorecard, TaskScore
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
    assert [round(float(t.y[0]), 6) for t in general] == [0.0, 0.5, 0.2]        # forgetting: Δ vs the base
    special = [t for t in fig.data if t.xaxis == "x2"]
    assert list(special[2].x) == ["math", "copy"] and list(special[2].y) == [0.7, 0.6]
    assert len({t.marker.color for t in general}) == 3
    assert [t.name for t in special] == ["base", "ft0", "m (merge)"]          # the merge is named and hatched
    assert special[2].marker.pattern.shape == "/" and not special[0].marker.pattern.shape
    assert fig.layout.yaxis.title.text == "Δ general loss vs base, nats ↓" and fig.layout.yaxis2.title.text == "exact match ↑"
    assert fig.layout.yaxis.rangemode == "tozero"
    loss = scorecard_figure(cards, "answer_loss", merged=["m"])                  # the other measure, own axis
    assert [list(t.y) for t in loss.data if t.xaxis == "x2"][2] == [1.3, 1.4]
    assert loss.layout.yaxis2.title.text == "answer loss (nats) ↓"


def test_colour_map_resolves_collisions():
    names = [f"model-{i}" for i in range(12)]
    colors = color_map(names)
    assert len(set(colors.values())) == 12


def test_search_figure_draws_every_point_the_base_the_front_the_best_and_the_bound():
    from forgetlab.analysis.search import SearchPoint, SearchResult, _finish
    from forgetlab.plots.merge import search_figure

    res = SearchResult("ties", "weights", ["a", "b"], "constrained", "exact_match", 0.05, 1.0, 4.0, 0.1)
    for i, (spec, loss) in enumerate([(0.5, 4.02), (0.7, 4.04), (0.6, 4.10), (0.2, 4.01)]):
        res.points.append(SearchPoint(i, [1.0, 0.5 + i], speciality=spec, general_loss=loss, forgetting=loss - 4.0,
                                      worker={"host": "h", "pid": 7}))
    res.points.append(SearchPoint(4, [0.0, 0.0], error="worker died"))
    _finish(res)
    fig = search_figure(res)
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["evaluated merges"].x) == [4.02, 4.04, 4.10, 4.01]          # the failed point is left out
    assert list(by_name["base"].y) == [0.1]
    assert list(by_name["Pareto front"].x) == [4.01, 4.02, 4.04]                     # 4.10 is dominated by 4.04
    assert (list(by_name["best"].x), list(by_name["best"].y)) == ([4.04], [0.7])     # best within the bound
    assert fig.layout.shapes[0].x0 == 4.05                                            # the forgetting bound
    assert "h:7" in by_name["evaluated merges"].hovertext[0]
