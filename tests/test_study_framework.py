"""The studies' frame (forgetlab.analysis.study, issue 45): `forgetlab study --list`, a study's CLI run writing
table.csv and figure.html, its saved run reopened, the claim measured both ways, and a study run from its page.
sfa-frequency is the study these checks run (its own behaviour: test_sfa_frequency_*)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from forgetlab import cli
from forgetlab.analysis.base import ANALYSES
from forgetlab.analysis.study import STUDY_PAGES, StudyInfo, StudyResult, Verdict, studies, study_names
from forgetlab.analysis.studies.sfa import SfaFrequencySettings, verdict
from forgetlab.core.errors import ParameterError
from tests.jobs_helper import finish_cleanly, start_page

ISSUE_NAMES = ["mofo-hft", "mofo-filters", "mofo-lion", "mofo-partitions", "mofo-pareto", "forgetting-vs-distance",
               "pcb-ratio", "pcb-activation", "pcb-self", "sfa-frequency", "nls-draws", "slwm-data", "slwm-models",
               "fapm-relative"]


def test_list_prints_every_study_one_a_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["study", "--list"])
    assert exit_.value.code == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == sorted(study_names()) and "sfa-frequency" in printed
    assert set(printed) <= set(ISSUE_NAMES)             # only the issue's names
    for name in printed:
        a = ANALYSES.get(f"study-{name}")
        assert a.words == ("study", name) and a.study.page in STUDY_PAGES
        assert a.study.claim and a.study.artifact and a.study.paper


def test_a_study_on_an_unknown_page_is_refused():
    with pytest.raises(ParameterError, match="page must be one of"):
        StudyInfo(name="x", paper="p", artifact="Table 1", claim="c", page="models", title="t")


def test_a_result_round_trips_with_its_nans():
    table = pd.DataFrame({"label": ["adamw", "sfa-p1"], "p": [float("nan"), 1.0], "speciality": [0.5, 0.25]})
    r = StudyResult("sfa-frequency", table, Verdict("x", False, "why"), {"ps": [1.0]}, 3.5)
    back = StudyResult.from_dict(r.to_dict())
    pd.testing.assert_frame_equal(back.table, table)
    assert back.verdict == r.verdict and back.seconds == 3.5 and back.recipe == {"ps": [1.0]}


def _table(rows):
    return pd.DataFrame(rows, columns=["label", "p", "speciality", "answer_loss", "general_loss"])


def test_sfa_verdict_both_ways_by_hand():
    # p = 0.25 keeps p = 1's exact match at a lower general loss: the claim holds.
    holds = verdict(_table([("adamw", float("nan"), 0.6, 1.0, 4.0), ("sfa-p0.25", 0.25, 0.5, 1.2, 3.1),
                            ("sfa-p1", 1.0, 0.5, 1.1, 3.3)]))
    assert holds.holds is True and "p = 0.25" in holds.measured
    # every p < 1 loses exact match against p = 1: it does not.
    fails = verdict(_table([("sfa-p0.25", 0.25, 0.3, 1.2, 3.0), ("sfa-p1", 1.0, 0.5, 1.1, 3.3)]))
    assert fails.holds is False and fails.reason
    # no run answers exactly: the answer loss (lower is better) decides — p = 0.5 is ahead of p = 1.
    loss = verdict(_table([("sfa-p0.5", 0.5, 0.0, 1.0, 3.2), ("sfa-p1", 1.0, 0.0, 1.1, 3.3)]))
    assert loss.holds is True and "answer loss" in loss.measured
    assert verdict(_table([("sfa-p0.5", 0.5, 0.0, 1.0, 3.2)])).holds is None        # no p = 1 to compare


def test_sfa_frequency_from_the_cli_writes_its_table_and_figure(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    code = cli.main(["study", "sfa-frequency", str(tiny_llama.pool_yaml), "--steps", "4", "--ps", "0.25,1",
                     "--max-general", "4", "--max-task", "4", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "averaging once at the end" in printed and "Measured here: p = 1:" in printed
    table = pd.read_csv(out / "table.csv")
    assert list(table.label) == ["adamw", "sfa-p0.25", "sfa-p1"]
    assert math.isnan(table.p[0]) and list(table.p[1:]) == [0.25, 1.0]
    # SFA pulls the weights back toward the start: the more often, the closer the end stays to the base.
    assert table.distance[1] < table.distance[2] < table.distance[0]
    html = (out / "figure.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "plotly" in html and "averaging frequency p" in html
    [run] = ANALYSES.get("study-sfa-frequency").list(tmp_path / "home")
    again = ANALYSES.get("study-sfa-frequency").load(run.path)
    pd.testing.assert_frame_equal(again.table.reset_index(drop=True), table, check_dtype=False, atol=1e-12)
    assert again.verdict.measured in printed and again.recipe["ps"] == [0.25, 1.0]


def test_bad_p_grid_is_refused_before_training(tiny_llama, capsys):
    with pytest.raises(SystemExit) as exit_:              # argparse: outside the declared range
        cli.main(["study", "sfa-frequency", str(tiny_llama.pool_yaml), "--ps", "0.5,1.5"])
    assert exit_.value.code == 2 and "ps must be in [0, 1]; got 1.5" in capsys.readouterr().err
    assert cli.main(["study", "sfa-frequency", str(tiny_llama.pool_yaml), "--ps", "0,1"]) == 2    # p = 0: never
    assert "(0, 1]" in capsys.readouterr().err


def test_the_finetune_page_runs_a_study_and_draws_its_figure(tiny_llama, tmp_path, monkeypatch):
    at = start_page("finetune", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    names = at.selectbox(key="finetune_study_pick").options
    assert any(n.startswith("sfa-frequency") for n in names)
    at.selectbox(key="finetune_study_pick").set_value("sfa-frequency").run()
    assert at.selectbox(key="study_sfa_frequency_task").value == "math"
    at.text_input(key="study_sfa_frequency_ps").set_value("0.5, 1").run()
    at.button(key="study_sfa_frequency_run").click().run()
    finish_cleanly(at, "study_sfa_frequency")
    figures = at.get("plotly_chart")
    assert any("averaging frequency p" in str(f.proto.spec) for f in figures)
    assert any("The paper's claim" in m.value for m in at.markdown)
    assert [a.name for a in studies("finetune")] == sorted(a.name for a in studies("finetune"))


def test_the_pools_warmup_never_outlasts_the_steps_asked(monkeypatch):
    import forgetlab.analysis.studies.finetunes as finetunes
    from forgetlab.train.defaults import FinetuneDefaults

    monkeypatch.setattr(finetunes, "finetune_defaults",
                        lambda pool, task: FinetuneDefaults(steps=80, batch_size=32, lr=1e-3, warmup=8, source="zoo"))
    s = SfaFrequencySettings(task="math")
    assert finetunes.budget_of(None, s) == {"steps": 80, "batch_size": 32, "lr": 1e-3, "warmup": 8}
    assert finetunes.budget_of(None, SfaFrequencySettings(task="math", steps=4))["warmup"] == 4
    assert finetunes.budget_of(None, SfaFrequencySettings(task="math", steps=4, warmup=2))["warmup"] == 2
    with pytest.raises(ParameterError, match="--warmup 6 is longer than --steps 4"):
        finetunes.check_task(SfaFrequencySettings(task="math", steps=4, warmup=6))
