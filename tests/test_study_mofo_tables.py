"""MoFO's table studies (forgetlab.analysis.studies.mofo_tables): mofo-hft, mofo-filters, mofo-lion and
mofo-partitions — the runs each one asks for, their tables on a tiny pool (shape, order, facts that must hold),
the verdicts on hand-made tables both ways, the CLI's table.csv and figure.html, and HFT as an option of the
single fine-tune (--hft)."""
from __future__ import annotations

import pandas as pd
import pytest

from forgetlab.analysis.base import ANALYSES
from forgetlab.analysis.finetune import ANALYSIS as FINETUNE, FinetuneSettings, configs_of
from forgetlab.analysis.studies.finetunes import finetune_singles
from forgetlab.analysis.studies.mofo_tables import (COMPARABLE, MofoFiltersSettings, MofoHftSettings,
                                                    MofoLionSettings, MofoPartitionsSettings, comparable,
                                                    filter_runs, filters_verdict, forgets_less, hft_runs,
                                                    hft_verdict, lion_runs, lion_verdict, partition_runs,
                                                    partitions_verdict, rank_sums)
from forgetlab.core.errors import ParameterError
from forgetlab.train.mofo import FILTERS

SMALL = dict(steps=2, batch_size=4, lr=5e-3, warmup=0, max_general=2, max_task=4, max_train=8, device="cpu",
             dtype="float32")
COLUMNS = ["method", "label", "optimizer", "speciality", "answer_loss", "general_loss", "forgetting", "distance",
           "moved", "seconds"]


def _table(rows):
    """A hand-made study table: (method, speciality, answer_loss, general_loss[, moved]) per row."""
    out = [dict(method=r[0], speciality=r[1], answer_loss=r[2], general_loss=r[3], forgetting=r[3] - 3.0,
                moved=r[4] if len(r) > 4 else 0.5) for r in rows]
    return pd.DataFrame(out)


# --------------------------------------------------------------------------------------- the verdicts' rule


def test_comparable_and_forgets_less_by_hand():
    a, b = pd.Series(dict(s=0.96, l=2.0, general_loss=3.1)), pd.Series(dict(s=1.0, l=1.95, general_loss=3.2))
    assert COMPARABLE == 0.05
    assert comparable(a, b, "s", True) and forgets_less(a, b, "s", True)          # 0.96 ≥ 0.95
    assert not comparable(pd.Series(dict(s=0.94)), b, "s", True)
    assert comparable(a, b, "l", False)                                          # 2.0 ≤ 1.95·1.05 = 2.0475
    assert not comparable(pd.Series(dict(l=2.1)), b, "l", False)
    assert not forgets_less(b, a, "s", True)                                     # more general loss
    same = pd.Series(dict(s=1.0, general_loss=3.2))
    assert not forgets_less(same, b, "s", True)                                  # equal loss: not less


def test_hft_verdict_both_ways():
    good = _table([("AdamW", 0.8, 1.0, 3.5), ("MoFO", 0.78, 1.1, 3.2), ("HFT", 0.8, 1.0, 3.3)])
    v = hft_verdict(good)
    assert v.holds is True and "MoFO speciality 0.780" in v.measured
    worse_than_hft = _table([("AdamW", 0.8, 1.0, 3.5), ("MoFO", 0.8, 1.0, 3.4), ("HFT", 0.8, 1.0, 3.3)])
    v = hft_verdict(worse_than_hft)
    assert v.holds is False and "HFT" in v.reason and "AdamW" not in v.reason
    learned_less = _table([("AdamW", 0.8, 1.0, 3.5), ("MoFO", 0.5, 1.0, 3.1), ("HFT", 0.8, 1.0, 3.3)])
    v = hft_verdict(learned_less)
    assert v.holds is False and "more than 5%" in v.reason
    # nobody answers exactly: the answer loss decides (lower is better)
    by_loss = _table([("AdamW", 0.0, 2.0, 3.5), ("MoFO", 0.0, 2.05, 3.2), ("HFT", 0.0, 2.0, 3.3)])
    v = hft_verdict(by_loss)
    assert v.holds is True and "answer loss" in v.measured
    assert hft_verdict(good[good.method != "HFT"]).holds is None


