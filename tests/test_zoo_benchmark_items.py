"""The zoo's lm-eval items can tell the models apart: a multiple-choice item is not solved by copying a word of its
prompt (the code task's answers are words of its prompt: with random distractors every model scored 0.85), and a
benchmark on which every model scores the same is left out of the Models page's table, saying so."""
from __future__ import annotations

import re

import pytest

from forgetlab.core.benchmarks import BenchmarkTable
from forgetlab.zoo.lmtasks import N_CHOICES, choice_items, prompt_distractors
from forgetlab.zoo.tasks import make_task


def _copying_accuracy(items: list[dict]) -> float:
    """The expected accuracy of a model that only copies: it picks at random among the choices its prompt writes
    (among all the choices when the prompt writes none)."""
    total = 0.0
    for item in items:
        written = [i for i, c in enumerate(item["choices"])
                   if re.search(r"\b" + re.escape(c.strip()) + r"\b", item["context"])] or range(len(item["choices"]))
        total += (item["label"] in written) / len(written)
    return total / len(items)


def test_code_items_are_not_solved_by_copying_the_prompt():
    code = make_task("code", n_train=200, n_probe=16, n_eval=100, code_level="words")
    items = choice_items(code.eval)
    assert len(items) == 100 and all(len(i["choices"]) == N_CHOICES for i in items)
    assert all(i["choices"][i["label"]] == p.answer for i, p in zip(items, code.eval))      # the right answer
    assert all(len(set(i["choices"])) == N_CHOICES for i in items)                           # distinct choices
    # every other answer the prompt writes is among the choices: copying cannot single out the right one
    answers = sorted({p.answer for p in code.eval})
    for item, pair in zip(items, code.eval):
        assert set(prompt_distractors(pair, answers)[:N_CHOICES - 1]) <= set(item["choices"])
    assert _copying_accuracy(items) <= 0.6


def test_prompt_distractors_are_the_other_answers_the_prompt_writes():
    from forgetlab.core.data import TaskPair

    pair = TaskPair(">>> ['hat', 'owl', 'ink'][1]\n", "owl")
    assert prompt_distractors(pair, ["hat", "ink", "jam", "owl"]) == ["hat", "ink"]
    assert prompt_distractors(TaskPair("Compute: 47+8=", "55"), ["47", "55", "8", "12"]) == ["47", "8"]


def test_a_benchmark_equal_for_every_model_is_uniform():
    table = BenchmarkTable({"base": {"a": {"acc": 0.85, "acc_norm": 0.8}, "b": {"acc": 0.3}},
                            "ft": {"a": {"acc": 0.85, "acc_norm": 0.8}, "b": {"acc": 0.6}}}, ["a", "b"])
    assert table.uniform_tasks() == ["a"]
    one = BenchmarkTable({"base": {"a": {"acc": 0.85}}}, ["a"])
    assert one.uniform_tasks() == []                       # one model: nothing to tell apart


@pytest.mark.parametrize("flat", [True, False])
def test_the_models_page_leaves_out_a_benchmark_that_cannot_tell_the_models_apart(tiny_llama, tmp_path,
                                                                                 monkeypatch, flat):
    pytest.importorskip("lm_eval")
    from forgetlab.core.workspace import save_run
    from tests.jobs_helper import finish_jobs, open_page
    from tests.test_models_benchmarks import _bench_pool, _bench_frames

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    pool_yaml = _bench_pool(tiny_llama, tmp_path)
    code = {"base": 0.85, "ft0": 0.85, "ft1": 0.85 if flat else 0.9}
    results = {m: {"tiny_cloze": {"acc": 0.25 + 0.1 * i}, "zoo_code": {"acc": code[m], "acc_norm": 0.5}}
               for i, m in enumerate(("base", "ft0", "ft1"))}
    table = BenchmarkTable(results, ["tiny_cloze", "zoo_code"], limit=20)
    save_run("benchmarks", {"pool": str(pool_yaml), "models": list(results)}, table.to_dict(), frame=table.to_frame())
    at = open_page("models", pool_yaml, timeout=120)
    at.run()
    assert not at.exception, at.exception
    shown = _bench_frames(at)[0]
    captions = " ".join(c.value for c in at.caption)
    assert "multiple-choice accuracy" in captions and "exact match" in captions      # what acc is
    if flat:
        assert list(shown.columns) == ["model", "tiny_cloze/acc"]
        assert "Left out: **zoo_code** (acc 0.850, acc_norm 0.500 for all 3 models)" in captions
    else:
        assert list(shown.columns) == ["model", "tiny_cloze/acc", "zoo_code/acc", "zoo_code/acc_norm"]
        assert "Left out" not in captions
    finish_jobs(at, "models")
