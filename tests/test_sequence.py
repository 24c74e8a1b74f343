"""Task sequences (forgetlab.train.sequence, the `sequence` analysis): the chains' invariants, the merge chain against
`forgetlab merge`, the CLI's files and its refusals."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from forgetlab.analysis.base import ANALYSES
from forgetlab.cli import main
from forgetlab.core.checkpoints import load_model
from forgetlab.core.pool import ModelPool
from forgetlab.core.workspace import list_runs
from forgetlab.train.defaults import FinetuneDefaults
from forgetlab.train.results import FinetuneConfig
from forgetlab.train.runs import finetune
from forgetlab.train.sequence import (ChainOptions, Strengths, merge_chain, replay_examples, run_chain, run_sequence,
                                      score_model)
from forgetlab.train.sequence_results import MATRIX_COLUMNS, SequenceResult

STEPS = 4
BUDGET = FinetuneDefaults(steps=STEPS, batch_size=4, lr=5e-3, warmup=1)


def options(order, **kw) -> ChainOptions:
    """Small, fast chains: 4 steps of batch 4 per stage, 6 train pairs, scoring on 4 pairs and 2 blocks."""
    return ChainOptions(budgets={t: BUDGET for t in order}, lora_budgets={t: BUDGET for t in order}, max_train=6,
                        max_general=2, max_task=4, **kw)


def weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def adamw_chain(pool):
    """The plain AdamW chain math → copy on the tiny Llama pool, with its final weights."""
    chain, model = run_chain(pool, ["math", "copy"], "adamw", Strengths(), options(["math", "copy"]),
                             return_model=True)
    return chain, weights(model)


def test_a_one_stage_sequence_is_the_fine_tune_pages_run(pool):
    chain, model = run_chain(pool, ["math"], "adamw", Strengths(), options(["math"]), return_model=True)
    config = FinetuneConfig(steps=STEPS, batch_size=4, lr=5e-3, warmup=1, seed=0)
    run, ft_model = finetune(pool, "math", config, max_train=6, max_general=2, max_task=4, eval_tasks=["math"],
                             return_model=True)
    assert same_weights(weights(model), weights(ft_model))
    stage = chain.stages[0]
    assert stage.exact_match["math"] == run.final.tasks["math"].exact_match
    assert stage.answer_loss["math"] == run.final.tasks["math"].answer_loss
    assert stage.general_loss == run.final.general_loss
    assert stage.distance_to_base == pytest.approx(run.train.history[-1]["distance"], rel=1e-6)


@pytest.mark.parametrize("method,strengths", [("proximal", Strengths(proximal=0.0)), ("replay", Strengths(replay=0.0)),
                                              ("ewc", Strengths(ewc=0.0))])
def test_a_fix_at_strength_zero_is_the_adamw_chain(pool, adamw_chain, method, strengths):
    chain, model = run_chain(pool, ["math", "copy"], method, strengths, options(["math", "copy"]), return_model=True)
    assert same_weights(weights(model), adamw_chain[1])
    for ours, theirs in zip(chain.stages, adamw_chain[0].stages):
        assert (ours.exact_match, ours.answer_loss, ours.general_loss) == \
               (theirs.exact_match, theirs.answer_loss, theirs.general_loss)


def test_each_fix_changes_the_chain(pool, adamw_chain):
    """The fixes are not silently off: at their defaults each ends on other weights than AdamW."""
    for method in ("mofo", "sfa", "proximal", "ewc", "replay", "hft", "l2-init", "lora"):
        _, model = run_chain(pool, ["math", "copy"], method, Strengths(proximal=50.0, ewc=1e6, l2=50.0, replay=1.0),
                             options(["math", "copy"]), return_model=True)
        assert not same_weights(weights(model), adamw_chain[1]), method


def test_stage_two_starts_from_stage_one(pool, adamw_chain):
    chain = adamw_chain[0]
    assert [s.after_task for s in chain.stages] == ["math", "copy"]
    assert chain.stages[0].distance_to_previous == pytest.approx(chain.stages[0].distance_to_base, rel=1e-5)
    assert 0 < chain.stages[1].distance_to_previous
    assert all(math.isfinite(s.general_loss) for s in chain.stages)


def test_replay_draws_a_share_of_the_earlier_tasks():
    earlier = [list(range(10)), list(range(100, 110))]
    picked = replay_examples(earlier, n_current=8, share=0.5, seed=3)
    assert len(picked) == 4 and len(set(picked)) == 4
    assert set(picked) <= set(earlier[0]) | set(earlier[1])
    assert picked == replay_examples(earlier, 8, 0.5, seed=3) != replay_examples(earlier, 8, 0.5, seed=4)
    assert replay_examples(earlier, 8, 10.0, seed=0) == earlier[0] + earlier[1]   # all there are
    assert replay_examples([], 8, 0.5, seed=0) == []


def test_the_merge_chain_at_T_is_forgetlab_merge(pico_zoo, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    pool = ModelPool.from_yaml(pico_zoo.pool_yaml)
    order = ["math", "code"]
    chain = merge_chain(pool, order, "task_arithmetic", options(order))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"method": "task_arithmetic", "base": str(pool.base_ref),
                                      "models": [str(pool.entries["math"].ref), str(pool.entries["code"].ref)]}))
    assert main(["merge", str(recipe), str(tmp_path / "merged")]) == 0
    merged = load_model(tmp_path / "merged", dtype=torch.float32)
    again = score_model(merged, pool, order, stage=2, after_task="code", max_general=2, max_task=4)
    last = chain.stages[-1]
    assert (last.exact_match, last.answer_loss, last.general_loss) == \
           (again.exact_match, again.answer_loss, again.general_loss)
    assert chain.method == "merge:task_arithmetic" and len(chain.stages) == 2


def test_run_sequence_scores_the_base_once_and_shares_it(pool, monkeypatch):
    import forgetlab.train.sequence as seq

    calls = []
    real = seq.score_model
    monkeypatch.setattr(seq, "score_model", lambda *a, **k: calls.append(k["stage"]) or real(*a, **k))
    result = run_sequence(pool, ["math", "copy"], ["adamw", "mofo"], options=options(["math", "copy"]))
    assert calls.count(0) == 1 and len(calls) == 1 + 2 * 2
    assert result.methods == ["adamw", "mofo"]
    assert result.matrix("adamw").shape == (3, 2)
    assert (result.matrix("adamw")[0] == result.matrix("mofo")[0]).all()
    again = SequenceResult.from_dict(result.to_dict())
    pd.testing.assert_frame_equal(again.summary_frame(), result.summary_frame())


def test_the_cli_writes_matrix_and_summary(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    out = tmp_path / "seq"
    code = main(["sequence", str(tiny_llama.pool_yaml), "--order", "math,copy", "--compare", "adamw,sfa",
                 "--steps", "2", "--batch-size", "2", "--lr", "1e-3", "--max-train", "4", "--max-task", "3",
                 "--max-general", "2", "--out", str(out)])
    assert code == 0
    matrix = pd.read_csv(out / "matrix.csv", dtype={"after_task": str}).fillna({"after_task": ""})
    assert list(matrix.columns) == list(MATRIX_COLUMNS)
    assert len(matrix) == 2 * 3 * 2 and set(matrix.stage) == {0, 1, 2}
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns) == ["method", "score", "op", "bwt_trace", "bwt_gem", "fwt", "forgetting_math",
                                     "forgetting_copy"]
    assert len(summary) == 4
    runs = list_runs(kind="sequence")
    assert len(runs) == 1
    reopened = ANALYSES.get("sequence").load(runs[0].path)
    pd.testing.assert_frame_equal(reopened.matrix_frame(), matrix, check_dtype=False)


@pytest.fixture
def no_train_pool(tiny_llama, tmp_path):
    spec = yaml.safe_load(tiny_llama.pool_yaml.read_text())
    root = tiny_llama.pool_yaml.parent
    spec["base"] = str(root / "base")
    spec["models"] = {k: str(root / v) for k, v in spec["models"].items()}
    spec["probes"]["general"] = str(root / spec["probes"]["general"])
    spec["probes"]["tasks"] = {t: {s: str(root / f) for s, f in d.items()} for t, d in spec["probes"]["tasks"].items()}
    del spec["probes"]["tasks"]["copy"]["train"]
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("args,says", [
    (["--order", "math"], "at least two tasks"),
    (["--order", "math,nosuch"], "no task 'nosuch'"),
    (["--order", "math,math"], "appears twice"),
    (["--order", "math,copy", "--compare", "adamw,nosuch"], "Unknown sequence method 'nosuch'"),
    (["--order", "math,copy", "--compare", "adamw,adamw"], "named twice"),
])
def test_bad_input_exits_2_saying_what_to_change_and_saves_nothing(tiny_llama, tmp_path, monkeypatch, capsys, args,
                                                                     says):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    assert main(["sequence", str(tiny_llama.pool_yaml), *args, "--out", str(out)]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists() and list_runs(kind="sequence") == []


def test_a_task_without_a_train_split_is_refused(no_train_pool, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    assert main(["sequence", str(no_train_pool), "--order", "math,copy"]) == 2
    err = capsys.readouterr().err
    assert "'copy' has no train split" in err and "train:" in err
    assert list_runs(kind="sequence") == []


def test_an_out_folder_holding_the_files_is_refused_before_any_work_unless_overwrite(tiny_llama, tmp_path, monkeypatch,
                                                                                        capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    out = tmp_path / "seq"
    out.mkdir()
    (out / "summary.csv").write_text("mine\n")
    argv = ["sequence", str(tiny_llama.pool_yaml), "--order", "math,copy", "--steps", "1", "--max-train", "2",
            "--max-task", "2", "--max-general", "1", "--no-save", "--out", str(out)]
    assert main(argv) == 2
    assert "summary.csv exists already" in capsys.readouterr().err and (out / "summary.csv").read_text() == "mine\n"
    (tmp_path / "file").write_text("x")
    assert main([*argv[:-1], str(tmp_path / "file")]) == 2
    assert "is a file; --out names a folder" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0
    assert list(pd.read_csv(out / "summary.csv").columns)[:2] == ["method", "score"]
