"""`forgetlab finetune ...`: one run, a comparison, saving into the pool, exit status 2 on bad input."""
from __future__ import annotations

import shutil

from forgetlab.cli import main
from forgetlab.core.pool import ModelPool
from forgetlab.core.workspace import list_runs
from forgetlab.analysis.finetune import ANALYSIS as FINETUNE


def test_finetune_cli_one_run_saved_into_pool(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    root = tmp_path / "pool"
    shutil.copytree(tiny_llama.root, root)
    code = main(["finetune", str(root / "pool.yaml"), "--task", "math", "--optimizer", "mofo", "--steps", "3",
                 "--batch-size", "4", "--l2", "0.5", "--eval-every", "3", "--max-general", "1", "--device", "cpu",
                 "--save-as", "math-mofo"])
    assert code == 0
    text = capsys.readouterr().out
    assert "mofo-0.2+l2-0.5" in text and "added math-mofo" in text
    assert "math-mofo" in ModelPool.from_yaml(root / "pool.yaml").model_names
    runs = list_runs(tmp_path / "home", kind="finetune")
    comp = FINETUNE.load(runs[0].path)
    assert comp.runs[0].config.optimizer == "mofo" and comp.runs[0].config.l2 == 0.5


def test_finetune_cli_compare(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    assert main(["finetune", str(tiny_llama.pool_yaml), "--task", "copy", "--compare", "--steps", "2",
                 "--batch-size", "4", "--max-general", "1", "--device", "cpu", "--no-save"]) == 0
    text = capsys.readouterr().out
    for label in ("adamw", "mofo-0.2", "sfa-p0.25", "l2-1"):
        assert label in text


def test_finetune_cli_bad_input(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    assert main(["finetune", str(tiny_llama.pool_yaml), "--task", "nope", "--steps", "1"]) == 2
    assert "no task 'nope'" in capsys.readouterr().err
    assert main(["finetune", str(tiny_llama.pool_yaml), "--task", "math", "--steps", "1", "--start", "ghost"]) == 2
    assert "ghost" in capsys.readouterr().err
