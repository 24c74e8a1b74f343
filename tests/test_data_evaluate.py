"""Probe data parsing and the scorecard, checked against numbers computed another way."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from forgetlab.core.data import IGNORE, TaskPair, encode_pairs, encode_text, read_general_text, read_task_pairs
from forgetlab.core.errors import ProbeDataError
from forgetlab.core.evaluate import evaluate, task_score
from forgetlab.core.pool import ModelPool


def test_task_files_jsonl_and_csv(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "a", "answer": "b"}\n')
    assert read_task_pairs(tmp_path / "t.jsonl") == [TaskPair("1+1=", "2"), TaskPair("a", "b")]
    (tmp_path / "t.csv").write_text('prompt,answer\n"x, y",z\n')
    assert read_task_pairs(tmp_path / "t.csv") == [TaskPair("x, y", "z")]


@pytest.mark.parametrize("content,match", [
    ("", "holds no task pairs"),
    ('{"prompt": "1"}\n', "line 1 lacks 'prompt' or 'answer'"),
    ('{"prompt": "1", "answer": "2"}\nnot json\n', "line 2 is not valid JSON"),
])
def test_malformed_task_files(tmp_path, content, match):
    (tmp_path / "t.jsonl").write_text(content)
    with pytest.raises(ProbeDataError, match=match):
        read_task_pairs(tmp_path / "t.jsonl")


def test_bad_csv_and_empty_text(tmp_path):
    (tmp_path / "t.csv").write_text("question,reply\na,b\n")
    with pytest.raises(ProbeDataError, match="columns 'prompt' and 'answer'"):
        read_task_pairs(tmp_path / "t.csv")
    (tmp_path / "g.txt").write_text("\n\n  \n")
    with pytest.raises(ProbeDataError, match="holds no text"):
        read_general_text(tmp_path / "g.txt")
    with pytest.raises(ProbeDataError, match="does not exist"):
        read_general_text(tmp_path / "missing.txt")


def test_pair_encoding_labels_only_the_answer(tiny_llama):
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    tok = pool.tokenizer
    ex = encode_pairs(tok, [TaskPair("copy red:", "red")])[0]
    answer = tok("red", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert ex.labels[-len(answer):] == answer
    assert all(l == IGNORE for l in ex.labels[:-len(answer)])
    assert ex.input_ids[-len(answer):] == answer


def test_general_loss_equals_transformers_loss(tiny_llama):
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    model, tok = pool.load("ft0"), pool.tokenizer
    text = pool.probes.general[:1]
    card = evaluate(model, tok, pool.probes, tasks=[], block_size=10_000)
    ids = torch.tensor([encode_text(tok, pool.probes.general, 10_000)[0].input_ids])
    with torch.no_grad():
        ref = model(input_ids=ids, labels=ids).loss
    assert card.general_loss == pytest.approx(float(ref), rel=1e-5)
    assert card.perplexity == pytest.approx(math.exp(float(ref)), rel=1e-5)
    assert card.general_tokens == ids.shape[1] - 1
    assert text


def _train_copy(pool, steps=150):
    model = pool.load("ft1")
    tok = pool.tokenizer
    examples = encode_pairs(tok, pool.probes.task("copy").train)
    from forgetlab.core.data import collate

    batch = collate(examples, tok.pad_token_id)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    model.train()
    for _ in range(steps):
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model


def test_exact_match_agrees_with_greedy_decoding_and_manual_loss(tiny_llama):
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml, scan_nonfinite=False)
    tok = pool.tokenizer
    model = _train_copy(pool)
    pairs = pool.probes.task("copy").eval + pool.probes.task("math").eval
    verdicts, losses = [], []
    for pair in pairs:
        ex = encode_pairs(tok, [pair])[0]
        n_ans = sum(l != IGNORE for l in ex.labels)
        prompt = torch.tensor([ex.input_ids[:-n_ans]])
        with torch.no_grad():
            gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n_ans,
                                 do_sample=False, pad_token_id=tok.pad_token_id)
            logits = model(torch.tensor([ex.input_ids])).logits[0, :-1]
        verdicts.append(gen[0, prompt.shape[1]:].tolist() == ex.input_ids[-n_ans:])
        labels = torch.tensor(ex.labels[1:])
        losses.append(F.cross_entropy(logits[labels != IGNORE], labels[labels != IGNORE], reduction="none"))
    got = task_score(model, tok, "mixed", pairs, batch_size=5)
    assert got.exact_match == pytest.approx(sum(verdicts) / len(verdicts))
    assert 0 < sum(verdicts[:8]), "the trained model should copy at least one word"
    assert got.answer_loss == pytest.approx(float(torch.cat(losses).mean()), rel=1e-5)
