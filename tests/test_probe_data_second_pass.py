"""Issue 30, second pass, probe data: empty answers (item 10), `template: chat` without a chat template
(item 12), and held-out text tokenized only as far as the limits need (item 17)."""
from __future__ import annotations

import json
import shutil

import pytest

from forgetlab.cli import main
from forgetlab.core import evaluate as evaluate_module
from forgetlab.core.data import Probes, TaskData, TaskPair, read_task_pairs
from forgetlab.core.errors import ProbeDataError
from forgetlab.core.evaluate import evaluate
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
