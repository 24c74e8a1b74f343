"""Text on the charts that a reader can read: labels that do not pile up, legends that fit, titles that say a
thing once, and the setting written on each trade-off point."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from forgetlab.analysis.features import TsneResult
from forgetlab.analysis.sweep_results import SweepPoint, SweepResult
from forgetlab.core.evaluate import Scorecard, TaskScore
from forgetlab.plots import color_for
from forgetlab.plots.attribution import outer_labels
from forgetlab.plots.features import submodule_title, tsne_scatter
from forgetlab.plots.forgetting import point_label, tradeoff_figure


def test_outer_labels_name_only_the_points_far_from_the_origin():
    # x spans 0.06, y spans 0.2: scaled, (0.06, 0) and (0, 0.2) are 1 away; (0.003, 0.01) only 0.07
    keys = ["embed", "1.mlp", "0.mlp", "0.attn", "2.attn", "bad"]
    xs = [0.06, 0.0, 0.001, 0.003, -0.002, math.nan]
    ys = [0.0, 0.2, 0.09, 0.01, 0.0, 0.5]
    assert outer_labels(keys, xs, ys, k=8) == ["embed", "1.mlp", "0.mlp", "", "", ""]
    assert outer_labels(keys, xs, ys, k=2) == ["embed", "1.mlp", "", "", "", ""]       # ties: storage order
    assert outer_labels(keys, xs, ys, k=8, crowd=0.0) == ["embed", "1.mlp", "0.mlp", "0.attn", "2.attn", ""]
    assert outer_labels(["a"], [0.0], [0.0]) == [""]                                   # all at the origin


def test_attribution_scatter_labels_at_most_the_outer_points():
    from forgetlab.plots.attribution import LABELLED
    from forgetlab.plots.attribution import tradeoff_figure as attribution_figure

    n = 20
    rows = [{"map": "only_this", "alpha": 1.0, "key": f"{i}.attn", "layer": i, "module": "attn", "head": None,
             "d_general_loss": 0.001 * i, "d_speciality": 0.01 * (i % 3), "d_answer_loss": 0.0, "tau_share": 0.05,
             "zero_tau": False} for i in range(n)]

    class Result:
        def to_frame(self):
            return pd.DataFrame(rows)

    fig = attribution_figure(Result())
    texts = [t for trace in fig.data if trace.text is not None for t in trace.text]
    named = [t for t in texts if t]
    assert len(texts) == n and 0 < len(named) <= LABELLED
    assert "19.attn" in named and "0.attn" not in named        # the farthest is named, the origin's is not
    hover = [h for trace in fig.data if trace.hovertext is not None for h in trace.hovertext]
    assert sum(h.startswith("0.attn<br>") for h in hover) == 1    # every point still names itself on hover


def _tsne(models, tasks, meta):
    rows = [{"x": float(i), "y": float(j), "task": t, "model": m, "sample": 0}
            for i, m in enumerate(models) for j, t in enumerate(tasks)]
    return TsneResult(pd.DataFrame(rows), pd.DataFrame(), "opentsne", 5.0, 2, 0, meta)


def test_tsne_legend_has_one_entry_per_task_and_per_model():
    models = ["base", "math", "code", "translate", "lora-math", "lora-code", "lora-translate"]
    tasks = ["math", "code", "translate"]
    fig = tsne_scatter(_tsne(models, tasks, {"level": "layer", "layer": 3}))
    in_legend = [t for t in fig.data if t.showlegend is not False]
    assert [t.name for t in in_legend] == tasks + models                 # 10 entries, not 21
    points = [t for t in fig.data if t.showlegend is False]
    assert len(points) == 21 and all(t.x[0] is not None for t in points)
    assert all(t.x == (None,) for t in in_legend)                         # legend entries draw no point
    by_task = {t.name: t.marker.color for t in in_legend[:3]}
    assert by_task == {t: color_for(t) for t in tasks}
    symbols = [t.marker.symbol for t in in_legend[3:]]
    assert len(set(symbols)) == len(models)
    for p in points:                              # a point has its task's colour and its model's symbol
        task, model = p.name.split(" · ")
        assert p.marker.color == color_for(task) and p.marker.symbol == symbols[models.index(model)]
        assert p.legendgroup == f"task {task}"    # hiding a task from the legend hides its points
    assert fig.layout.legend.orientation == "h"   # below the plot: 10 entries fit at any width


@pytest.mark.parametrize("meta, expected", [
    ({"level": "layer", "layer": 3}, "decoder layer 3"),
    ({"level": "mlp", "layer": 1}, "MLP of layer 1"),
    ({"level": "attn", "layer": 0}, "attention of layer 0"),
    ({"level": "head", "layer": 2, "head": 1}, "head 1 of layer 2"),
    ({"level": "model", "layer": None}, "last hidden state"),
])
def test_tsne_title_names_the_submodule_once(meta, expected):
    assert submodule_title(meta) == expected
    title = tsne_scatter(_tsne(["base"], ["math"], meta)).layout.title.text
    assert title.startswith(f"t-SNE of {expected} features")
    assert title.count("layer") == (1 if meta.get("layer") is not None else 0)


def _point(x, em, loss):
    return SweepPoint("wise-ft", x, {"alpha": x}, Scorecard("m", loss, 2.0, 10, {"math": TaskScore("math", em, 1.0, 4)}),
                      distance=x)


def test_tradeoff_points_carry_their_setting():
    res = SweepResult("alpha", "math", "math", "alpha", [_point(a, a, 5.0 + a / 10) for a in (0.0, 0.25, 1.0)])
    fig = tradeoff_figure(res)
    series = fig.data[0]
    assert "text" in series.mode and list(series.text) == ["α 0", "α 0.25", "α 1"]
    assert list(series.x) == [5.0, 5.025, 5.1]      # the labels follow the points' order
    pruning = SweepResult("pruning", "math", "math", "ratio", [_point(0.9, 0.5, 5.0)])
    assert list(tradeoff_figure(pruning).data[0].text) == ["ratio 0.9"]
    assert point_label("density", 0.2) == "density 0.2" and point_label("seed", 3) == "seed 3"
