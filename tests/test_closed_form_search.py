"""Merge search over LiNeS' (α, β) (issue 26): CMA-ES tunes the two method-wide numbers (not per-model weights)
under the bounded-forgetting objective; every point is the registry's `lines` merge, evaluated on the probe split."""
from __future__ import annotations

import pytest
import torch
import yaml

from forgetlab.analysis.search import search, search_scalars
from forgetlab.core.errors import ParameterError
from forgetlab.core.evaluate import evaluate
from forgetlab.merge import merge_state_dicts


def _recipe(tiny_llama):
    return {"method": "lines", "base": str(tiny_llama.base),
            "models": [{"model": str(tiny_llama.finetuned[m])} for m in ("ft0", "ft1")],
            "params": {"alpha": 0.4, "beta": 0.3}}


def test_search_tunes_lines_alpha_beta_within_the_forgetting_bound(pool, tiny_llama):
    assert search_scalars("lines") == ["alpha", "beta"] and search_scalars("ties") == []
    res = search(_recipe(tiny_llama), pool, budget=5, popsize=2, bounds=(0.0, 1.0), max_forgetting=0.5,
                 measure="answer_loss", max_general=2, max_task=4, device="cpu")
    assert res.scalar_names == ["alpha", "beta"] and res.param is None
    assert res.points[0].scalars == [0.4, 0.3] and res.points[0].values == []
    assert len({tuple(p.scalars) for p in res.points}) == 5                         # CMA-ES moved
    assert all(0.0 <= v <= 1.0 for p in res.points for v in p.scalars)
    best = res.best_point
    feasible = [p for p in res.points if p.forgetting <= 0.5]
    if feasible:
        assert best.answer_loss == min(p.answer_loss for p in feasible)
    assert res.best_recipe["params"]["alpha"] == round(best.scalars[0], 6)
    assert {"alpha", "beta"} <= set(res.to_frame().columns)
    # point 0 is the lines merge at the start values, evaluated on the probe split
    sds = [pool.checkpoint(n).state_dict(torch.float32) for n in ("base", "ft0", "ft1")]
    merged = merge_state_dicts("lines", sds[0], sds[1:], config=pool.config, alpha=0.4, beta=0.3)
    model = pool.load("base")
    import copy
    m = copy.deepcopy(model)
    m.load_state_dict(merged, strict=False)
    card = evaluate(m, pool.tokenizer, pool.probes, name="x", split="probe", max_general=2, max_task=4)
    assert res.points[0].general_loss == pytest.approx(card.general_loss, abs=1e-5)


def test_search_cli_on_a_lines_recipe_and_bad_scalars(pool, tiny_llama, tmp_path, monkeypatch, capsys):
    from forgetlab.cli import main

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    path = tmp_path / "lines.yaml"
    path.write_text(yaml.safe_dump(_recipe(tiny_llama)))
    code = main(["search", str(path), "--pool", str(tiny_llama.pool_yaml), "--budget", "2", "--popsize", "2",
                 "--max-general", "2", "--max-task", "2", "--no-save"])
    out = capsys.readouterr().out
    assert code == 0 and "lines search over alpha, beta" in out
    with pytest.raises(ParameterError, match="single number"):
        search(_recipe(tiny_llama), pool, scalars=["weights"], budget=1)
