"""MoFO's figure studies (forgetlab.analysis.studies.mofo_figures): forgetting-vs-distance (Figure 2) and mofo-pareto
(Section 4.2) — the runs each asks for, their tables on the tiny pool (shape, columns, facts that must hold: the
base at step 0, MoFO at fraction 1 being AdamW, HMA at α = 0 being the base, the front computed independently),
the verdicts on hand-made tables both ways, bad settings refused, and the CLI's table.csv and figure.html."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from forgetlab.analysis.base import ANALYSES
from forgetlab.analysis.studies.mofo_figures import (RHO_MIN, DistanceSettings, ParetoSettings, distance_configs,
                                                      distance_figure, distance_singles, distance_verdict,
                                                      front_column, hma_tuples, mark_front, pareto_configs,
                                                      pareto_figure, pareto_singles, pareto_verdict, recorded,
                                                      spearman)
from forgetlab.cli import main
from forgetlab.core.errors import ParameterError

SMALL = dict(steps=4, batch_size=4, lr=5e-3, warmup=0, max_general=2, max_task=4, max_train=8, device="cpu",
             dtype="float32")
DISTANCE_COLUMNS = ["optimizer", "step", "distance", "general_loss", "forgetting", "speciality", "answer_loss"]
PARETO_COLUMNS = ["method", "setting", "speciality", "answer_loss", "general_loss", "distance", "pareto",
                  "pareto_exact_match", "pareto_answer_loss"]


# ------------------------------------------------------------------------------------- the runs asked for


def test_distance_runs_adamw_lion_and_mofo_on_one_budget(pool):
    task = pool.task_names[0]
    s = DistanceSettings(task=task, fraction=0.3, lion_lr_scale=0.25, **SMALL)
    adam, lion, mofo = distance_configs(pool, s)
    assert (adam.optimizer, lion.optimizer, mofo.optimizer) == ("adamw", "lion", "mofo")
    assert lion.lr == pytest.approx(0.25 * adam.lr) and mofo.lr == adam.lr and mofo.fraction == 0.3
    assert {c.steps for c in (adam, lion, mofo)} == {4} and {c.seed for c in (adam, lion, mofo)} == {0}
    # ten records by default (⌈4/10⌉ = every step), the given interval otherwise; the singles record alike
    assert recorded(pool, s).eval_every == 1
    assert recorded(pool, DistanceSettings(task=task, eval_every=3, **SMALL)).eval_every == 3
    assert [st.eval_every for _, st in distance_singles(pool, s)] == [1, 1, 1]


def test_pareto_asks_for_every_setting_of_every_method(pool):
    task = pool.task_names[0]
    s = ParetoSettings(task=task, model="ft0", fractions=(0.1, 0.5), l1s=(1e-3,), l2s=(0.5, 2.0),
                       hma=((0.2, 0.4),), **SMALL)
    labels = [c.label for c in pareto_configs(pool, s)]
    assert labels == ["adamw", "mofo-0.1", "mofo-0.5", "l1-0.001", "l2-0.5", "l2-2"]
    assert hma_tuples(s) == [(0.2, 0.4), (1.0, 1.0)]                     # the fine-tune itself is added once
    assert hma_tuples(ParetoSettings(hma=((1.0, 1.0), (0.5, 0.5)))) == [(1.0, 1.0), (0.5, 0.5)]
    singles = pareto_singles(pool, s)
    assert [n for n, _ in singles] == ["finetune"] * 6 + ["sweep-hma"]
    assert singles[-1][1].model == "ft0" and list(singles[-1][1].grid) == [(0.2, 0.4), (1.0, 1.0)]


def test_bad_settings_are_refused(pool):
    task = pool.task_names[0]
    dist, par = ANALYSES["study-forgetting-vs-distance"], ANALYSES["study-mofo-pareto"]
    for bad in (dict(fraction=0.0), dict(fraction=1.5), dict(lion_lr_scale=0.0)):
        with pytest.raises(ParameterError):
            dist.check(DistanceSettings(task=task, **bad), pool)
    for bad in (dict(fractions=(0.2, 0.2)), dict(fractions=(0.0,)), dict(l1s=(-1.0,)), dict(l2s=(1.0, 1.0)),
                dict(hma=((0.1, 0.2), (0.1,))), dict(hma=((0.1, 0.2, 0.3),)),     # 3 blocks, 2 layers
                dict(model="base"), dict(model="nope")):
        with pytest.raises(ParameterError):
            par.check(ParetoSettings(task=task, **{"model": "ft0", "hma": ((0.5, 0.5),), **bad}), pool)
    with pytest.raises(ParameterError, match="model"):                  # no model named like the task
        par.check(ParetoSettings(task=task, hma=((0.5, 0.5),)), pool)


# ------------------------------------------------------------------------------------- the tables


@pytest.fixture(scope="module")
def distance_table(pool):
    """forgetting-vs-distance on the tiny pool, MoFO at fraction 1 (= AdamW), a record every 2 steps."""
    s = DistanceSettings(task=pool.task_names[0], fraction=1.0, eval_every=2, **SMALL)
    study = ANALYSES["study-forgetting-vs-distance"]
    study.check(s, pool)
    return study.compute(pool, s)


def test_distance_table_has_one_row_per_optimizer_and_record(distance_table):
    t = distance_table.table
    assert list(t.columns) == DISTANCE_COLUMNS
    assert list(t.optimizer.unique()) == ["adamw", "lion", "mofo-1"]
    for _, runs in t.groupby("optimizer"):
        assert list(runs.step) == [0, 2, 4]
    start = t[t.step == 0]
    assert (start.distance == 0).all() and (start.forgetting == 0).all()          # every run starts at the base
    assert start.general_loss.nunique() == 1
    base = start.general_loss.iloc[0]
    assert (t.forgetting - (t.general_loss - base)).abs().max() < 1e-12
    assert (t[t.step > 0].distance > 0).all()
    adam, mofo = t[t.optimizer == "adamw"].reset_index(), t[t.optimizer == "mofo-1"].reset_index()
    for col in ("distance", "general_loss", "answer_loss"):                    # MoFO at fraction 1 is AdamW
        assert (adam[col] - mofo[col]).abs().max() < 1e-5, col
    assert "MoFO does not end closer" in distance_table.verdict.reason       # equal D: not closer
    fig = distance_figure(t)
    assert [tr.name for tr in fig.data] == ["adamw", "lion", "mofo-1"]
    assert list(fig.data[0].x) == list(t[t.optimizer == "adamw"].distance)


@pytest.fixture(scope="module")
def pareto_table(pool):
    """mofo-pareto on the tiny pool: AdamW, MoFO at 0.3 and 1, L1, L2, HMA at α = 0 (the base) and 0.5/0.2, and
    ft0 itself."""
    s = ParetoSettings(task=pool.task_names[0], model="ft0", fractions=(0.3, 1.0), l1s=(1e-3,), l2s=(1.0,),
                       hma=((0.0, 0.0), (0.5, 0.2)), **SMALL)
    study = ANALYSES["study-mofo-pareto"]
    study.check(s, pool)
    return study.compute(pool, s)


def test_pareto_table_holds_every_setting_and_its_front(pareto_table):
    t = pareto_table.table
    assert list(t.columns) == PARETO_COLUMNS
    assert list(t.method) == ["adamw", "mofo", "mofo", "l1", "l2", "hma", "hma", "fine-tune"]
    assert list(t.setting) == ["—", "fraction 0.3", "fraction 1", "λ1 0.001", "λ2 1", "α 0/0", "α 0.5/0.2", "ft0"]
    adam, mofo1 = t.iloc[0], t.iloc[2]
    assert abs(adam.general_loss - mofo1.general_loss) < 1e-5                 # MoFO at fraction 1 is AdamW
    hma0 = t.iloc[5]
    assert hma0.distance == 0.0                                               # HMA at α = 0 is the base
    assert t.distance.iloc[-1] > 0
    # each front, recomputed by hand (exact match up, answer loss down, general loss down)
    for flags, s in (("pareto_exact_match", t.speciality), ("pareto_answer_loss", -t.answer_loss)):
        for i in range(len(t)):
            beaten = any(s[j] >= s[i] and t.general_loss[j] <= t.general_loss[i]
                         and (s[j] > s[i] or t.general_loss[j] < t.general_loss[i]) for j in range(len(t)))
            assert bool(t[flags][i]) == (not beaten), (flags, i)
    chosen = "pareto_exact_match" if front_column(t)[0] == "speciality" else "pareto_answer_loss"
    assert list(t.pareto) == list(t[chosen])
    fig = pareto_figure(t)
    names = [tr.name for tr in fig.data]
    methods = ["adamw", "mofo", "l1", "l2", "hma", "fine-tune"]
    assert names == methods + ["Pareto front"] + methods + ["Pareto front"]
    assert len(fig.data[6].x) == int(t.pareto_exact_match.sum()) and len(fig.data[-1].x) == int(
        t.pareto_answer_loss.sum())


# ------------------------------------------------------------------------------------- the verdicts


def _records(rows):
    """A hand-made forgetting-vs-distance table: (optimizer, step, distance, forgetting) per row."""
    return pd.DataFrame([dict(optimizer=o, step=st, distance=d, general_loss=3.0 + f, forgetting=f, speciality=0.5,
                              answer_loss=1.0) for o, st, d, f in rows])


def test_spearman_by_hand():
    t = _records([("a", 0, 0.0, 0.0), ("a", 1, 0.1, 0.02), ("a", 2, 0.2, 0.01), ("a", 3, 0.3, 0.05)])
    assert spearman(t) == pytest.approx(0.8)                  # ranks 1 2 3 4 vs 1 3 2 4: 1 − 6·2/(4·15)
    assert math.isnan(spearman(t.head(2)))


def test_distance_verdict_both_ways():
    good = _records([(o, st, d * k, d * k * 0.1) for o, k in (("adamw", 1.0), ("lion", 2.0), ("mofo-0.2", 0.5))
                     for st, d in ((0, 0.0), (1, 0.1), (2, 0.2), (3, 0.3))])
    v = distance_verdict(good)
    assert v.holds is True and "adamw +1.00" in v.measured and "mofo-0.2 0.1500 vs adamw 0.3000" in v.measured
    further = good.copy()
    further.loc[further.optimizer == "mofo-0.2", "distance"] *= 4           # MoFO ends further out
    v = distance_verdict(further)
    assert v.holds is False and "closer" in v.reason and "forget less" not in v.reason
    flat = good.copy()
    flat.loc[flat.optimizer == "lion", "forgetting"] = [0.0, 0.3, 0.2, 0.1]   # ρ = 0.2 < RHO_MIN for Lion
    v = distance_verdict(flat)
    assert v.holds is False and "in lion" in v.reason and RHO_MIN > 0.2
    assert distance_verdict(good[good.optimizer != "mofo-0.2"]).holds is None


def _points(rows):
    """A hand-made mofo-pareto table: (method, setting, speciality, general_loss, pareto) per row."""
    return pd.DataFrame([dict(method=m, setting=st, speciality=s, answer_loss=1.0, general_loss=g, distance=0.1,
                              pareto=p) for m, st, s, g, p in rows])


def test_the_front_is_taken_on_answer_loss_where_exact_match_ranks_no_fine_tune():
    t = _points([("adamw", "—", 1.0, 3.5, None), ("mofo", "fraction 0.1", 1.0, 3.1, None),
                 ("l2", "λ2 10", 1.0, 3.0, None), ("hma", "α 0.5/0.5", 0.5, 2.9, None)])
    t["answer_loss"] = [0.001, 0.002, 0.05, 0.9]
    assert front_column(t) == ("answer_loss", False)                      # every fine-tune at exact match 1
    marked = mark_front(t)
    assert list(marked.pareto_exact_match) == [False, False, True, True]  # ties: only the lowest loss survives
    assert list(marked.pareto_answer_loss) == [True, True, True, True]
    assert list(marked.pareto) == list(marked.pareto_answer_loss)
    v = pareto_verdict(marked)
    assert v.holds is True and v.measured.startswith("On answer loss: 1 of 1") and "exact match" in v.measured
    t.loc[1, "speciality"] = 0.9                                           # now exact match tells them apart
    assert front_column(t) == ("speciality", True)
    assert front_column(t.assign(speciality=0.0)) == ("answer_loss", False)   # nothing answers exactly


def test_pareto_verdict_both_ways():
    good = _points([("adamw", "—", 0.9, 3.5, True), ("mofo", "fraction 0.1", 0.8, 3.1, True),
                    ("mofo", "fraction 0.5", 0.85, 3.3, False), ("hma", "α 0.5/0.5", 0.5, 3.0, True)])
    v = pareto_verdict(good)
    assert v.holds is True and v.measured.startswith("On exact match: 1 of 2 MoFO settings on the front (fraction 0.1)")
    bad = good.copy()
    bad.loc[1, "pareto"] = False
    v = pareto_verdict(bad)
    assert v.holds is False and "0 of 2" in v.measured and "dominated" in v.reason
    assert pareto_verdict(good[good.method != "mofo"]).holds is None


# ------------------------------------------------------------------------------------- the CLI


def test_cli_writes_each_studys_table_and_figure(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    small = ["--steps", "2", "--batch-size", "4", "--warmup", "0", "--max-general", "2", "--max-task", "2",
             "--max-train", "8", "--device", "cpu"]
    runs = {"forgetting-vs-distance": ["--eval-every", "1"],
            "mofo-pareto": ["--model", "ft0", "--fractions", "0.5", "--l1s", "0.001", "--l2s", "1",
                            "--hma", "0.5,0.2"]}
    for name, extra in runs.items():
        out = tmp_path / name
        assert main(["study", name, str(tiny_llama.pool_yaml), *small, *extra, "--out", str(out),
                     "--no-save"]) == 0, name
        table = pd.read_csv(out / "table.csv")
        assert len(table) == (9 if name == "forgetting-vs-distance" else 6), name
        assert "plotly" in (out / "figure.html").read_text()[:200000].lower()
