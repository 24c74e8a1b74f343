"""Issue 30, second pass, probe data: empty answers (item 10), `template: chat` without a chat template
(item 12), and held-out text tokenized only as far as the limits need (item 17)."""
from __future__ import annotations

import json
import random
import shutil

import pytest
import torch

from forgetlab.cli import main
from forgetlab.core import evaluate as evaluate_module
from forgetlab.core.data import EncodedExample, Probes, TaskData, TaskPair, encode_text, read_task_pairs
from forgetlab.core.errors import ProbeDataError
from forgetlab.core.evaluate import evaluate, general_loss, token_losses
from forgetlab.core.pool import ModelPool


def _copy_pool(tiny_llama, tmp_path):
    root = tmp_path / "pool"
    shutil.copytree(tiny_llama.root, root)
    return root


# -- item 10: empty answers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("row", [{"prompt": "", "answer": ""}, {"prompt": "2+2=", "answer": ""},
                                 {"prompt": "2+2=", "answer": None}])
def test_empty_answer_is_refused_naming_file_and_line(tmp_path, row):
    f = tmp_path / "t.jsonl"
    f.write_text('{"prompt": "1+1=", "answer": "2"}\n\n' + json.dumps(row) + "\n")
    with pytest.raises(ProbeDataError, match=r"t\.jsonl, line 3 has an empty answer") as info:
        read_task_pairs(f)
    assert "give every row an answer" in str(info.value)


