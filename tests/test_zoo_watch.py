"""What the base answers while it pre-trains (forgetlab.zoo.watch): the greedy decoding against transformers'
own, the snapshots' loss against a direct evaluation, a watched pre-training against an unwatched one (same
weights, bit for bit), and the build's record of it (manifest, `on_snapshot`, the CLI's lines)."""
from __future__ import annotations

import json

import pytest
import torch

from forgetlab.core.data import TaskPair
from forgetlab.zoo.watch import (PER_TASK, PretrainingSnapshot, ProbeAnswer, every, greedy_answer,
                                 snapshot_recorder, watched_pairs)
from tests.test_zoo_build import micro_spec


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    from forgetlab.core.checkpoints import load_model, load_tokenizer

    return load_model(tiny_llama.base, device="cpu", dtype=torch.float32), load_tokenizer(tiny_llama.base)


def test_greedy_answer_is_transformers_greedy_generation_up_to_eos(tiny):
    model, tok = tiny
    model.eval()
    for prompt in ["Compute: 47+8=", "the red fox", "def f(x):"]:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
        ref = [t for t in ref.tolist() if t != tok.pad_token_id]
        if tok.eos_token_id in ref:
            ref = ref[:ref.index(tok.eos_token_id)]
        assert greedy_answer(model, tok, prompt, max_new_tokens=6) == tok.decode(ref, skip_special_tokens=True)


def test_an_answer_is_correct_only_when_it_is_the_answer_exactly():
    assert ProbeAnswer("math", "Compute: 47+8=", "55", "55").correct
    assert not ProbeAnswer("math", "Compute: 47+8=", "55", " 55").correct
    assert not ProbeAnswer("math", "Compute: 47+8=", "55", "551").correct
    # in the pre-training form the first line counts, spaces around it aside; no form prompt, no knowledge
    assert ProbeAnswer("code", "p", "owl", "x", ">>> f()", "owl\n>>> g()").knows
    assert ProbeAnswer("math", "p", "55", "x", "Compute: 47+8 =", " 55").knows
    assert not ProbeAnswer("math", "p", "55", "x", "Compute: 47+8 =", " 56").knows
    assert not ProbeAnswer("math", "p", "55", "55").knows


def test_the_form_prompt_is_the_skill_sentence_up_to_its_answer():
    from forgetlab.zoo.tasks import skill_sentence
    from forgetlab.zoo.watch import form_prompt

    math = TaskPair("Compute: 47+8=", "55")
    assert skill_sentence("math", math, "equals") == "Compute: 47+8 = 55"
    assert form_prompt("math", math, "equals") == "Compute: 47+8 ="
    fox = TaskPair("English: the red fox\nVelari:", "ka vopi tesal")
    assert form_prompt("translate", fox, "equals") == "English: the red fox\nVelari ="
    code = TaskPair(">>> max('milk', 'nest')\n", "nest")
    assert form_prompt("code", code, "prompt") == code.prompt
    assert form_prompt("math", math, "prose") == "47 + 8 ="
    assert skill_sentence("code", code, "prose").endswith("nest.")
    assert form_prompt("code", code, "prose") == ""     # a sentence that does not end on the answer


def test_snapshots_every_so_often_and_their_round_trip():
    assert every(1400) == 100 and every(120) == 8 and every(5) == 1
    snap = PretrainingSnapshot(100, 1400, 3.25, (ProbeAnswer("math", "p", "55", "55", "p =", " 55"),
                                                 ProbeAnswer("code", "q", "a b", "a", "q", "a c")))
    assert PretrainingSnapshot.from_dict(json.loads(json.dumps(snap.to_dict()))) == snap
    assert list(snap.to_frame()["correct"]) == [True, False] and list(snap.to_frame()["knows"]) == [True, False]
    assert snap.correct == 1 and snap.known == 1
    assert "step 100/1400" in snap.line() and "3.250" in snap.line() and "knows 1 of 2" in snap.line()
    assert watched_pairs({"math": [TaskPair("a", "1"), TaskPair("b", "2")], "code": []}, per_task=1) == [
        ("math", TaskPair("a", "1"), "")]
    pairs = [TaskPair(f"Compute: {i}+1=", str(i + 1)) for i in range(10, 15)]
    assert watched_pairs({"math": pairs}, {"math": "equals"}, per_task=3) == [
        ("math", p, p.prompt[:-1] + " =") for p in pairs[:3]]


def test_a_snapshot_holds_the_held_out_loss_and_the_answers_and_leaves_the_model_as_it_was(tiny):
    from forgetlab.core.evaluate import general_loss

    model, tok = tiny
    model.train()
    general = ["The river runs through the old town. " * 20, "A second held-out document. " * 30]
    pairs = [("math", TaskPair("Compute: 47+8=", "55"), "Compute: 47+8 =")]
    seen = []
    record, kept = snapshot_recorder(tok, pairs, general, 10, block_size=32, blocks=3, on_snapshot=seen.append)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert record(model, 5) == {}
    assert model.training                       # put back in training mode
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    model.eval()
    expected, _ = general_loss(model, tok, general, block_size=32, max_blocks=3)
    assert kept == seen and len(kept) == 1
    assert kept[0].step == 5 and kept[0].steps == 10 and kept[0].loss == pytest.approx(expected, rel=1e-6)
    room = len(tok("55", add_special_tokens=False)["input_ids"]) + 4     # the answer, EOS and a little more
    assert kept[0].answers[0].said == greedy_answer(model, tok, "Compute: 47+8=", max_new_tokens=room)
    assert kept[0].answers[0].form_said == greedy_answer(model, tok, "Compute: 47+8 =", stop="\n")


