"""PCB's options (activation, j ≠ i) and the PCB studies pcb-ratio, pcb-activation and pcb-self."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from forgetlab.analysis.base import ANALYSES
from forgetlab.analysis.lambda_search import PcbSearchSettings, compose, pcb_components, probe_loss
from forgetlab.analysis.studies import pcb as studies
from forgetlab.core.errors import ForgetlabError
from forgetlab.core.pool import ModelPool
from forgetlab.merge.recipe_io import load_recipe
from forgetlab.merge.api import merge_state_dicts
from forgetlab.merge.methods import pcb


def _random(n_models=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = {"a": torch.randn(40, 17, generator=g), "b": torch.randn(300, generator=g),
            "c": torch.randn(3, 5, generator=g)}
    fts = [{k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(n_models)]
    return base, fts


def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


# ------------------------------------------------------------------------------------------ the method options


@pytest.mark.parametrize("scope", ["global", "tensor"])
@pytest.mark.parametrize("keep", [0.2, 0.5, 1.0])
def test_softmax_with_j_equal_i_is_todays_pcb_bit_for_bit(scope, keep):
    base, fts = _random()
    today = merge_state_dicts("pcb", base, fts, scope=scope, keep=keep, lam=[0.7, 1.0, 1.3])
    explicit = merge_state_dicts("pcb", base, fts, scope=scope, keep=keep, lam=[0.7, 1.0, 1.3], activation="softmax",
                                 self_term=True)
    assert all(torch.equal(today[n], explicit[n]) for n in base)
    taus = [fts[i]["a"] - base["a"] for i in range(3)]     # the reference path and the CPU kernel, too
    assert torch.equal(pcb.pcb_merge(taus, keep), pcb.pcb_merge(taus, keep, activation="softmax", self_term=True))
    assert torch.equal(pcb.pcb_merge_into_(torch.zeros(40, 17), taus, keep, [1.0] * 3),
                       pcb.pcb_merge_into_(torch.zeros(40, 17), taus, keep, [1.0] * 3, activation="softmax",
                                           self_term=True))
    # and the options change the merge (a test of the default that could not fail otherwise)
    other = merge_state_dicts("pcb", base, fts, scope=scope, keep=keep, activation="tanh", self_term=False)
    assert not torch.equal(today["a"], other["a"])


# τ1 = [2, 0], τ2 = [0, 1], r = 1 (nothing dropped): Norm(τ1τ1) = [1, 0], Norm(τ2τ2) = [0, 1], τ1τ2 = 0
# → Norm 0.
HAND_BASE = {"w": torch.zeros(2)}
HAND_FTS = [{"w": torch.tensor([2.0, 0.0])}, {"w": torch.tensor([0.0, 1.0])}]


@pytest.mark.parametrize("scope", ["global", "tensor"])
def test_sigmoid_by_hand(scope):
    # intra_1 = σ(2·[1, 0]) = [σ(2), ½], inter_1 = σ([1, 0]) + σ([0, 0]) = [σ(1) + ½, 1], symmetric for task 2:
    # β1 = [a, ½], β2 = [½, a] with a = σ(2)(σ(1) + ½); τm = [2a/(a + ½), a/(a + ½)]
    a = _sigmoid(2) * (_sigmoid(1) + 0.5)
    want = torch.tensor([2 * a / (a + 0.5), a / (a + 0.5)])
    got = merge_state_dicts("pcb", HAND_BASE, HAND_FTS, keep=1.0, scope=scope, activation="sigmoid")["w"]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    torch.testing.assert_close(pcb.pcb_merge([f["w"] for f in HAND_FTS], 1.0, activation="sigmoid"), want,
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("scope", ["global", "tensor"])
def test_without_j_equal_i_by_hand(scope):
    # softmax, j ≠ i: inter_i = softmax(Norm(τ1τ2)) = softmax([0, 0]) = [½, ½]; intra_1 = softmax([2, 0]) =
    # [σ(2), 1 − σ(2)], intra_2 = [1 − σ(2), σ(2)]; so β1 + β2 = ½ at each entry and τm = [2σ(2), σ(2)]
    want = torch.tensor([2 * _sigmoid(2), _sigmoid(2)])
    got = merge_state_dicts("pcb", HAND_BASE, HAND_FTS, keep=1.0, scope=scope, self_term=False)["w"]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    # with j = i: inter_1 = softmax([1, 0]) + [½, ½], inter_2 = [½, ½] + softmax([0, 1]); at the first entry
    # β1 = σ(2)·(e/(e + 1) + ½), β2 = (1 − σ(2))·(½ + 1/(e + 1)), and τm = 2·β1/(β1 + β2)
    with_i = merge_state_dicts("pcb", HAND_BASE, HAND_FTS, keep=1.0, scope=scope)["w"]
    e = math.e
    b10, b20 = _sigmoid(2) * (e / (e + 1) + 0.5), (1 - _sigmoid(2)) * (0.5 + 1 / (e + 1))
    assert with_i[0].item() == pytest.approx(2 * b10 / (b10 + b20), rel=1e-6)


def test_one_model_without_j_equal_i_is_the_base():
    base, fts = _random(n_models=1)
    merged = merge_state_dicts("pcb", base, fts, keep=0.5, scope="tensor", self_term=False)
    assert all(torch.equal(merged[n], base[n]) for n in base)


@pytest.mark.parametrize("activation", pcb.ACTIVATIONS)
@pytest.mark.parametrize("self_term", [True, False])
def test_kernels_and_components_follow_the_options(activation, self_term):
    base, fts = _random(seed=3)
    taus = [f["a"] - base["a"] for f in fts]
    ref = pcb.pcb_merge(taus, 0.3, 1.0, activation=activation, self_term=self_term)
    fast = pcb.pcb_merge_into_(torch.zeros(40, 17), taus, 0.3, [1.0] * 3, activation=activation, self_term=self_term)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-7)
    for scope in ("global", "tensor"):   # the λ search's components: Σ λ·Ci is the merge
        merged = merge_state_dicts("pcb", base, fts, keep=0.3, scope=scope, lam=0.8, activation=activation,
                                   self_term=self_term)
        comps = pcb_components(base, fts, 0.3, scope, activation=activation, self_term=self_term)
        composed = compose(base, comps, [0.8] * 3)
        for n in base:
            torch.testing.assert_close(composed[n], merged[n], rtol=1e-5, atol=1e-6)


def test_unknown_activation_is_refused():
    base, fts = _random()
    with pytest.raises(ForgetlabError, match="activation"):
        merge_state_dicts("pcb", base, fts, activation="gelu")


# ------------------------------------------------------------------------------------------------ the studies

TINY = Path("/tmp/fh_tiny/zoo/pico-tiny/pool.yaml")
needs_tiny = pytest.mark.skipif(not TINY.exists(), reason="the tiny pico zoo is not built")
BUDGET = dict(max_general=2, max_task=4)
SCORES = ["speciality", "answer_loss", "general_loss", "forgetting"]


@pytest.fixture(scope="module")
def tiny():
    return ModelPool.from_yaml(TINY)


@pytest.fixture(scope="module")
def tables(tiny):
    ratio = studies.compute_ratio(tiny, studies.PcbRatioSettings(ratios=(0.2, 1.0), search_ratios=(0.05, 0.2),
                                                                 search_lams=(0.5, 1.0), **BUDGET))
    act = studies.compute_activation(tiny, studies.PcbActivationSettings(activations=("softmax", "tanh"), **BUDGET))
    self_ = studies.compute_self(tiny, studies.PcbStudySettings(**BUDGET))
    return ratio, act, self_


@needs_tiny
def test_ratio_table(tiny, tables):
    ratio, act, self_ = tables
    assert list(ratio.kind.unique()) == ["base", "curve", "search", "searched"]
    curve, search = ratio[ratio.kind == "curve"], ratio[ratio.kind == "search"]
    assert curve.keep.tolist() == [0.2, 1.0] and (curve.lam == 1.0).all()
    assert sorted(zip(search.keep, search.lam)) == [(0.05, 0.5), (0.05, 1.0), (0.2, 0.5), (0.2, 1.0)]
    assert ratio[ratio.kind == "base"].forgetting.iloc[0] == 0.0
    assert ratio[ratio.kind != "search"][SCORES].notna().all().all()
    found = ratio[ratio.kind == "searched"].iloc[0]
    best = search.loc[search.probe_loss.idxmin()]
    assert (found.keep, found.lam, found.probe_loss) == (best.keep, best.lam, best.probe_loss)
    assert found.evaluations == 4 and found.seconds >= search.seconds.sum() * 0.5
    # a search point is the pcb-search loss of the registry's merge at that (r, λ)
    loss = probe_loss(tiny, max_task=4)
    scorer = studies.MergeScorer(tiny, studies.PcbStudySettings(**BUDGET))
    point = search[(search.keep == 0.05) & (search.lam == 0.5)].iloc[0]
    assert point.probe_loss == pytest.approx(loss(scorer.merge(keep=0.05, lam=0.5)), rel=1e-4)
    # the same merge scores the same in every study: r = 0.2, λ = 1, softmax, j = i is PCB's default
    at_default = curve[curve.keep == 0.2][SCORES].iloc[0]
    soft = act[act.activation == "softmax"][SCORES].iloc[0]
    with_i = self_[self_.variant == "j = i included"][SCORES].iloc[0]
    pd.testing.assert_series_equal(at_default, soft, check_names=False)
    pd.testing.assert_series_equal(at_default, with_i, check_names=False)


@needs_tiny
def test_activation_and_self_tables(tables):
    _, act, self_ = tables
    assert act.activation.tolist() == ["base", "softmax", "tanh"]
    assert self_.variant.tolist() == ["base", "j = i included", "j ≠ i"]
    assert self_.self_term.tolist()[1:] == [True, False]
    for t in (act, self_):
        assert t[SCORES].notna().all().all()
        # the forgetting is the general loss over the base's
        assert (t.forgetting - (t.general_loss - t.general_loss.iloc[0])).abs().max() < 1e-9
    # the options change the merge, so the scores differ
    assert act.answer_loss.iloc[1] != act.answer_loss.iloc[2] and self_.answer_loss.iloc[1] != self_.answer_loss.iloc[2]


def _curve(values, column="speciality"):
    rows = [{"kind": "base", "keep": 0.0, "lam": 1.0, column: 0.0, "general_loss": 3.0}]
    rows += [{"kind": "curve", "keep": r, "lam": 1.0, column: v, "general_loss": 3.1} for r, v in values]
    return pd.DataFrame(rows)


def test_ratio_verdict_both_ways():
    assert studies.verdict_ratio(_curve([(0.1, 0.5), (0.2, 0.4), (1.0, 0.3)])).holds is True
    v = studies.verdict_ratio(_curve([(0.1, 0.3), (0.2, 0.4), (1.0, 0.5)]))
    assert v.holds is False and "1" in v.reason
    tie = studies.verdict_ratio(_curve([(0.1, 0.3), (0.3, 0.5), (0.5, 0.5)]))     # a tie is named
    assert tie.holds is True and "tied with r = 0.5" in tie.measured
    # no exact match anywhere: the answer loss decides, lower is better
    losses = _curve([(0.1, 2.0), (1.0, 3.0)], "answer_loss").assign(speciality=0.0)
    assert studies.verdict_ratio(losses).holds is True
    assert studies.verdict_ratio(_curve([(0.1, 3.0), (1.0, 2.0)], "answer_loss").assign(speciality=0.0)).holds is False


def test_activation_verdict_both_ways():
    def table(values):
        return pd.DataFrame([{"activation": a, "speciality": v, "answer_loss": 1.0, "general_loss": 3.0}
                             for a, v in values])
    assert studies.verdict_activation(table([("base", 0), ("softmax", 0.5), ("tanh", 0.5), ("relu", 0.2)])).holds
    v = studies.verdict_activation(table([("base", 0), ("softmax", 0.5), ("tanh", 0.6)]))
    assert v.holds is False and "tanh" in v.reason


def test_self_verdict_both_ways():
    def table(a, b):
        return pd.DataFrame([{"variant": n, "speciality": v, "answer_loss": 1.0, "general_loss": 3.0}
                             for n, v in (("base", 0.0), ("j = i included", a), ("j ≠ i", b))])
    assert studies.verdict_self(table(0.50, 0.51)).holds is True
    assert studies.verdict_self(table(0.50, 0.60)).holds is False


@needs_tiny
def test_singles_are_pcb_search_runs(tiny):
    s = studies.PcbRatioSettings(ratios=(0.1, 1.0), search_ratios=(0.05,), search_lams=(0.5, 1.0))
    runs = studies.singles_ratio(tiny, s)
    assert [n for n, _ in runs] == ["pcb-search"] * 5
    assert all(isinstance(x, PcbSearchSettings) and x.budget == 1 for _, x in runs)
    merges = [x for _, x in runs if x.merge is not None]
    assert [load_recipe(x.recipe).params["keep"] for x in merges] == [0.1, 1.0, 0.2]
    act = ANALYSES.get("study-pcb-activation").singles(tiny, studies.PcbActivationSettings())
    assert [load_recipe(x.recipe).params["activation"] for _, x in act] == list(pcb.ACTIVATIONS)


@needs_tiny
def test_cli_writes_table_and_figure(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "forgetlab", "study", "pcb-self", str(TINY), "--max-general", "2", "--max-task", "2",
           "--out", str(out), "--no-save"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "FORGETLAB_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr[-2000:]
    table = pd.read_csv(out / "table.csv")
    assert table.variant.tolist() == ["base", "j = i included", "j ≠ i"]
    assert "<html" in (out / "figure.html").read_text()[:2000].lower()
