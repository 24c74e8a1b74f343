"""Forgetting curves of mergekit's methods (issue 25): SLERP's t beside WiSE-FT's α, DELLA's and SCE's densities
beside DARE/TIES — endpoints, weights built through the registry, the CLI, bad input."""
from __future__ import annotations

import pytest

from forgetlab.analysis.sweeps import _sce, _slerp, alpha_curve, della_epsilon, density_curve, load_sweep
from forgetlab.core.taskvectors import distance
from forgetlab.cli import main
from forgetlab.core.errors import ParameterError
from forgetlab.core.workspace import list_runs
from forgetlab.merge import merge_state_dicts
from forgetlab.merge.working_copy import WorkingCopy


def _scores(card):
    return card.general_loss, {t: (s.exact_match, s.answer_loss) for t, s in card.tasks.items()}


def _state(pool, name):
    ck = pool.checkpoint(name)
    return {n: ck.read(n) for n in pool.base.names()}


def test_alpha_curve_with_slerp_beside_wise_ft(pool):
    res = alpha_curve(pool, "ft0", alphas=[0.0, 0.5, 1.0], methods=["wise-ft", "slerp"], device="cpu",
                      max_general=2, max_task=2)
    assert res.series == ["wise-ft", "slerp"]
    by = {(p.series, p.x): p for p in res.points}
    # the end points are the base and the fine-tuned model for both series (evaluated once, shared)
    for x in (0.0, 1.0):
        assert _scores(by[("slerp", x)].scorecard) == _scores(by[("wise-ft", x)].scorecard)
    assert by[("slerp", 0.0)].distance == 0.0
    # the SLERP point's weights are the registry's slerp of θ0 and θ1: the same D(θ, θ0) as merging them
    base, ft = _state(pool, "base"), _state(pool, "ft0")
    want = distance(merge_state_dicts("slerp", base, [ft], t=0.5), base)
    assert by[("slerp", 0.5)].distance == pytest.approx(want, rel=1e-5)
    assert by[("slerp", 0.5)].settings == {"t": 0.5}
    assert res.recipe["methods"] == ["wise-ft", "slerp"]


def test_density_curve_with_della_and_sce(pool):
    res = density_curve(pool, "ft0", keeps=[1.0, 0.5, 0.0], methods=["della", "sce"], seed=2, device="cpu",
                        max_general=2, max_task=2)
    assert res.series == ["della", "sce"]
    by = {(p.series, p.x): p for p in res.points}
    assert by[("della", 1.0)].distance == pytest.approx(
        distance(_state(pool, "ft0"), _state(pool, "base")), rel=1e-5)          # density 1: θ1
    assert by[("della", 0.0)].distance == 0.0 and by[("sce", 0.0)].distance == 0.0   # density 0: θ0
    assert by[("della", 0.5)].settings == {"density": 0.5, "epsilon": 0.15, "seed": 2}
    assert by[("sce", 0.5)].settings["models"] == ["ft0", "ft1"]
    # SCE's points are the registry's SCE of the pool's fine-tuned models, written into the working copy
    base = _state(pool, "base")
    want = merge_state_dicts("sce", base, [_state(pool, "ft0"), _state(pool, "ft1")], select_topk=0.5)
    assert by[("sce", 0.5)].distance == pytest.approx(distance(want, base), rel=1e-5)
    work = WorkingCopy.load(pool, "ft0", device="cpu")
    work.set(_sce(0.5, 2), [work.tuned, WorkingCopy.load(pool, "ft1", device="cpu").tuned])
    name = "model.layers.0.mlp.up_proj.weight"
    assert float((work.params[name].detach() - want[name]).abs().max()) < 1e-6


def test_della_epsilon_keeps_density_inside_the_unit_interval():
    assert della_epsilon(0.5) == 0.15
    assert della_epsilon(0.1) == pytest.approx(0.05)
    assert della_epsilon(0.95) == pytest.approx(0.025)
    assert _slerp(0.0).spec.name == "wise_ft" and _slerp(0.3).spec.name == "slerp"


def test_bad_series_are_refused(pool):
    with pytest.raises(ParameterError, match="wise-ft, slerp"):
        alpha_curve(pool, "ft0", methods=["lerp"])
    with pytest.raises(ParameterError, match="della, sce"):
        density_curve(pool, "ft0", methods=["magprune"])


