"""Figures of the Linearity and Features pages carry the numbers of their results."""
from __future__ import annotations

import numpy as np
import pandas as pd

from forgetlab.analysis.features import TsneResult
from forgetlab.analysis.linearity import NonlinearityResult, SubmoduleScore
from forgetlab.plots import color_for
from forgetlab.plots.features import tsne_scatter
from forgetlab.plots.linearity import curves_figure, level_bars, nls_heatmap

ALPHAS = (0.0, 0.5)


def _score(level, layer, head, nls):
    d = np.array([[1.0, 0.5 + nls / 2]] * 2)  # the nls field is set directly; d only feeds the curves
    return SubmoduleScore(level, layer, head, f"{level}{layer}{head}", d, np.array([nls, nls]), np.zeros(2))


def _result():
    scores = [_score("model", None, None, 0.9)]
    for i in range(2):
        scores += [_score("layer", i, None, 0.1 + i), _score("attn", i, None, 0.2 + i), _score("mlp", i, None, 0.3 + i)]
        scores += [_score("head", i, h, 0.4 + i + h / 10) for h in range(2)]
    return NonlinearityResult("t", "m", ALPHAS, 2, "finetuned", ("model", "layer", "attn", "mlp", "head"), scores)


def test_heatmap_bars_and_curves():
    res = _result()
    fig = nls_heatmap(res)
    z = np.asarray(fig.data[0].z, dtype=float)
    assert list(fig.data[0].y) == ["layer", "attn", "mlp", "head 0", "head 1"]
    np.testing.assert_allclose(z[:, 1], [1.1, 1.2, 1.3, 1.4, 1.5])
    bars = level_bars(res)
    np.testing.assert_allclose(bars.data[0].y, [0.9, 0.6, 0.7, 0.8, 0.95])
    curves = curves_figure(res)
    assert curves.data[0].name == "ideal 1 − α" and list(curves.data[0].y) == [1.0, 0.5]
    assert len(curves.data) == 1 + 5
    one = curves_figure(res, [("head", 1, 0)])
    assert len(one.data) == 2 and one.data[1].y[1] == 0.5 + 1.4 / 2


def test_tsne_scatter_colour_by_task_symbol_by_model():
    coords = pd.DataFrame({"x": [0, 1, 2, 3], "y": [0, 1, 2, 3], "task": ["a", "a", "b", "b"],
                           "model": ["p", "q", "p", "q"], "sample": [0, 0, 0, 0]})
    fig = tsne_scatter(TsneResult(coords, pd.DataFrame(), "opentsne", 1.0, 2, 0, {"level": "mlp", "layer": 1}))
    assert len(fig.data) == 4 + 2 + 2          # the points, then a legend entry per task and per model
    by_name = {t.name: t for t in fig.data}
    assert by_name["a · p"].marker.color == color_for("a") == by_name["a · q"].marker.color
    assert by_name["a · p"].marker.symbol == by_name["b · p"].marker.symbol != by_name["a · q"].marker.symbol
    assert "MLP of layer 1" in fig.layout.title.text