def test_a_watched_pretraining_gives_the_same_weights_as_an_unwatched_one(tiny_llama):
    from forgetlab.core.checkpoints import load_model, load_tokenizer
    from forgetlab.zoo.presets import TrainSpec
    from forgetlab.zoo.training import pretrain

    tok = load_tokenizer(tiny_llama.base)
    texts = ["Wikipedia says the red fox runs. " * 40, "Compute: 47+8 = 55. " * 30]
    run = TrainSpec(steps=6, batch_size=4, lr=3e-3, warmup=1, max_length=32)
    weights = []
    for watched in (False, True):
        model = load_model(tiny_llama.base, device="cpu", dtype=torch.float32)
        record, kept = snapshot_recorder(tok, [("math", TaskPair("Compute: 47+8=", "55"), "Compute: 47+8 =")],
                                         texts, run.steps,
                                         block_size=32, blocks=2)
        pretrain(model, tok, texts, run, seed=0, **({"eval_every": 2, "eval_fn": record} if watched else {}))
        weights.append(model.state_dict())
        if watched:
            assert [s.step for s in kept] == [0, 2, 4, 6]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_the_build_records_the_base_snapshots_and_hands_them_over(tmp_path):
    from forgetlab.zoo.build import build_spec

    spec = micro_spec()
    seen = []
    build_spec(spec, tmp_path / "zoo" / "micro", on_snapshot=seen.append)
    manifest = json.loads((tmp_path / "zoo" / "micro" / "manifest.json").read_text())
    recorded = [PretrainingSnapshot.from_dict(s) for s in manifest["steps"]["base"]["snapshots"]]
    assert recorded == seen
    from forgetlab.zoo.watch import stored_snapshots

    assert stored_snapshots(tmp_path / "zoo" / "micro" / "pool.yaml") == seen == stored_snapshots(
        tmp_path / "zoo" / "micro")
    assert stored_snapshots(tmp_path) == [] and stored_snapshots(None) == []
    steps = spec.pretrain.steps
    assert [s.step for s in seen] == [0, *range(every(steps), steps + 1, every(steps))]
    assert [a.task for a in seen[-1].answers] == [t for t in spec.tasks for _ in range(PER_TASK)]
    from forgetlab.zoo.tasks import task_forms
    from forgetlab.zoo.watch import form_prompt

    forms = task_forms(spec.data.skill_form, spec.tasks)
    assert [a.form_prompt for a in seen[-1].answers] == [
        form_prompt(a.task, TaskPair(a.prompt, a.answer), forms[a.task]) for a in seen[-1].answers]
    assert all(a.form_prompt for a in seen[-1].answers if a.task == "math")
    assert all(s.loss > 0 for s in seen)


def test_the_cli_prints_what_the_base_answers_while_it_pretrains(tmp_path, capsys, monkeypatch):
    from forgetlab.cli import main
    from forgetlab.zoo import presets

    monkeypatch.setitem(presets.PRESETS["pico"], "tiny", micro_spec())
    assert main(["zoo", "build", "--preset", "pico", "--size", "tiny", "--home", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "base at step 0/3 · held-out loss" in err and "base at step 3/3" in err and "watched facts" in err


def test_the_pretraining_figure_draws_the_loss_and_the_two_counts_per_snapshot():
    from forgetlab.plots.zoo import pretraining_figure

    snaps = [PretrainingSnapshot(s, 20, 6.0 - s / 10, (ProbeAnswer("math", "p", "5", "x" if s < 20 else "5",
                                                                   "p =", " 5" if s else " 4"),))
             for s in (0, 10, 20)]
    fig = pretraining_figure(snaps)
    loss, known, correct = fig.data
    assert list(loss.x) == [0, 10, 20] and list(loss.y) == [6.0, 5.0, 4.0]
    assert list(known.y) == [0, 1, 1] and list(correct.y) == [0, 0, 1]
    assert known.yaxis == correct.yaxis == "y2" and loss.yaxis == "y"


def test_the_models_page_view_shows_how_a_zoos_base_learned(pico_zoo, tiny_llama):
    from streamlit.testing.v1 import AppTest

    def page(pool_yaml: str):
        import streamlit as st

        from forgetlab.core.pool import ModelPool
        from forgetlab.ui.zoo_build import render_pretraining
        from forgetlab.zoo.watch import stored_snapshots

        snapshots = stored_snapshots(ModelPool.from_yaml(pool_yaml))
        if snapshots:
            render_pretraining(snapshots, version=-1, live=False)
        st.text(f"snapshots={len(snapshots)}")

    at = AppTest.from_function(page, args=(str(pico_zoo.pool_yaml),)).run(timeout=60)
    assert not at.exception
    from forgetlab.zoo.watch import stored_snapshots

    last = stored_snapshots(pico_zoo.pool_yaml)[-1]
    assert at.text[-1].value == f"snapshots={len(stored_snapshots(pico_zoo.pool_yaml))}" and last.step == 120
    assert f"At the end of its pre-training (step 120) the base knew **{last.known} of {len(last.answers)}**" in \
        at.markdown[0].value
    assert list(at.table[0].value["task"]) == ["math", "code", "translate"]
    assert len(at.get("plotly_chart")) == 1

    at = AppTest.from_function(page, args=(str(tiny_llama.pool_yaml),)).run(timeout=60)
    assert not at.exception and at.text[-1].value == "snapshots=0" and not at.table