def test_sweep_cli_slerp_and_della(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    common = [str(tiny_llama.pool_yaml), "--model", "ft0", "--max-general", "2", "--max-task", "2",
              "--device", "cpu"]
    assert main(["sweep", "alpha", *common, "--alphas", "0,0.5", "--methods", "wise-ft", "slerp"]) == 0
    assert "slerp" in capsys.readouterr().out
    res = load_sweep(list_runs(tmp_path, kind="sweep-alpha")[0].path)
    assert res.series == ["wise-ft", "slerp"]
    assert main(["sweep", "density", *common, "--keeps", "0.5", "--methods", "della"]) == 0
    assert [p.series for p in load_sweep(list_runs(tmp_path, kind="sweep-density")[0].path).points] == ["della"]
    assert main(["sweep", "alpha", *common, "--methods", "nlerp"]) == 2


def test_merge_search_over_della_weights_gives_real_merges(pool, tiny_llama):
    import copy

    from forgetlab.analysis.search import search, searchable_param
    from forgetlab.core.evaluate import evaluate

    assert searchable_param("della") == "weights" and searchable_param("multislerp") == "weights"
    assert searchable_param("sce") is None
    recipe = {"method": "della", "base": str(tiny_llama.base), "seed": 3,
              "models": [{"model": str(tiny_llama.finetuned["ft0"]), "weight": 1.0},
                         {"model": str(tiny_llama.finetuned["ft1"]), "weight": 0.5}],
              "params": {"density": 0.6, "epsilon": 0.1}}
    res = search(recipe, pool, budget=3, popsize=2, measure="answer_loss", max_general=2, max_task=4,
                 device="cpu", max_forgetting=1.0)
    assert [p.index for p in res.points] == [0, 1, 2] and res.points[0].values == [1.0, 0.5]
    # re-evaluate a CMA-ES candidate by hand: the seeded DELLA merge in memory, evaluated on the probe split
    p = res.points[1]
    base = pool.checkpoint("base").state_dict()
    fts = [pool.checkpoint(m).state_dict() for m in ("ft0", "ft1")]
    merged = merge_state_dicts("della", base, fts, weights=p.values, density=0.6, epsilon=0.1, seed=3)
    model = copy.deepcopy(pool.load("base", device="cpu"))
    model.load_state_dict(merged, strict=False)
    card = evaluate(model, pool.tokenizer, pool.probes, split="probe", max_general=2, max_task=4)
    assert p.general_loss == pytest.approx(card.general_loss, abs=1e-6)
    assert [m["weight"] for m in res.best_recipe["models"]] == [round(v, 6) for v in res.best_point.values]


def test_merge_page_offers_and_runs_a_new_method(tiny_llama, tmp_path, monkeypatch):
    from tests.jobs_helper import finish_cleanly, open_page

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("merge", tiny_llama.pool_yaml)
    at.run()
    for method in ("slerp", "nuslerp", "multislerp", "karcher", "model_stock", "arcee_fusion", "nearswap", "ram",
                   "ramplus_tl", "sce", "della", "della_linear", "breadcrumbs_ties"):
        at.selectbox(key="merge_method").set_value(method).run()
        assert not at.exception, (method, at.exception)
    assert at.number_input(key="merge_breadcrumbs_ties_density_ft0").value == 1.0     # mergekit's default
    at.selectbox(key="merge_method").set_value("nearswap").run()
    assert at.number_input(key="merge_nearswap_t").value == pytest.approx(1e-4)
    at.selectbox(key="merge_method").set_value("della").run()
    at.number_input(key="merge_della_density_ft0").set_value(0.5)
    at.number_input(key="merge_della_density_ft1").set_value(0.5)
    at.text_input(key="merge_name_della").set_value("d")
    at.session_state["app_max_general"] = 1
    at.session_state["app_max_task"] = 2
    at.button(key="merge_run").click().run()
    finish_cleanly(at, "merge")
    assert (tmp_path / "merges" / "d" / "recipe.yaml").exists()
    assert "della" in (tmp_path / "merges" / "d" / "recipe.yaml").read_text()


def test_forgetting_page_draws_slerp_beside_wise_ft(tiny_llama, tmp_path, monkeypatch):
    from tests.jobs_helper import finish_cleanly, start_page

    at = start_page("forgetting", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    at.text_input(key="forgetting_alphas").set_value("0, 0.5, 1")
    at.multiselect(key="forgetting_alpha_methods").set_value(["wise-ft", "slerp"]).run()
    at.session_state["app_max_general"] = 2
    at.session_state["app_max_task"] = 2
    at.button(key="forgetting_run").click().run()
    finish_cleanly(at, "forgetting")
    assert len(at.dataframe[0].value) == 6                           # both series, end points shared
    assert len(at.get("plotly_chart")) == 2
    at.radio(key="forgetting_kind").set_value("density").run()
    assert not at.exception, at.exception
    picker = at.multiselect(key="forgetting_density_methods")
    assert picker.value == ["dare", "ties"] and {"della", "sce"} <= set(picker.options)


def test_every_new_method_has_its_docs_entry():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "methods.md").read_text()
    for method in ("slerp", "nuslerp", "multislerp", "karcher", "model_stock", "arcee_fusion", "nearswap", "ram",
                   "ramplus_tl", "sce", "della", "della_linear", "breadcrumbs_ties"):
        assert f'<a id="{method}"></a>' in text, method
