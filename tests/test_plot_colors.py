"""Colours and legend names: one colour per name on every chart, never shared by two names shown together."""
from __future__ import annotations

from forgetlab.analysis.sweep_results import SweepPoint, SweepResult
from forgetlab.core.evaluate import Scorecard, TaskScore
from forgetlab.plots import FIXED, color_for, color_map
from forgetlab.plots.forgetting import curves_figure, sweep_labels, tradeoff_figure


def test_color_map_gives_distinct_names_distinct_colours_and_keeps_them_across_calls():
    names = ["ft0", "ft1", "base", "math", "code", "translate", "lora-math", "lora-code", "wise-ft", "fapm",
             "magnitude", "relative", "dare", "ties", *[f"run-{i}" for i in range(30)]]
    first = color_map(names)
    assert len(set(first.values())) == len(names)                 # > palette size: still no collision
    again = color_map(list(reversed(names)) + ["another"])         # another chart, other order, one more name
    assert all(again[n] == first[n] for n in names)
    assert again["another"] not in first.values()
    assert color_for("ft0") == first["ft0"] != first["ft1"]       # the collision this replaced
    assert first["base"] == FIXED["base"]
    assert color_for("ft-math") == color_for("math") != color_for("lora-math")   # a zoo model and its task


def _sweep(model, alphas, spec):
    points = [SweepPoint("wise-ft", a, {"alpha": a},
                         Scorecard("m", 3.0 - a, 2.0, 10, {"math": TaskScore("math", spec * a, 1.0, 4)}), distance=a)
              for a in alphas]
    return SweepResult("alpha", model, "math", "alpha", points, recipe={"model": model, "alphas": list(alphas)})


def test_compared_sweeps_get_distinct_legend_names_and_colours():
    a, b = _sweep("ft0", [0.0, 1.0], 0.9), _sweep("ft1", [0.0, 1.0], 0.5)
    assert sweep_labels([a, b]) == ["ft0", "ft1"]
    fig = tradeoff_figure([a, b])
    series = [t for t in fig.data if t.name != "Pareto front"]
    assert [t.name for t in series] == ["ft0 · WiSE-FT", "ft1 · WiSE-FT"]     # legend names a person writes
    assert [t.line.color for t in series] == [color_for("ft0"), color_for("ft1")]   # the models' colours
    # same model, other grid: the differing setting names them; identical settings: the ids do
    c = _sweep("ft0", [0.0, 0.5, 1.0], 0.9)
    assert sweep_labels([a, c]) == ["α 0, 1", "α 0, 0.5, 1"]
    long = _sweep("ft0", [i / 10 for i in range(11)], 0.9)
    assert sweep_labels([a, long]) == ["α 0, 1", "α 0…1 (11 points)"]
    assert sweep_labels([a, _sweep("ft0", [0.0, 1.0], 0.9)], ids=["r1", "r2"]) == ["r1", "r2"]
    curves = curves_figure([a, c])
    names = [t.name for t in curves.data if t.showlegend]
    assert len(names) == 2 and len(set(names)) == 2
    assert len({t.line.color for t in curves.data}) == 2
    assert [t.name for t in tradeoff_figure(a).data][:1] == ["WiSE-FT"]   # one sweep alone: plain series


def test_compared_finetunes_of_the_same_labels_are_told_apart():
    from forgetlab.plots.finetune import runs_of, trajectories_figure
    from forgetlab.train.runs import FinetuneComparison, FinetuneConfig, FinetuneRun
    from forgetlab.train.trainer import TrainResult

    def comp(start, loss):
        train = TrainResult(steps=2, history=[{"step": s, "general_loss": loss + s, "exact_match": 0.1 * s,
                                               "distance": 0.01 * s} for s in (1, 2)])
        return FinetuneComparison("math", start, [FinetuneRun(FinetuneConfig(label="adamw"), "math", start, train)])

    same = runs_of([comp("base", 3.0), comp("base", 4.0)], ["r1", "r2"])
    assert [r.label for r in same] == ["adamw · r1", "adamw · r2"]
    other = runs_of([comp("base", 3.0), comp("ft0", 4.0)], ["r1", "r2"])
    assert [r.label for r in other] == ["adamw · base→math", "adamw · ft0→math"]
    fig = trajectories_figure(same)
    assert len({t.name for t in fig.data}) == 2 and len({t.line.color for t in fig.data}) == 2
