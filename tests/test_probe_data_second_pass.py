"""Issue 30, second pass, probe data: empty answers (item 10), `template: chat` without a chat template
(item 12), and held-out text tokenized only as far as the limits need (item 17)."""
from __future__ import annotations

import json
import shutil

import pytest

from forgetlab.cli import main
from forgetlab.core.data import read_task_pairs
from forgetlab.core.errors import ProbeDataError
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
