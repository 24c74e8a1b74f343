"""Fine-tunes on the analysis home (forgetlab.analysis.finetune): one function names the runs for the CLI and the
page, the single-run comparison is the same wherever it is made, forgetting comes from `Scorecard.forgetting`, and
saved fine-tunes — also those saved before the move — reopen on the Runs page in the session's measure."""
from __future__ import annotations

import math

import pytest

from forgetlab.analysis.base import ANALYSES, analysis_for_kind
from forgetlab.analysis.finetune import ANALYSIS, FinetuneSettings, configs_of
from forgetlab.core.errors import ParameterError
from forgetlab.core.evaluate import Scorecard, TaskScore
from forgetlab.core.workspace import list_runs, save_run
from forgetlab.train.results import FinetuneComparison, FinetuneConfig, FinetuneRun, single_run_comparison
from forgetlab.train.trainer import TrainResult
from forgetlab.ui.runs import compare_figures, run_figures


def _card(general: float, em: float, loss: float) -> Scorecard:
    return Scorecard("m", general, math.exp(general), 100, {"math": TaskScore("math", em, loss, 5)})


def _run(label: str, general: float, em: float) -> FinetuneRun:
    cards = [_card(2.0, 0.0, 3.0), _card(general, em, 2.0)]
    history = [{"step": s, "distance": d, "general_loss": c.general_loss, "exact_match": c.tasks["math"].exact_match,
                "answer_loss": c.tasks["math"].answer_loss, "scorecard": c.to_dict()}
               for s, d, c in ((0, 0.0, cards[0]), (2, 0.01, cards[1]))]
    train = TrainResult(steps=2, completed_steps=2, losses=[1.0, 0.8], lrs=[1e-3, 5e-4], history=history)
    return FinetuneRun(FinetuneConfig(label=label), "math", "base", train, final=cards[1], start_card=cards[0])


def test_one_function_names_the_runs_of_the_cli_and_the_page():
    one = configs_of(FinetuneSettings(task="math", optimizer="mofo", l2=0.5, lora=4, steps=3))
    assert [c.label for c in one] == ["lora4-mofo-0.2+l2-0.5"] and one[0].lora == 4 and one[0].steps == 3
    assert configs_of(FinetuneSettings(task="math", sfa_p=0.5, l1=0.01))[0].label == "adamw+sfa-p0.5+l1-0.01"
    both = configs_of(FinetuneSettings(task="math", compare=True, l2=0.0, lora=2, lora_targets=("q_proj",)))
    assert [c.label for c in both] == ["adamw", "mofo-0.2", "sfa-p0.25", "l2-1", "l1-0.001"]
    assert all(c.lora == 2 and c.lora_targets == ["q_proj"] for c in both)


def test_settings_refuse_what_a_fine_tune_would_ignore():
    for values, message in [({"lora_alpha": 8.0}, "apply only to a LoRA fine-tune"),
                            ({"compare": True, "save_as": "x"}, "--save-as saves one run"),
                            ({"measure": "nope"}, "Unknown speciality measure"),
                            ({"lora": 2, "lora_targets": ()}, "lora_targets is empty")]:
        with pytest.raises(ParameterError, match=message):
            ANALYSIS.check(FinetuneSettings(task="math", **values))


def test_a_single_run_is_one_comparison_with_its_measures_and_forgetting_from_the_scorecards():
    run = _run("adamw", 2.5, 0.4)
    comp = single_run_comparison(run, "answer_loss", "general_loss")
    assert comp.recipe == {"task": "math", "start": "base", "configs": [run.config.to_dict()],
                           "measure": "answer_loss", "general_measure": "general_loss"}
    assert run.pareto and run.forgetting == run.final.forgetting(run.start_card) == 0.5
    assert comp.to_frame()["forgetting"].item() == 0.5


def test_saved_fine_tunes_reopen_and_compare_in_the_session_measure(tmp_path):
    assert analysis_for_kind("finetune") is ANALYSIS and ANALYSES.get("finetune") is ANALYSIS
    new = single_run_comparison(_run("mofo-0.2", 2.2, 0.6))
    ANALYSIS.save(new, home_path=tmp_path)
    # saved before the move: a single run's recipe without the measures or the pool
    old = FinetuneComparison("math", "base", [_run("adamw", 2.5, 0.4)], {"task": "math", "start": "base",
                                                                         "configs": [FinetuneConfig().to_dict()]})
    save_run("finetune", dict(old.recipe), old.to_dict(), frame=old.to_frame(), home_path=tmp_path)
    runs = list_runs(tmp_path)
    for run in runs:
        assert ANALYSIS.load(run.path).runs[0].task == "math"
        for measure, title in (("answer_loss", "math answer loss (nats) ↓"), ("exact_match", "math exact match ↑")):
            figs = run_figures(run, measure)
            assert len(figs) == 3 and figs[0].layout.annotations[1].text == title
    figs = compare_figures(runs, "answer_loss")
    assert len(figs) == 2 and figs[0].layout.annotations[1].text == "math answer loss (nats) ↓"
    assert {"AdamW", "MoFO 0.2"} <= {t.name for t in figs[1].data}
