"""fapm-relative: the relative shares' home (gain kept, forgetting recovered), a sweep on relative axes (the
Forgetting page's toggle), the study's table, verdict and figure, and its CLI on the tiny pico zoo."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from forgetlab.analysis.retention import (forgetting_recovered, gain_kept, gain_share, recovered_share,
                                          relative_frame)
from forgetlab.analysis.studies.fapm import KEPT_CLAIM, RECOVERED_CLAIM, figure, relative_table, verdict
from forgetlab.analysis.sweep_results import SweepPoint, SweepResult
from forgetlab.core.errors import ParameterError
from forgetlab.core.evaluate import Scorecard, TaskScore

TINY = Path("/tmp/fh_tiny/zoo/pico-tiny/pool.yaml")
ROOT = Path(__file__).resolve().parents[1]


def card(loss: float, em: float, al: float = 1.0, acc: float | None = None, ppl: float | None = None) -> Scorecard:
    bench = {}
    if acc is not None or ppl is not None:
        bench["cloze"] = {k: v for k, v in (("acc", acc), ("perplexity", ppl)) if v is not None}
    return Scorecard("m", loss, math.exp(loss), 100, {"math": TaskScore("math", em, al, 10)}, bench)


def test_the_shares_by_hand():
    assert gain_kept(0.1, 0.6, 0.35) == pytest.approx(0.5)
    assert gain_kept(0.1, 0.6, 0.6) == pytest.approx(1.0) and gain_kept(0.1, 0.6, 0.1) == 0.0
    assert math.isnan(gain_kept(0.5, 0.5, 0.7)) and math.isnan(gain_kept(0.5, 0.4, 0.7))
    # oriented generality (−loss): base −4, fine-tune −5 (forgot 1 nat), other −4.25 → 75 % recovered
    assert forgetting_recovered(-4.0, -5.0, -4.25) == pytest.approx(0.75)
    assert forgetting_recovered(-4.0, -5.0, -5.0) == 0.0 and forgetting_recovered(-4.0, -5.0, -4.0) == 1.0
    assert math.isnan(forgetting_recovered(-5.0, -4.0, -4.5))     # the fine-tune forgot nothing


def test_scorecard_shares_orient_each_measure():
    base, ft, other = card(4.0, 0.0, 3.0, acc=0.5, ppl=10.0), card(5.0, 0.8, 1.0, acc=0.3, ppl=14.0), \
        card(4.25, 0.6, 2.0, acc=0.45, ppl=11.0)
    assert gain_share(base, ft, other, "math") == pytest.approx(0.75)
    assert gain_share(base, ft, other, "math", "answer_loss") == pytest.approx(0.5)      # (3 − 2) / (3 − 1)
    assert recovered_share(base, ft, other) == pytest.approx(0.75)                      # general loss
    assert recovered_share(base, ft, other, "cloze/acc") == pytest.approx(0.75)         # higher is better
    assert recovered_share(base, ft, other, "cloze/perplexity") == pytest.approx(0.75)  # lower is better


def sweep(kind: str, x_name: str, xs_losses_ems, measure: str = "exact_match") -> SweepResult:
    points = [SweepPoint("fapm", x, {}, card(loss, em, acc=acc), 0.0) for x, loss, em, acc in xs_losses_ems]
    return SweepResult(kind=kind, model="math", task="math", x_name=x_name, points=points, measure=measure)


def test_relative_frame_of_a_pruning_and_an_alpha_sweep():
    pr = sweep("pruning", "ratio", [(0.0, 5.0, 0.8, 0.3), (0.5, 4.5, 0.6, 0.5), (1.0, 4.0, 0.0, 0.4)])
    f = relative_frame(pr, general_measures=["general_loss", "cloze/acc"]).set_index("x")
    assert f.loc[0.0, "gain_kept"] == 1.0 and f.loc[1.0, "gain_kept"] == 0.0          # the references
    assert f.loc[1.0, "forgetting_recovered"] == pytest.approx(1.0) and f.loc[0.0, "forgetting_recovered"] == 0.0
    assert f.loc[0.5, "gain_kept"] == pytest.approx(0.75)
    assert f.loc[0.5, "recovered:general_loss"] == pytest.approx(0.5)
    assert f.loc[0.5, "recovered:cloze/acc"] == pytest.approx(2.0)                      # (0.5 − 0.3) / (0.4 − 0.3)
    assert f.loc[0.5, "forgetting_recovered"] == pytest.approx(1.25)                    # their mean
    # α: the base at 0, the fine-tune at 1 (the other way round)
    al = sweep("alpha", "alpha", [(0.0, 4.0, 0.0, None), (0.5, 4.2, 0.7, None), (1.0, 5.0, 0.8, None)])
    g = relative_frame(al).set_index("x")
    assert g.loc[0.5, "gain_kept"] == pytest.approx(0.875) and g.loc[0.5, "forgetting_recovered"] == pytest.approx(0.8)
    with pytest.raises(ParameterError, match="endpoints"):
        relative_frame(sweep("pruning", "ratio", [(0.0, 5.0, 0.8, None), (0.5, 4.5, 0.6, None)]))
    with pytest.raises(ParameterError, match="pruning or α"):
        relative_frame(sweep("density", "density", [(1.0, 5.0, 0.8, None)]))


def test_relative_table_averages_defined_shares_over_models():
    frames = pd.DataFrame([
        {"series": "fapm", "x": 0.9, "gain_kept": 0.9, "forgetting_recovered": 0.6, "recovered:general_loss": 0.6,
         "model": "a"},
        {"series": "fapm", "x": 0.9, "gain_kept": float("nan"), "forgetting_recovered": 0.2,
         "recovered:general_loss": 0.2, "model": "b"},
        {"series": "fapm", "x": 0.0, "gain_kept": 1.0, "forgetting_recovered": 0.0, "recovered:general_loss": 0.0,
         "model": "a"},
        {"series": "fapm", "x": 0.0, "gain_kept": 1.0, "forgetting_recovered": 0.0, "recovered:general_loss": 0.0,
         "model": "b"}])
    t = relative_table(frames, 0.9)
    assert list(t.ratio) == [0.0, 0.9] and list(t.operating) == [False, True]
    row = t.iloc[1]
    assert row.gain_kept_pct == pytest.approx(90.0) and row.forgetting_recovered_pct == pytest.approx(40.0)
    assert row["gain_kept:a"] == pytest.approx(90.0) and math.isnan(row["gain_kept:b"]) and row.models == 2


def table(kept: float, rec: float) -> pd.DataFrame:
    return pd.DataFrame([{"series": "fapm", "ratio": 0.0, "operating": False, "gain_kept_pct": 100.0,
                          "forgetting_recovered_pct": 0.0, "models": 3},
                         {"series": "fapm", "ratio": 0.9, "operating": True, "gain_kept_pct": kept,
                          "forgetting_recovered_pct": rec, "models": 3},
                         {"series": "magnitude", "ratio": 0.9, "operating": True, "gain_kept_pct": 100.0,
                          "forgetting_recovered_pct": 100.0, "models": 3}])


def test_verdict_both_ways_and_undecided():
    ok = verdict(table(100 * KEPT_CLAIM + 1, 100 * RECOVERED_CLAIM + 1))
    assert ok.holds is True and "ratio 0.9" in ok.measured
    low = verdict(table(100 * KEPT_CLAIM - 1, 100 * RECOVERED_CLAIM + 1))
    assert low.holds is False and "of the gain" in low.reason
    low = verdict(table(99.0, 100 * RECOVERED_CLAIM - 1))
    assert low.holds is False and "forgetting" in low.reason      # only the fapm series is judged
    assert verdict(table(float("nan"), 60.0)).holds is None
    assert verdict(table(99.0, 60.0).assign(operating=False)).holds is None


def test_figure_draws_both_shares_per_series_and_marks_the_operating_point():
    fig = figure(table(98.0, 60.0))
    assert len(fig.data) == 4                                      # 2 series × 2 shares
    fapm = [d for d in fig.data if d.name.lower().startswith("fapm")]
    assert sorted(list(d.y) for d in fapm) == [[0.0, 60.0], [100.0, 98.0]]
    assert any(getattr(s, "x0", None) == 0.9 for s in fig.layout.shapes)


@pytest.mark.skipif(not TINY.exists(), reason="the tiny pico zoo is not built")
def test_cli_on_the_tiny_zoo_writes_table_and_figure(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FORGETLAB_HOME": str(tmp_path / "home")}
    r = subprocess.run([sys.executable, "-m", "forgetlab", "study", "fapm-relative", str(TINY), "--models", "math",
                        "--ratios", "0,0.9,1", "--measure", "answer_loss", "--max-general", "4", "--max-task", "8",
                        "--limit", "8", "--out", str(out), "--no-save"], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    t = pd.read_csv(out / "table.csv")
    assert (out / "figure.html").stat().st_size > 1000
    assert list(t.ratio) == [0.0, 0.9, 1.0] and list(t.series) == ["fapm"] * 3 and list(t.operating) == [False,
                                                                                                    True, False]
    assert {"gain_kept:math", "recovered:general_loss"} <= set(t.columns)
    assert any(c.startswith("recovered:zoo_wiki_cloze/") for c in t.columns)       # the pool's general benchmark
    assert t.gain_kept_pct.iloc[0] == pytest.approx(100.0) and t.gain_kept_pct.iloc[2] == pytest.approx(0.0)
    assert t["recovered:general_loss"].iloc[0] == pytest.approx(0.0)
    assert t["recovered:general_loss"].iloc[2] == pytest.approx(100.0)


def test_forgetting_page_toggle_redraws_the_pruning_curve_on_relative_axes(tiny_llama, tmp_path, monkeypatch):
    import json

    from tests.jobs_helper import finish_cleanly, open_page

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("forgetting", tiny_llama.pool_yaml)
    at.run()
    at.radio(key="forgetting_kind").set_value("pruning").run()
    at.text_input(key="forgetting_ratios").set_value("0, 0.9, 1")
    at.multiselect(key="forgetting_scores").set_value(["fapm"])
    at.session_state["app_max_general"] = 1
    at.session_state["app_max_task"] = 2
    at.button(key="forgetting_run").click().run()
    finish_cleanly(at, "forgetting")
    names = lambda chart: [d.get("name") for d in json.loads(chart.proto.spec)["data"]]     # noqa: E731
    assert not any("gain kept" in str(n) for c in at.get("plotly_chart") for n in names(c))
    at.toggle(key="forgetting_relative").set_value(True).run()
    assert not at.exception, at.exception
    drawn = [names(c) for c in at.get("plotly_chart")]
    assert len(drawn) == 2 and drawn[1] == ["FAPM: gain kept", "FAPM: forgetting recovered"]
