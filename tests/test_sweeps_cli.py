"""`forgetlab sweep ...`: tables, saved runs, exit status 2 on bad input."""
from __future__ import annotations

from forgetlab.analysis.sweeps import load_sweep
from forgetlab.cli import main
from forgetlab.core.workspace import list_runs


def test_sweep_alpha_cli(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    out = tmp_path / "alpha.csv"
    code = main(["sweep", "alpha", str(tiny_llama.pool_yaml), "--model", "ft0", "--alphas", "0,0.5,1",
                 "--max-general", "2", "--max-task", "2", "--device", "cpu", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "wise-ft" in text and "saved" in text
    assert out.exists()
    runs = list_runs(tmp_path, kind="sweep-alpha")
    assert len(runs) == 1
    res = load_sweep(runs[0].path)
    assert [p.x for p in res.points] == [0.0, 0.5, 1.0]
    assert res.measure == "exact_match"


def test_sweep_cli_answer_loss_measure(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    out = tmp_path / "alpha.csv"
    code = main(["sweep", "alpha", str(tiny_llama.pool_yaml), "--model", "ft0", "--alphas", "0,1",
                 "--max-general", "2", "--max-task", "2", "--device", "cpu", "--measure", "answer_loss",
                 "--out", str(out)])
    assert code == 0
    assert "answer loss" in capsys.readouterr().out
    import pandas as pd

    frame = pd.read_csv(out)
    assert list(frame["speciality"]) == list(frame["answer_loss"])
    assert load_sweep(list_runs(tmp_path, kind="sweep-alpha")[0].path).measure == "answer_loss"


def test_sweep_pruning_and_hma_cli(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    assert main(["sweep", "pruning", str(tiny_llama.pool_yaml), "--model", "ft1", "--ratios", "0,0.9",
                 "--scores", "fapm", "relative", "--max-general", "1", "--max-task", "2", "--device", "cpu",
                 "--no-save"]) == 0
    text = capsys.readouterr().out
    assert "fapm" in text and "relative" in text
    assert main(["sweep", "hma", str(tiny_llama.pool_yaml), "--model", "ft1", "--grid", "0.1,0.3",
                 "0.3,0.1", "--max-general", "1", "--max-task", "2", "--device", "cpu", "--no-save"]) == 0
    assert list_runs(tmp_path) == []


def test_sweep_cli_bad_input(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    assert main(["sweep", "alpha", str(tiny_llama.pool_yaml), "--model", "ghost"]) == 2
    assert "no fine-tuned model 'ghost'" in capsys.readouterr().err
    assert main(["sweep", "alpha", str(tiny_llama.pool_yaml), "--model", "ft0", "--alphas", "0,2"]) == 2
    assert "[0, 1]" in capsys.readouterr().err
    assert main(["sweep", "alpha", str(tiny_llama.pool_yaml), "--model", "ft0", "--alphas", "a,b"]) == 2