def test_filters_rank_sums_and_verdict_both_ways():
    t = _table([("MoFO", 0.8, 1.0, 3.2, 0.1), ("FLT(g)", 0.7, 1.0, 3.3, 0.3), ("random BCD", 0.9, 1.0, 3.6, 0.6)])
    sums = rank_sums(t, "speciality", True)
    assert sums.to_dict() == {"MoFO": 2 + 1, "FLT(g)": 3 + 2, "random BCD": 1 + 3}
    v = filters_verdict(t)
    assert v.holds is True and "MoFO 0.100" in v.measured and "moves the fewest" in v.measured   # reported
    t2 = _table([("MoFO", 0.8, 1.0, 3.4, 0.5), ("FLT(g)", 0.85, 1.0, 3.3, 0.4), ("random BCD", 0.7, 1.0, 3.5)])
    v = filters_verdict(t2)
    assert v.holds is False and "FLT(g)" in v.reason and "does not move the fewest" in v.measured
    tie = _table([("MoFO", 0.9, 1.0, 3.4), ("FLT(g)", 0.8, 1.0, 3.3)])               # 1 + 2 against 2 + 1
    assert filters_verdict(tie).holds is True


def test_lion_and_partitions_verdicts_both_ways():
    rows = [("Adam", 0.8, 1.0, 3.5), ("Lion", 0.8, 1.0, 3.6), ("MoFO", 0.8, 1.0, 3.3), ("MoFO-Lion", 0.79, 1.0, 3.4)]
    v = lion_verdict(_table(rows))
    assert v.holds is True and "On Adam, MoFO forgets less" in v.measured
    rows[3] = ("MoFO-Lion", 0.79, 1.0, 3.7)
    v = lion_verdict(_table(rows))
    assert v.holds is False and "MoFO-Lion's general loss" in v.reason
    head = _table([("default partitions", 0.8, 1.0, 3.4), ("per-head partitions", 0.78, 1.0, 3.4)])
    assert partitions_verdict(head).holds is True                                # equal loss, comparable
    more = _table([("default partitions", 0.8, 1.0, 3.4), ("per-head partitions", 0.8, 1.0, 3.45)])
    assert partitions_verdict(more).holds is False
    weaker = _table([("default partitions", 0.8, 1.0, 3.4), ("per-head partitions", 0.6, 1.0, 3.3)])
    assert partitions_verdict(weaker).holds is False


# ------------------------------------------------------------------------------------------- the runs asked


def test_each_study_asks_for_its_runs_on_one_budget(pool):
    task = pool.task_names[0]
    hft = hft_runs(pool, MofoHftSettings(task=task, hft=0.5, fraction=0.1, **SMALL))
    assert [m for m, _ in hft] == ["AdamW", "MoFO", "HFT"]
    assert [(c.optimizer, c.hft) for _, c in hft] == [("adamw", 0.0), ("mofo", 0.0), ("adamw", 0.5)]
    assert hft[2][1].label == "adamw+hft-0.5" and hft[1][1].fraction == 0.1
    assert len({(c.steps, c.lr, c.batch_size, c.seed, c.warmup) for _, c in hft}) == 1
    filters = filter_runs(pool, MofoFiltersSettings(task=task, fraction=0.03, **SMALL))
    assert [c.filter for _, c in filters] == list(FILTERS)
    assert {c.fraction for _, c in filters} == {0.03} and {c.optimizer for _, c in filters} == {"mofo"}
    lion = lion_runs(pool, MofoLionSettings(task=task, lion_lr_scale=0.25, **SMALL))
    assert [(m, c.optimizer) for m, c in lion] == [("Adam", "adamw"), ("Lion", "lion"), ("MoFO", "mofo"),
                                                   ("MoFO-Lion", "mofo-lion")]
    assert [c.lr for _, c in lion] == [5e-3, 5e-3 * 0.25, 5e-3, 5e-3 * 0.25]
    parts = partition_runs(pool, MofoPartitionsSettings(task=task, **SMALL))
    assert [c.partition for _, c in parts] == ["tensor", "head"] and parts[1][1].label == "mofo-0.2-heads"
    singles = finetune_singles(pool, MofoHftSettings(task=task, **SMALL), [c for _, c in hft])
    assert [s.hft for _, s in singles] == [0.0, 0.0, 0.5] and {n for n, _ in singles} == {"finetune"}


def test_bad_settings_are_refused(pool):
    task = pool.task_names[0]
    study = ANALYSES["study-mofo-filters"]
    with pytest.raises(ParameterError, match="momentum"):
        study.check(MofoFiltersSettings(task=task, filters=("gradient", "random")), pool)
    with pytest.raises(ParameterError, match="--hft"):
        ANALYSES["study-mofo-hft"].check(MofoHftSettings(task=task, hft=0.0), pool)
    with pytest.raises(ParameterError, match="--fraction"):
        ANALYSES["study-mofo-partitions"].check(MofoPartitionsSettings(task=task, fraction=0.0), pool)
    with pytest.raises(ParameterError, match="lion-lr-scale"):
        ANALYSES["study-mofo-lion"].check(MofoLionSettings(task=task, lion_lr_scale=0.0), pool)


