"""CLI: inspect, taskvec, eval; errors exit 2 with the message."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from forgetlab.cli import main


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("inspect", "taskvec", "eval"):
        assert cmd in out


def test_inspect(tiny_llama, capsys):
    assert main(["inspect", str(tiny_llama.base), "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "llama" in out and "2 layers, 4 heads (2 kv)" in out
    assert "model.layers.0.self_attn.q_proj.weight" in out


def test_taskvec_and_eval_write_files(tiny_llama, tmp_path, capsys):
    out = tmp_path / "norms.csv"
    assert main(["taskvec", str(tiny_llama.pool_yaml), "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert set(df["model"]) == {"ft0", "ft1"} and (df["norm"] > 0).all()
    cos = pd.read_csv(tmp_path / "norms.cosine.csv", index_col=0)
    assert cos.loc["ft0", "ft0"] == pytest.approx(1.0)
    js = tmp_path / "cards.json"
    assert main(["eval", str(tiny_llama.pool_yaml), "--max-task", "3", "--out", str(js)]) == 0
    cards = json.loads(js.read_text())
    assert [c["model"] for c in cards] == ["base", "ft0", "ft1"]
    assert all(c["tasks"]["math"]["n"] == 3 for c in cards)


def test_errors_exit_2_with_message(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