def test_empty_answer_in_csv_names_the_line(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text('prompt,answer\n"a, b",c\nx,\n')
    with pytest.raises(ProbeDataError, match=r"t\.csv, line 3 has an empty answer"):
        read_task_pairs(f)


def test_eval_cli_refuses_an_empty_answer_before_any_model(tiny_llama, tmp_path, monkeypatch, capsys):
    root = _copy_pool(tiny_llama, tmp_path)
    lines = (root / "data" / "math.jsonl").read_text().splitlines()
    (root / "data" / "math.jsonl").write_text("\n".join(lines + ['{"prompt": "", "answer": ""}']) + "\n")
    monkeypatch.setattr(ModelPool, "load", lambda *a, **k: pytest.fail("a model was loaded before the check"))
    assert main(["eval", str(root / "pool.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"math.jsonl, line {len(lines) + 1} has an empty answer" in err and "Traceback" not in err


# -- item 12: template: chat with a tokenizer that has no chat template ----------------------------------------

def _chat_pool(root):
    text = (root / "pool.yaml").read_text()
    (root / "pool.yaml").write_text(text.replace("probes:", "probes:\n  template: chat", 1))
    return root / "pool.yaml"


def test_chat_template_missing_is_refused_when_the_pool_opens(tiny_llama, tmp_path):
    pool_yaml = _chat_pool(_copy_pool(tiny_llama, tmp_path))
    with pytest.raises(ProbeDataError, match="has no chat template") as info:
        ModelPool.from_yaml(pool_yaml)
    msg = str(info.value)
    assert "remove `template: chat`" in msg and "pool.yaml" in msg


@pytest.mark.parametrize("argv", [["eval"], ["finetune", "--task", "math", "--steps", "2", "--no-save"]])
def test_eval_and_finetune_with_missing_chat_template_exit_2_before_work(tiny_llama, tmp_path, monkeypatch,
                                                                          capsys, argv):
    pool_yaml = _chat_pool(_copy_pool(tiny_llama, tmp_path))
    monkeypatch.setattr(evaluate_module, "token_losses",
                        lambda *a, **k: pytest.fail("a forward pass ran before the template was checked"))
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    assert main([argv[0], str(pool_yaml), *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert "has no chat template" in err and "remove `template: chat`" in err and "Traceback" not in err


def test_evaluate_checks_the_template_before_the_general_loss(tiny_llama, monkeypatch):
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml, scan_nonfinite=False)
    probes = Probes(general=["some held-out text"], template="chat",
                    tasks={"t": TaskData("t", eval=[TaskPair("1+1=", "2")])})
    monkeypatch.setattr(evaluate_module, "token_losses",
                        lambda *a, **k: pytest.fail("a forward pass ran before the template was checked"))
    with pytest.raises(ProbeDataError, match="has no chat template"):
        evaluate(pool.load("base"), pool.tokenizer, probes)


def test_chat_template_present_is_used(tiny_llama, tmp_path, capsys):
    from transformers import AutoTokenizer

    root = _copy_pool(tiny_llama, tmp_path)
    tok = AutoTokenizer.from_pretrained(str(root / "base"))
    tok.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    tok.save_pretrained(str(root / "base"))
    pool = ModelPool.from_yaml(_chat_pool(root), scan_nonfinite=False)
    assert pool.tokenizer.chat_template
    assert main(["eval", str(root / "pool.yaml"), "--models", "base", "--max-general", "1"]) == 0


# -- item 17: only what the limits need is tokenized --------------------------------------------------------

def _reference_blocks(tokenizer, texts, block_size, max_blocks=None, mode="blocks"):
    """encode_text and general_loss's block selection as they were before issue 30.17 (everything tokenized)."""
    def encode(ts):
        eos = tokenizer.eos_token_id
        stream = []
        for t in ts:
            stream.extend(tokenizer(t, add_special_tokens=False)["input_ids"])
            if eos is not None:
                stream.append(eos)
        blocks = [stream[i:i + block_size] for i in range(0, len(stream), block_size)]
        return [EncodedExample(b, list(b)) for b in blocks if len(b) >= 2]

    blocks = [b for t in texts for b in encode([t])[:1]] if mode == "documents" else encode(texts)
    return blocks if max_blocks is None else blocks[:max_blocks]


class CountingTokenizer:
    """A tokenizer that counts the characters it is asked to tokenize."""

    def __init__(self, tok):
        self.tok, self.chars, self.calls = tok, 0, 0

    def __call__(self, text, **kw):
        self.chars += len(text)
        self.calls += 1
        return self.tok(text, **kw)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def _ordinary_docs():
    from tests.conftest import GENERAL

    rng = random.Random(0)
    return [" ".join(rng.sample(GENERAL, k=rng.randint(1, len(GENERAL)))) for _ in range(12)] + ["x", "a b"]


@pytest.mark.parametrize("mode", ["blocks", "documents"])
def test_limited_encoding_equals_full_encoding_for_an_ordinary_file(tiny_llama, tmp_path, mode):
    from forgetlab.core.data import read_general_text

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml, scan_nonfinite=False)
    tok = pool.tokenizer
    (tmp_path / "g.txt").write_text("\n\n".join(d.replace(". ", ".\n") for d in _ordinary_docs()) + "\n")
    docs = read_general_text(tmp_path / "g.txt")
    assert len(docs) > 10
    model = pool.load("ft0")
    for block_size in (8, 32, 128):
        for max_blocks in (None, 1, 2, 5, 13, 10_000):
            want = _reference_blocks(tok, docs, block_size, max_blocks, mode)
            if mode == "blocks":
                assert encode_text(tok, docs, block_size, max_blocks=max_blocks) == want, (block_size, max_blocks)
            per = token_losses(model, want, 16, tok.pad_token_id)
            ref = torch.cat([p[0] for p in per])
            loss, n = general_loss(model, tok, docs, block_size=block_size, max_blocks=max_blocks, mode=mode)
            assert n == ref.numel() and loss == float(ref.mean()), (block_size, max_blocks)


def _one_line(n_chars: int, spaces: bool = True) -> str:
    """One line of `n_chars` characters: words of the general text, or (spaces=False) letters and digits with
    no space at all, where the prefix cannot be cut at a word boundary."""
    from tests.conftest import GENERAL

    rng = random.Random(1)
    if not spaces:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789.,") for _ in range(n_chars))
    words = " ".join(GENERAL).split()
    out, size = [], 0
    while size < n_chars:
        w = rng.choice(words)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


@pytest.mark.parametrize("spaces", [True, False])
def test_a_huge_single_line_is_tokenized_only_as_far_as_the_limit_needs(tiny_llama, spaces):
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml, scan_nonfinite=False)
    tok = pool.tokenizer
    line = _one_line(400_000, spaces)
    full = _reference_blocks(tok, [line], 16)
    assert len(full) > 1000
    for max_blocks in (1, 3, 100):
        counting = CountingTokenizer(tok)
        got = encode_text(counting, [line], 16, max_blocks=max_blocks)
        assert got == full[:max_blocks]
        assert counting.chars <= 64 * 1024 + 100 * 16 * 64, (max_blocks, counting.chars)


@pytest.mark.parametrize("mode", ["blocks", "documents"])
def test_general_loss_on_a_10_mb_line_tokenizes_a_bounded_prefix(tiny_llama, mode):
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml, scan_nonfinite=False)
    line = _one_line(10 * 2**20)
    counting = CountingTokenizer(pool.tokenizer)
    loss, n = general_loss(pool.load("base"), counting, [line, "another document"], block_size=128, max_blocks=2,
                           mode=mode)
    short = len(pool.tokenizer("another document", add_special_tokens=False)["input_ids"]) + 1   # and its EOS
    assert n == (2 * 127 if mode == "blocks" else 127 + short - 1)
    assert counting.chars < 100_000, counting.chars
