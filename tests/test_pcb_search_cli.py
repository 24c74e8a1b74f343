"""`forgetlab pcb-search` (PCB's λ search, an analysis since issue 42): the recipe with the λ found, its saved run,
and `--merge OUT_DIR`, the Merge page's "λ search, then merge" (`search_then_merge`) from the command line."""
from __future__ import annotations

import json

import yaml

from forgetlab.analysis.base import ANALYSES
from forgetlab.cli import main


def _pcb_recipe(tiny_llama, path):
    models = [{"model": str(tiny_llama.finetuned[m])} for m in ("ft0", "ft1")]
    path.write_text(yaml.safe_dump({"method": "pcb", "base": str(tiny_llama.base), "models": models,
                                    "params": {"keep": 0.5, "lam": 1.0, "scope": "tensor"}}))
    return path


def test_pcb_search_merges_the_lambdas_found_and_saves_its_run(tiny_llama, tmp_path, monkeypatch, capsys):
    from forgetlab.analysis.lambda_search import pcb_lambda_search, search_then_merge
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.recipe_io import load_recipe

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    recipe, out = _pcb_recipe(tiny_llama, tmp_path / "pcb.yaml"), tmp_path / "merged"
    args = ["pcb-search", str(recipe), "--pool", str(tiny_llama.pool_yaml), "--budget", "3", "--seed", "2"]
    assert main([*args, "--merge", str(out), "--out", str(tmp_path / "found.yaml")]) == 0
    text = capsys.readouterr().out
    assert "after 3 evaluations" in text and f"into {out}" in text and "scorecards saved in" in text
    found = yaml.safe_load((tmp_path / "found.yaml").read_text())
    merged = yaml.safe_load((out / "recipe.yaml").read_text())
    assert [m["lam"] for m in merged["models"]] == [m["lam"] for m in found["models"]]      # the λ found, merged
    cards = json.loads((out / "scorecards.json").read_text())["cards"]
    assert [c["model"] for c in cards] == ["base", "ft0", "ft1", "merged"]
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    direct, _ = pcb_lambda_search(pool, load_recipe(recipe), budget=3, seed=2)        # the same search as a function
    assert [m["lam"] for m in found["models"]] == [round(v, 6) for v in direct.lambdas]
    analysis = ANALYSES.get("pcb-search")
    [run] = analysis.list()
    again = analysis.load(run.path)
    assert again.lambdas == direct.lambdas and again.merged["out_dir"] == str(out)
    assert [c.model for c in again.cards] == ["base", "ft0", "ft1", "merged"]
    # the merge folder is checked before the search: an existing one is refused at once, nothing searched
    assert main([*args, "--merge", str(out), "--no-save"]) == 2
    assert "exists already" in capsys.readouterr().err and len(analysis.list()) == 1
    # the page's path is the same function: the same λ, then the merge
    done = search_then_merge(pool, load_recipe(recipe), tmp_path / "page", budget=3, seed=2)
    assert done.search.lambdas == direct.lambdas
    assert [m.params["lam"] for m in done.recipe.models] == [m["lam"] for m in merged["models"]]
    assert [c.general_loss for c in done.cards] == [c["general_loss"] for c in cards]


def test_pcb_search_refuses_a_recipe_of_another_method(tiny_llama, tmp_path, capsys):
    recipe = tmp_path / "ties.yaml"
    recipe.write_text(_pcb_recipe(tiny_llama, tmp_path / "pcb.yaml").read_text().replace("method: pcb",
                                                                                          "method: ties"))
    assert main(["pcb-search", str(recipe), "--pool", str(tiny_llama.pool_yaml), "--no-save"]) == 2
    assert "pcb-search needs a pcb recipe; this one uses ties." in capsys.readouterr().err


def test_slwm_weights_run_is_saved_and_reopens_with_its_table(tiny_gpt2, tmp_path, monkeypatch):
    import pandas as pd

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    out = tmp_path / "w.csv"
    assert main(["slwm-weights", str(tiny_gpt2.pool_yaml), "--models", "ft0", "ft1", "--tasks", "math", "copy",
                 "--samples", "3", "--level", "head_mlp", "--out", str(out)]) == 0
    analysis = ANALYSES.get("slwm-weights")
    [run] = analysis.list()
    assert run.recipe["level"] == "head_mlp" and run.recipe["models"] == ["ft0", "ft1"]
    table = analysis.frame(analysis.load(run.path))
    pd.testing.assert_frame_equal(table.astype({"head": float}), pd.read_csv(out).astype({"head": float}),
                                  check_dtype=False)
