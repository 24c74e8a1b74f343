"""Fine-tunes over a pool (forgetlab.train.runs): records, comparison, save into the pool, bad input."""
from __future__ import annotations

import shutil

import pytest
import torch

from forgetlab.core.data import Probes, TaskData, TaskPair
from forgetlab.core.errors import ForgetlabError, TrainingError
from forgetlab.core.evaluate import evaluate
from forgetlab.core.pool import ModelPool
from forgetlab.analysis.finetune import ANALYSIS as FINETUNE
from forgetlab.train.runs import FinetuneConfig, compare, finetune, save_finetuned, standard_configs


def test_finetune_records_generality_speciality_distance(pool):
    run, model = finetune(pool, "math", FinetuneConfig(steps=6, lr=5e-3, batch_size=4), eval_every=3,
                          device="cpu", return_model=True)
    hist = run.trajectory()
    assert list(hist["step"]) == [0, 3, 6]
    assert {"general_loss", "exact_match", "answer_loss", "distance", "copy/exact_match"} <= set(hist.columns)
    base = evaluate(pool.load("base", device="cpu"), pool.tokenizer, pool.probes, name="base")
    assert run.start_card.general_loss == base.general_loss
    assert hist["distance"].iloc[0] == 0.0 and hist["distance"].iloc[-1] > 0
    # the final record is the scorecard of the returned model
    again = evaluate(model, pool.tokenizer, pool.probes, name="again")
    assert run.final.general_loss == pytest.approx(again.general_loss, rel=1e-6)
    assert run.train.losses[-1] < run.train.losses[0]
    # the pool's cached base was not trained
    assert torch.equal(pool.load("base", device="cpu").model.embed_tokens.weight,
                       pool.base.read("model.embed_tokens.weight"))


def test_compare_and_save_reopen(pool, tmp_path):
    configs = standard_configs(steps=4, lr=5e-3, batch_size=4)
    seen = []
    comp = compare(pool, "copy", configs, eval_every=2, max_general=2, device="cpu",
                   on_run=lambda r, c: seen.append(len(c.runs)))
    assert seen == [1, 2, 3, 4, 5]
    assert configs[-1].l1 == 1e-3 and configs[-1].l2 == 0.0  # the L1-to-init baseline of docs/methods.md
    frame = comp.to_frame()
    assert list(frame["label"]) == ["adamw", "mofo-0.2", "sfa-p0.25", "l2-1", "l1-0.001"]
    assert frame["pareto"].any()
    traj = comp.trajectories()
    assert set(traj["label"]) == set(frame["label"]) and set(traj["step"]) == {0, 2, 4}
    # all runs started from the same weights: identical step-0 records
    assert traj[traj.step == 0]["general_loss"].nunique() == 1
    path = FINETUNE.save(comp, home_path=tmp_path)
    back = FINETUNE.load(path)
    assert back.to_frame()[["label", "speciality", "general_loss"]].equals(frame[["label", "speciality", "general_loss"]])


def test_save_finetuned_adds_to_pool_and_yaml(tiny_llama, tmp_path):
    root = tmp_path / "pool"
    shutil.copytree(tiny_llama.root, root)
    p = ModelPool.from_yaml(root / "pool.yaml")
    run, model = finetune(p, "math", FinetuneConfig(steps=2, lr=1e-3, batch_size=4), device="cpu",
                          max_general=1, return_model=True)
    path = save_finetuned(p, model, "ft-math-new", run=run)
    assert path == (root / "finetuned" / "ft-math-new").resolve()
    assert (path / "finetune.json").exists()
    assert "ft-math-new" in p.model_names
    reread = ModelPool.from_yaml(root / "pool.yaml")
    assert "ft-math-new" in reread.model_names
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(reread.checkpoint("ft-math-new").read(name), dict(model.named_parameters())[name].detach())
    with pytest.raises(ForgetlabError, match="already"):
        save_finetuned(p, model, "ft-math-new")


def test_bad_input(pool, tiny_llama):
    with pytest.raises(ForgetlabError, match="no task 'nope'"):
        finetune(pool, "nope", FinetuneConfig(steps=1))
    with pytest.raises(ForgetlabError, match="no model 'ghost'"):
        finetune(pool, "math", FinetuneConfig(steps=1), start="ghost")
    empty = ModelPool(tiny_llama.base, {}, Probes(general=["some text here for the probe."],
                                                  tasks={"x": TaskData("x", eval=[TaskPair("1+1=", "2")])}))
    with pytest.raises(TrainingError, match="no training data"):
        finetune(empty, "x", FinetuneConfig(steps=1))


def test_on_record_sees_every_record(pool):
    seen = []
    run = finetune(pool, "copy", FinetuneConfig(steps=4, batch_size=4), eval_every=2, device="cpu", max_general=1,
                   on_record=lambda step, rec: seen.append((step, rec["exact_match"])))
    assert [s for s, _ in seen] == [0, 2, 4]
    assert [r["exact_match"] for r in run.train.history] == [e for _, e in seen]


def test_comparison_progress_names_each_run(pool):
    """Every message of a comparison says which run it belongs to ("run k of N · label"), and the fraction
    never goes back: the trainer's own "step 1/T" restarts with each run, the comparison's count does not."""
    from forgetlab.executors import LocalExecutor

    configs = standard_configs(steps=2, lr=5e-3, batch_size=4)[:3]
    for executor in (None, LocalExecutor()):
        seen: list[tuple[float, str]] = []
        compare(pool, "copy", configs, eval_every=2, max_general=1, max_task=2, device="cpu", executor=executor,
                progress=lambda f, m="", seen=seen: seen.append((f, m)))
        steps = [(f, m) for f, m in seen if "step " in m]
        expected = [f"run {i} of 3 · {c.label} · step {s}/2" for i, c in enumerate(configs, 1) for s in (1, 2)]
        assert [m.split(" · loss")[0] for _, m in steps] == expected
        fractions = [f for f, _ in seen]
        assert fractions == sorted(fractions) and fractions[-1] == 1.0
        assert any(m.startswith("run 1 of 3 · adamw · loading base") for _, m in seen)
