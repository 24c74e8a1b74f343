"""`forgetlab search` (CMA-ES merge search) from the command line, in process: points, saved run, best recipe."""
from __future__ import annotations

import json
import os

import yaml

from forgetlab.cli import main


def _write_recipe(tiny_llama, path, method="task_arithmetic"):
    models = [{"model": str(tiny_llama.finetuned[m])} for m in ("ft0", "ft1")]
    path.write_text(yaml.safe_dump({"method": method, "base": str(tiny_llama.base), "models": models,
                                    "params": {"lam": 1.0} if method != "wise_ft" else {"alpha": 0.5}}))
    return path


def test_search_cli_saves_points_and_best_recipe(tiny_llama, tmp_path, monkeypatch, capsys):
    from forgetlab.core.workspace import load_run
    from forgetlab.merge.recipe_io import load_recipe

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    recipe = _write_recipe(tiny_llama, tmp_path / "recipe.yaml")
    best_yaml, table = tmp_path / "best.yaml", tmp_path / "points.json"
    code = main(["search", str(recipe), "--pool", str(tiny_llama.pool_yaml), "--budget", "3", "--popsize", "2",
                 "--measure", "answer_loss", "--max-forgetting", "10", "--max-general", "2", "--max-task", "4",
                 "--device", "cpu", "--save-recipe", str(best_yaml), "--out", str(table)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "executor local: 1 worker process(es)" in out
    run = load_run(next((tmp_path / "home" / "runs").iterdir()))
    assert run.kind == "search"
    points = run.results["points"]
    assert len(points) == 3 and points[0]["values"] == [1.0, 1.0]                 # the start is point 0
    assert all(p["worker"]["pid"] == os.getpid() and p["executor"] == "local" for p in points)
    best = points[run.results["best"]]
    assert best["answer_loss"] == min(p["answer_loss"] for p in points)          # bound 10: all feasible
    chosen = load_recipe(best_yaml)
    assert [m.params["weight"] for m in chosen.models] == [round(v, 6) for v in best["values"]]
    rows = json.loads(table.read_text())
    assert [r["index"] for r in rows] == [0, 1, 2] and "weights:ft0" in rows[0]


def test_search_cli_bad_input(tiny_llama, tmp_path, capsys):
    recipe = _write_recipe(tiny_llama, tmp_path / "wise.yaml", method="wise_ft")
    code = main(["search", str(recipe), "--pool", str(tiny_llama.pool_yaml), "--budget", "2", "--no-save"])
    assert code == 2 and "no per-model weight" in capsys.readouterr().err
    recipe = _write_recipe(tiny_llama, tmp_path / "ta.yaml")
    code = main(["search", str(recipe), "--pool", str(tiny_llama.pool_yaml), "--workers", "2", "--no-save"])
    assert code == 2 and "need --executor ray" in capsys.readouterr().err


def test_check_search_refuses_what_search_refuses_without_loading_a_model(tiny_llama, tmp_path, monkeypatch):
    """`check_search` (the app's check before it starts a search) raises the message `search` raises, and
    opens no checkpoint for good settings."""
    import pytest

    from forgetlab.analysis.search import check_search, search
    from forgetlab.core import checkpoints
    from forgetlab.core.errors import ParameterError
    from forgetlab.core.pool import ModelPool

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    recipe = _write_recipe(tiny_llama, tmp_path / "recipe.yaml")
    for bad in (dict(budget=0), dict(objective="pareto"), dict(measure="bleu"), dict(bounds=(1.0, 1.0))):
        with pytest.raises(ParameterError) as checked:
            check_search(recipe, pool, **bad)
        with pytest.raises(ParameterError) as ran:
            search(recipe, pool, **bad)
        assert str(checked.value) == str(ran.value)
    with pytest.raises(ParameterError, match="no per-model weight"):
        check_search(_write_recipe(tiny_llama, tmp_path / "wise.yaml", "wise_ft"), pool)
    import forgetlab.analysis.search as search_module      # opens its checkpoints with its own import of it

    for module in (checkpoints, search_module):
        monkeypatch.setattr(module, "open_checkpoint", lambda *a, **k: pytest.fail("a checkpoint was opened"))
    check_search(recipe, pool, budget=3, max_forgetting=0.1, device="cpu")   # search's other arguments: ignored