# ------------------------------------------------------------------------------------- the tables, trained


@pytest.fixture(scope="module")
def tables(pool):
    """Each study's table on the tiny pool (two steps per run)."""
    task = pool.task_names[0]
    out = {}
    for name, settings in (("mofo-hft", MofoHftSettings(task=task, **SMALL)),
                           ("mofo-filters", MofoFiltersSettings(task=task, **SMALL)),
                           ("mofo-lion", MofoLionSettings(task=task, **SMALL)),
                           ("mofo-partitions", MofoPartitionsSettings(task=task, **SMALL))):
        study = ANALYSES[f"study-{name}"]
        study.check(settings, pool)
        out[name] = study.compute(pool, settings)
    return out


def test_tables_have_one_row_per_method_in_order(tables):
    methods = {"mofo-hft": ["AdamW", "MoFO", "HFT"],
               "mofo-filters": ["MoFO", "FLT(g)", "FLT(m/√v)", "FLT(g/√v)", "random BCD"],
               "mofo-lion": ["Adam", "Lion", "MoFO", "MoFO-Lion"],
               "mofo-partitions": ["default partitions", "per-head partitions"]}
    for name, result in tables.items():
        t = result.table
        assert list(t.columns) == COLUMNS, name
        assert list(t.method) == methods[name], name
        assert t[["general_loss", "distance", "moved"]].notna().all().all(), name
        assert ((t.distance > 0) & (t.moved > 0) & (t.moved <= 1)).all(), name
        assert result.verdict.holds in (True, False, None) and result.verdict.measured


def test_tables_obey_what_each_method_does(tables):
    hft = tables["mofo-hft"].table.set_index("method")
    assert hft.loc["HFT", "moved"] < hft.loc["AdamW", "moved"]        # frozen matrices never move (no decay)
    assert hft.loc["MoFO", "moved"] < hft.loc["AdamW", "moved"]
    filters = tables["mofo-filters"].table.set_index("method")
    assert (filters.moved < 0.5).all()                                 # 2 steps × 20 % of each filtered tensor
    lion = tables["mofo-lion"].table.set_index("method")
    assert lion.loc["MoFO-Lion", "moved"] < lion.loc["Lion", "moved"]
    assert lion.loc["MoFO", "moved"] < lion.loc["Adam", "moved"]
    parts = tables["mofo-partitions"].table
    assert parts.moved.between(0, 0.5).all() and parts.label.tolist() == ["mofo-0.2", "mofo-0.2-heads"]


def test_the_cli_writes_table_and_figure(pool, tiny_llama, tmp_path, monkeypatch):
    from forgetlab import cli

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    args = ["study", "mofo-partitions", str(tiny_llama.pool_yaml), "--out", str(out), "--no-save",
            "--steps", "1", "--batch-size", "2", "--warmup", "0", "--max-general", "2", "--max-task", "2",
            "--max-train", "4", "--device", "cpu"]
    assert cli.main(args) == 0
    table = pd.read_csv(out / "table.csv")
    assert list(table.method) == ["default partitions", "per-head partitions"]
    assert "plotly" in (out / "figure.html").read_text().lower()


# ----------------------------------------------------------------------------- HFT in the single fine-tune


def test_hft_is_an_option_of_the_single_finetune():
    one = configs_of(FinetuneSettings(task="math", hft=0.5, steps=2, batch_size=2, lr=1e-3, warmup=0))[0]
    assert (one.label, one.optimizer, one.hft) == ("adamw+hft-0.5", "adamw", 0.5)
    assert one.train_kwargs()["hft"] == 0.5
    assert configs_of(FinetuneSettings(task="math", steps=2, batch_size=2, lr=1e-3, warmup=0))[0].hft == 0.0
    mofo = configs_of(FinetuneSettings(task="math", optimizer="mofo", hft=0.25, steps=2, batch_size=2, lr=1e-3,
                                       warmup=0))[0]
    assert (mofo.label, mofo.hft) == ("mofo-0.2+hft-0.25", 0.25)
    with pytest.raises(ParameterError, match="--hft"):
        FINETUNE.check(FinetuneSettings(task="math", compare=True, hft=0.5))
    from forgetlab import cli

    args = cli.build_parser().parse_args(["finetune", "pool.yaml", "--task", "math", "--hft", "0.5"])
    assert args.hft == 0.5
