"""The submodule-linearity studies (forgetlab/analysis/studies/linearity.py) and the seeded probe draws they stand on
(`select_pairs(..., seed)`, `nonlinearity_scores(seed=)`, `slwm_weights(seed=)`; docs/methods.md#probe-draws)."""
from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forgetlab.analysis.linearity import LinearitySettings, nonlinearity_scores
from forgetlab.analysis.slwm_weights import SlwmWeightsSettings
from forgetlab.analysis.studies.linearity import (NlsDrawsSettings, SlwmDataSettings, SlwmModelsSettings,
                                                  data_compute, data_plain, data_runs, data_verdict, models_compute,
                                                  models_verdict, nls_singles, nls_table, nls_verdict,
                                                  slwm_singles_of)
from forgetlab.core.errors import ParameterError
from forgetlab.core.submodules import select_pairs
from forgetlab.merge.methods.slwm import slwm_weights

ROOT = Path(__file__).resolve().parents[1]
TINY = Path("/tmp/fh_tiny/zoo/pico-tiny/pool.yaml")


@pytest.fixture(scope="module")
def zoo(request):
    """The tiny pico zoo's pool (the prebuilt one where it exists, else built once per session)."""
    from forgetlab.core.pool import ModelPool

    path = TINY if TINY.exists() else Path(request.getfixturevalue("pico_zoo").pool_yaml)
    return ModelPool.from_yaml(path)


# ------------------------------------------------------------------------------------------ seeded probe draws

def test_select_pairs_seed_none_is_the_first_n_and_a_seed_draws_reproducibly():
    pairs = list(range(40))
    assert select_pairs(pairs, 7, "t") == pairs[:7]                   # the default: today's first N
    assert select_pairs(pairs, 7, "t", None) == pairs[:7]
    a, b, c = (select_pairs(pairs, 7, "t", s) for s in (3, 3, 4))
    assert a == b and a != c                                          # same seed, same pairs; another, others
    assert len(set(a)) == 7 and set(a) <= set(pairs) and a == sorted(a)   # without replacement, in task order
    assert select_pairs(pairs, 40, "t", 11) == pairs                  # N = all: the first-N selection itself
    draws = {tuple(select_pairs(pairs, 5, "t", s)) for s in range(20)}
    assert len(draws) > 15                                            # the seed actually varies the draw
    with pytest.raises(ParameterError):
        select_pairs(pairs, 5, "t", -1)


