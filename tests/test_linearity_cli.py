"""CLI: forgetlab linearity / slwm-weights / features on a tiny pool."""
from __future__ import annotations

import pandas as pd

from forgetlab.cli import main


def test_linearity_cli_writes_csv_and_refuses_overwrite(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    out = tmp_path / "nls.csv"
    args = ["linearity", str(tiny_llama.pool_yaml), "--task", "math", "--model", "ft0", "--levels", "model", "mlp",
            "--samples", "3", "--alphas", "0,0.5", "--out", str(out), "--curves", str(tmp_path / "curves.csv")]
    assert main(args) == 0
    df = pd.read_csv(out)
    assert list(df["level"]) == ["model", "mlp", "mlp"] and len(df["curve"][0].split(";")) == 2
    assert len(pd.read_csv(tmp_path / "curves.csv")) == 3 * 2
    assert len(list((tmp_path / "home" / "runs").iterdir())) == 1
    before = out.read_text()
    assert main(args) == 2
    assert "exists already" in capsys.readouterr().err and out.read_text() == before
    assert main(args + ["--overwrite", "--no-save"]) == 0
    assert main(["linearity", str(tiny_llama.pool_yaml), "--task", "math", "--model", "ft0", "--samples", "99"]) == 2
    assert "only 8 probe samples" in capsys.readouterr().err


def test_slwm_weights_and_features_cli(tiny_gpt2, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))      # slwm-weights saves its run (issue 42)
    assert main(["slwm-weights", str(tiny_gpt2.pool_yaml), "--models", "ft0", "ft1", "--tasks", "math", "copy",
                 "--samples", "3", "--out", str(tmp_path / "w.csv")]) == 0
    w = pd.read_csv(tmp_path / "w.csv")
    assert list(w.columns[-2:]) == ["math", "copy"] and len(w) == 4
    assert main(["features", str(tiny_gpt2.pool_yaml), "--level", "attn", "--samples", "4", "--perplexity", "5",
                 "--out", str(tmp_path / "xy.csv"), "--distances", str(tmp_path / "d.csv")]) == 0
    xy = pd.read_csv(tmp_path / "xy.csv")
    assert len(xy) == 3 * 2 * 4 and set(xy["model"]) == {"base", "ft0", "ft1"}
    assert "average distance between task clusters" in capsys.readouterr().out
    assert main(["features", str(tiny_gpt2.pool_yaml), "--level", "head", "--samples", "4"]) == 2


def test_forgetlab_merge_knows_slwm(tiny_llama, tmp_path):
    import yaml

    recipe = tmp_path / "slwm.yaml"
    recipe.write_text(yaml.safe_dump({
        "method": "slwm", "base": str(tiny_llama.base),
        "models": [{"model": str(tiny_llama.finetuned["ft0"])}, {"model": str(tiny_llama.finetuned["ft1"])}],
        "params": {"level": "layer", "samples": 2, "tasks": "math,copy"}}))
    out = tmp_path / "merged"
    assert main(["merge", str(recipe), str(out), "--pool", str(tiny_llama.pool_yaml)]) == 0
    assert (out / "config.json").exists()
    assert main(["merge", str(recipe), str(tmp_path / "m2")]) == 2  # no pool: a message, not a crash