def test_linearity_seeded_draw_scores_the_drawn_samples(zoo):
    task = zoo.task_names[0]
    n_all = len(zoo.probes.task(task).probe)
    kw = dict(levels=("model", "mlp"), batch_size=n_all)
    full = nonlinearity_scores(zoo, task, samples=None, **kw)
    everyone = nonlinearity_scores(zoo, task, samples=n_all, seed=5, **kw)
    for a, b in zip(full.scores, everyone.scores):                   # N = all with a seed: bit for bit
        assert np.array_equal(a.nls, b.nls, equal_nan=True)
    first = nonlinearity_scores(zoo, task, samples=6, **kw)           # no seed: the first 6 samples
    drawn = nonlinearity_scores(zoo, task, samples=6, seed=5, **kw)
    idx = [zoo.probes.task(task).probe.index(p) for p in select_pairs(zoo.probes.task(task).probe, 6, task, 5)]
    assert drawn.seed == 5 and first.seed is None and idx != list(range(6))
    for f, s0, s1 in zip(full.scores, first.scores, drawn.scores):
        np.testing.assert_allclose(s0.nls, f.nls[:6], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(s1.nls, f.nls[idx], rtol=1e-4, atol=1e-6)
    assert LinearitySettings().seed is None and SlwmWeightsSettings().seed is None


def test_slwm_weights_seed(zoo):
    w1, w1b, w2 = (slwm_weights(zoo, samples=2, seed=s) for s in (1, 1, 2))
    assert all(np.array_equal(a.weights, b.weights) for a, b in zip(w1.submodules, w1b.submodules))
    assert any(not np.allclose(a.weights, b.weights) for a, b in zip(w1.submodules, w2.submodules))
    assert w1.to_dict()["seed"] == 1


# ------------------------------------------------------------------------------------------ nls-draws

def _draw(model, layers, attn, mlp, heads):
    d = {("model", None, None): ("model", model)}
    for i, (ly, at, ml) in enumerate(zip(layers, attn, mlp)):
        d[("layer", i, None)] = (f"l{i}", ly)
        d[("attn", i, None)] = (f"l{i}.attn", at)
        d[("mlp", i, None)] = (f"l{i}.mlp", ml)
        for h, v in enumerate(heads[i]):
            d[("head", i, h)] = (f"l{i}.head{h}", v)
    return d


def test_nls_table_by_hand_and_verdict_both_ways():
    d1 = _draw(1.0, [0.4, 0.6], [0.2, 0.3], [0.5, 0.7], [[0.1, 0.3], [0.2, 0.4]])
    d2 = _draw(2.0, [0.6, 0.8], [0.4, 0.5], [0.5, 0.9], [[0.5, 0.3], [0.2, 0.6]])
    t = nls_table([d1, d2])
    lv = t[t.submodule == "all"].set_index("level")
    assert list(lv.index) == ["model", "layer", "attn", "mlp", "head"] and (t.draws == 2).all()
    assert lv.loc["model", "nls_mean"] == pytest.approx(1.5) and lv.loc["model", "nls_std"] == pytest.approx(0.5)
    assert lv.loc["layer", "nls_mean"] == pytest.approx(0.6)          # (0.5 + 0.7) / 2
    # MLPs below their layer: draw 1 none of 2 (0.5 > 0.4, 0.7 > 0.6), draw 2 one (0.5 < 0.6, 0.9 > 0.8)
    assert lv.loc["mlp", "more_linear_share"] == pytest.approx(0.25)
    assert lv.loc["mlp", "more_linear_std"] == pytest.approx(0.25)
    # heads below their attention: draw 1: 0.1 < 0.2, 0.2 < 0.3 (2/4); draw 2: 0.3 < 0.4, 0.2 < 0.5 (2/4)
    assert lv.loc["head", "more_linear_share"] == pytest.approx(0.5)
    assert lv.loc["head", "more_linear_std"] == pytest.approx(0.0)
    h = t[(t.level == "head") & (t.layer == 0) & (t["head"] == 0)].iloc[0]
    assert h.nls_mean == pytest.approx(0.3) and h.parent == "l0.attn" and h.more_linear_share == pytest.approx(0.5)
    assert len(t) == 5 + 1 + 2 * 3 + 4
    v = nls_verdict(t)
    assert v.holds is True and "mlp 0.650" in v.measured and "25%" in v.measured
    worse = t.copy()
    worse.loc[(worse.level == "mlp") & (worse.submodule == "all"), "nls_mean"] = 3.0
    v = nls_verdict(worse)
    assert v.holds is False and "mlp" in v.reason
    assert nls_verdict(t[t.level != "model"]).holds is None


def test_nls_draws_on_the_tiny_zoo(zoo):
    s = NlsDrawsSettings(samples=4, draws=2, seed=7)
    singles = nls_singles(zoo, s)
    assert [x[1].seed for x in singles] == [7, 8] and {x[0] for x in singles} == {"linearity"}
    assert singles[0][1].task == zoo.task_names[0]
    from forgetlab.analysis.studies.linearity import nls_compute

    t = nls_compute(zoo, s)
    first = nonlinearity_scores(zoo, zoo.task_names[0], samples=4, seed=7)
    second = nonlinearity_scores(zoo, zoo.task_names[0], samples=4, seed=8)
    m = t[(t.level == "model") & (t.submodule == "model")].iloc[0]
    a, b = first.get("model").nls_mean, second.get("model").nls_mean
    assert m.nls_mean == pytest.approx((a + b) / 2) and m.nls_std == pytest.approx(abs(a - b) / 2)
    assert (t.nls_std.dropna() >= 0).all() and t.more_linear_share.dropna().between(0, 1).all()


# ------------------------------------------------------------------------------------------ slwm-data, slwm-models

def test_slwm_data_on_the_tiny_zoo(zoo):
    s = SlwmDataSettings(counts=(1, 1000), draws=2, max_general=4, max_task=8)
    most = min(len(zoo.probes.task(t).probe) for t in zoo.task_names)
    runs = data_runs(zoo, s)
    assert [(n, seed) for _, n, seed in runs] == [(1, 0), (1, 3), (most, 0)]   # seed + d·T; one draw of all
    t = data_compute(zoo, s)
    sl = t[t.method == "slwm"]
    assert list(sl.samples) == [1, most] and list(sl.n) == [2, 1]
    assert t.samples.iloc[0] == 0 and sl.avg_normalized_std.iloc[-1] == 0
    assert {f"{task}_{t.measure.iloc[0]}" for task in zoo.task_names} <= set(t.columns)
    assert np.isfinite(t.avg_normalized).all() and np.isfinite(t.general_loss).all()
    # its single runs: one `forgetlab merge --eval` per SLWM merge and the plain average; the plain average run
    # alone scores what the study's reference row holds (the same merge, written, reloaded and scored)
    singles = slwm_singles_of(zoo, s, runs, data_plain(zoo, s))
    assert [label for label, _ in singles] == ["merge --eval"] * 4
    _, cards = singles[-1][1](zoo)
    merged = next(c for c in cards if c.model not in ("base", *zoo.model_names))
    assert merged.general_loss == pytest.approx(t.general_loss.iloc[0], rel=1e-4)


def test_slwm_data_verdict_both_ways():
    def table(scores, stds):
        return pd.DataFrame({"method": ["average (λ = 1/T)"] + ["slwm"] * len(scores),
                             "samples": [0, 1, 2, 5, 10, 20, 50][: len(scores) + 1],
                             "avg_normalized": [0.1, *scores], "avg_normalized_std": [0.0, *stds]})
    v = data_verdict(table([0.5, 0.7, 0.79, 0.8, 0.8, 0.8], [0.01] * 6))
    assert v.holds is True and "from 5 samples" in v.measured
    v = data_verdict(table([0.1, 0.2, 0.3, 0.4, 0.6, 0.8], [0.01] * 6))
    assert v.holds is False and "50" in v.reason
    assert data_verdict(table([float("nan")] * 2, [0.0] * 2)).holds is None


def test_slwm_models_on_the_tiny_zoo(zoo):
    s = SlwmModelsSettings(samples=3, lams=(0.5, 1.0), max_general=4, max_task=8)
    t = models_compute(zoo, s)
    m = len([x for x in zoo.model_names if x in zoo.task_names])
    assert list(t.models) == [k for k in range(2, m + 1) for _ in range(2)]
    for k, rows in t.groupby("models"):
        assert (rows.subsets == math.comb(m, k)).all()
        sl, ta = rows[rows.method == "slwm"].iloc[0], rows[rows.method != "slwm"].iloc[0]
        assert sl.gap == pytest.approx(sl.avg_normalized - ta.avg_normalized)
        assert all(x in ("0.5", "1") for x in ta.lam.split(","))
    with pytest.raises(ParameterError):
        models_compute(zoo, SlwmModelsSettings(counts=(2, 9)))


def test_slwm_models_verdict_both_ways():
    def table(gaps):
        rows = []
        for k, g in zip(itertools.count(2), gaps):
            rows += [{"method": "slwm", "models": k, "avg_normalized": 0.5 + g, "gap": g},
                     {"method": "task arithmetic (best λ)", "models": k, "avg_normalized": 0.5, "gap": g}]
        return pd.DataFrame(rows)
    assert models_verdict(table([-0.02, 0.01, 0.1])).holds is True
    v = models_verdict(table([0.05, 0.02]))
    assert v.holds is False and "shrinks" in v.reason
    v = models_verdict(table([0.05, -0.01]))
    assert v.holds is False and "trails" in v.reason


# ------------------------------------------------------------------------------------------ the CLI

def test_cli_writes_table_and_figure(tmp_path, zoo):
    from forgetlab.analysis.study import study_names

    assert {"nls-draws", "slwm-data", "slwm-models"} <= set(study_names())
    out = tmp_path / "out"
    env = {"PYTHONPATH": str(ROOT), "FORGETLAB_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "forgetlab", "study", "slwm-data", str(zoo.source), "--counts", "2",
                        "--draws", "1", "--max-general", "2", "--max-task", "4", "--out", str(out), "--no-save"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    table = pd.read_csv(out / "table.csv")
    assert list(table.method) == ["average (λ = 1/T)", "slwm"] and (out / "figure.html").stat().st_size > 1000
