"""Recipes (ours ↔ mergekit), the CLI subcommands and the PCB λ search."""
from __future__ import annotations

import math
import re

import pytest
import torch
import yaml

from forgetlab.cli import main
from forgetlab.core.errors import ParameterError
from forgetlab.merge import merge_state_dicts
from forgetlab.analysis.lambda_search import cma_lambdas, compose, pcb_components, probe_loss
from forgetlab.merge.mergekit_export import to_mergekit
from forgetlab.merge.mergekit_yaml import from_mergekit
from forgetlab.merge.recipe_io import load_recipe
from forgetlab.merge.recipes import Recipe


def test_our_recipe_round_trip_and_per_model_params():
    text = """
method: ties
base: /m/base
models:
  - model: /m/a
    weight: 0.5
  - /m/b
params: {keep: 0.3}
seed: 4
"""
    r = load_recipe(text)
    assert r.method_params() == {"keep": 0.3, "weights": [0.5, 1.0]}
    assert load_recipe(r.to_yaml()).to_dict() == r.to_dict()
    v = r.validated_params()
    assert v["scope"] == "tensor" and v["lam"] == 1.0


def test_seed_goes_to_seeded_methods_only():
    r = Recipe.from_dict({"method": "dare_ties", "base": "b", "models": ["a"], "seed": 9})
    assert r.method_params()["seed"] == 9
    r2 = Recipe.from_dict({"method": "ties", "base": "b", "models": ["a"], "seed": 9})
    assert "seed" not in r2.method_params()


@pytest.mark.parametrize("mk,exp_method,exp_params", [
    ({"merge_method": "ties", "base_model": "b", "models": [{"model": "a", "parameters": {"density": 0.4, "weight": 1}},
                                                             {"model": "c", "parameters": {"density": 0.4, "weight": 1}}],
      "parameters": {"lambda": 0.8}}, "ties", {"keep": 0.4, "lam": 0.8, "scope": "tensor"}),
    ({"merge_method": "dare_linear", "base_model": "b", "models": [{"model": "a", "parameters": {"density": 0.3,
                                                                                                "weight": 1}}]},
     "dare_linear", {"drop": 0.7, "lam": 1.0}),
    ({"merge_method": "breadcrumbs", "base_model": "b", "models": [{"model": "a", "parameters": {"density": 0.2,
                                                                                                "gamma": 0.05}}]},
     "breadcrumbs", {"keep": 0.2, "gamma": 0.05, "lam": 1.0}),
    ({"merge_method": "linear", "models": [{"model": "a", "parameters": {"weight": 2}}, {"model": "c",
                                                                                         "parameters": {"weight": 1}}]},
     "linear", {"normalize": True}),
])
def test_mergekit_import(mk, exp_method, exp_params):
    r = load_recipe(yaml.safe_dump(mk))
    assert r.method == exp_method
    for k, v in exp_params.items():
        assert r.params[k] == pytest.approx(v)
    if exp_method == "linear":
        assert r.base == "a" and r.method_params()["weights"] == [2.0, 1.0]


def test_mergekit_export_round_trips_through_import():
    r = Recipe.from_dict({"method": "ties", "base": "/b", "models": [{"model": "/a", "weight": 2.0}, "/c"],
                          "params": {"keep": 0.25, "lam": 0.9}})
    mk = to_mergekit(r)
    assert mk["models"][0]["parameters"] == {"weight": 2.0, "density": 0.25}
    assert mk["parameters"] == {"lambda": 0.9, "normalize": True, "rescale": False}
    back = from_mergekit(mk)
    assert back.validated_params() == r.validated_params()


def test_mergekit_import_refuses_what_has_no_counterpart():
    slerp = load_recipe({"merge_method": "slerp", "base_model": "b", "models": [{"model": "a"}],
                         "parameters": {"t": 0.3}})      # mergekit's slerp is a forgetlab method now (issue 25)
    assert (slerp.method, slerp.base, [m.model for m in slerp.models]) == ("slerp", "b", ["a"])
    assert slerp.validated_params()["t"] == 0.3
    per_model = load_recipe({"merge_method": "ties", "base_model": "b",   # issue 41: per model, as mergekit reads it
                             "models": [{"model": "a", "parameters": {"density": 0.2}},
                                        {"model": "c", "parameters": {"density": 0.5}}]})
    assert per_model.validated_params()["keep"] == [0.2, 0.5]
    with pytest.raises(ParameterError, match="no mergekit counterpart"):
        to_mergekit(Recipe.from_dict({"method": "pcb", "base": "b", "models": ["a"]}))
    with pytest.raises(ParameterError, match="scope: tensor"):
        to_mergekit(Recipe.from_dict({"method": "ties", "base": "b", "models": ["a"], "params": {"scope": "global"}}))


def test_bad_recipes():
    with pytest.raises(ParameterError, match="no fine-tuned model"):
        Recipe.from_dict({"method": "ties", "base": "b", "models": []})
    with pytest.raises(ParameterError, match="Unknown merge method"):
        Recipe.from_dict({"method": "nope", "base": "b", "models": ["a"]})
    with pytest.raises(ParameterError, match="Unknown recipe key"):
        Recipe.from_dict({"method": "ties", "base": "b", "models": ["a"], "paramz": {}})
    with pytest.raises(ParameterError, match="per-model parameter"):
        Recipe.from_dict({"method": "ties", "base": "b", "models": [{"model": "a", "lam": 0.1}]}).method_params()


def test_cli_merge_methods_and_export(tiny_llama, tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"method": "ties", "base": str(tiny_llama.base),
                                      "models": [str(p) for p in tiny_llama.finetuned.values()]}))
    assert main(["merge", str(recipe), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "recipe.yaml").exists()
    assert main(["merge", str(recipe), str(tmp_path / "out")]) == 2
    assert "exists already" in capsys.readouterr().err
    assert main(["merge", str(recipe), str(tmp_path / "out"), "--overwrite"]) == 0
    capsys.readouterr()
    assert main(["methods"]) == 0
    listing = capsys.readouterr().out
    assert "pcb" in listing and "keep=0.2" in listing
    assert main(["merge-export", str(recipe)]) == 0
    mk = yaml.safe_load(capsys.readouterr().out)
    assert mk["merge_method"] == "ties" and mk["models"][0]["parameters"]["density"] == 0.2
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"method": "ties", "base": str(tiny_llama.base), "models": [str(tiny_llama.base)],
                                   "params": {"keep": 3}}))
    assert main(["merge", str(bad), str(tmp_path / "o2")]) == 2
    assert "keep must lie in [0.0, 1.0]" in capsys.readouterr().err


def _toy():
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(40, generator=g), "v": torch.randn(3, 5, generator=g)}
    fts = [{k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(2)]
    return base, fts


@pytest.mark.parametrize("scope", ["global", "tensor"])
def test_pcb_components_reproduce_pcb_with_per_task_lambdas(scope):
    base, fts = _toy()
    comps = pcb_components(base, fts, keep=0.3, scope=scope)
    got = compose(base, comps, [0.4, 1.7])
    exp = merge_state_dicts("pcb", base, fts, keep=0.3, lam=[0.4, 1.7], scope=scope)
    for k in base:
        assert torch.allclose(got[k], exp[k], atol=1e-6)


def test_cma_search_finds_the_minimum_of_a_known_loss_within_budget():
    base, fts = _toy()
    target = [0.6, 1.8]
    calls = []

    def loss(lams):
        calls.append(1)
        return sum((a - b) ** 2 for a, b in zip(lams, target))

    res = cma_lambdas(base, fts, loss, loss_of="lambdas", budget=60, seed=1)
    assert len(calls) == res.n_evals <= 60
    assert res.loss < res.initial_loss
    assert all(abs(a - b) < 0.15 for a, b in zip(res.lambdas, target))
    assert len(res.to_frame()) == res.n_evals


def test_cma_search_with_a_state_dict_loss_and_probe_data(tiny_llama):
    from forgetlab.core.checkpoints import open_checkpoint
    from forgetlab.core.pool import ModelPool
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    base = open_checkpoint(tiny_llama.base).state_dict()
    fts = [open_checkpoint(p).state_dict() for p in tiny_llama.finetuned.values()]
    loss = probe_loss(pool, max_task=4)
    res = cma_lambdas(base, fts, loss, budget=5, seed=0)
    assert res.n_evals == 5 and math.isfinite(res.loss) and res.loss <= res.initial_loss
    # the loss really depends on the weights: the base and the start merge (λ = 1) score differently
    assert loss(base) != pytest.approx(res.history[0][1])


def test_recipe_parents_maps_a_recipes_models_to_the_pool_and_refuses_what_it_cannot_compare(tiny_llama, tmp_path):
    """`merge --eval` scores a recipe's parents by their pool names: matched by folder, the base among the
    models (mergekit's linear) left out; a recipe into another base, or a model outside the pool, is refused."""
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.recipes import recipe_parents

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    ft = tiny_llama.finetuned
    linear = load_recipe({"method": "linear", "base": str(tiny_llama.base),
                          "models": [str(tiny_llama.base), str(ft["ft1"]), str(ft["ft0"])]})
    assert recipe_parents(pool, linear) == ["ft1", "ft0"]
    with pytest.raises(ParameterError, match="pool's base"):
        recipe_parents(pool, load_recipe({"method": "ties", "base": str(ft["ft0"]), "models": [str(ft["ft1"])]}))
    with pytest.raises(ParameterError, match="does not hold"):
        recipe_parents(pool, load_recipe({"method": "ties", "base": str(tiny_llama.base), "models": [str(tmp_path)]}))


def test_recipe_form_is_the_inverse_of_pool_recipe(tiny_llama):
    """`recipe_form` gives back what `pool_recipe` was given (pool names, per-model lists, defaults filled in),
    so that the Merge page can put a recipe found by the search into its form; the base among the models is
    refused (the form merges fine-tuned models only)."""
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.workflow import pool_recipe, recipe_form

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    recipe = pool_recipe(pool, "ties", ["ft1", "ft0"], {"keep": 0.3, "weights": [0.25, 1.5]})
    method, models, params = recipe_form(pool, recipe.to_dict())
    assert (method, models) == ("ties", ["ft1", "ft0"])
    assert params == {"keep": [0.3, 0.3], "lam": 1.0, "scope": "tensor", "weights": [0.25, 1.5], "normalize": True,
                      "rescale": False}                                 # keep: per model since issue 41
    assert pool_recipe(pool, method, models, params).to_dict() == \
        pool_recipe(pool, "ties", ["ft1", "ft0"], {"keep": [0.3, 0.3], "lam": 1.0, "scope": "tensor",
                                                   "weights": [0.25, 1.5], "normalize": True,
                                                   "rescale": False}).to_dict()
    linear = load_recipe({"method": "linear", "base": str(tiny_llama.base),
                          "models": [str(tiny_llama.base), str(tiny_llama.finetuned["ft0"])]})
    with pytest.raises(ParameterError, match="lists the base among the models"):
        recipe_form(pool, linear)


# -- issue 30, second pass: mergekit recipes imported and exported exactly, or refused by name ------------------

def _mk(method="dare_ties", models=("/m/a", "/m/c"), base="/m/b", **top):
    d = {"merge_method": method, "models": [{"model": m, "parameters": {"weight": 1.0, "density": 0.7}}
                                            if method != "linear" else {"model": m, "parameters": {"weight": 1.0}}
                                            for m in models]}
    if base is not None:
        d["base_model"] = base
    d.update(top)
    return d


def test_dare_ties_means_what_mergekit_means_both_ways():
    """issue 25: mergekit's dare_ties defaults to normalize: false (the sum of the agreeing entries) and rescale:
    true (the L1 rule); both are imported as such, normalize: true too, and merge-export writes them back."""
    r = from_mergekit(_mk())
    assert (r.method, r.params["drop"], r.params["normalize"], r.params["rescale"]) == \
        ("dare_ties", pytest.approx(0.3), False, "l1")
    assert from_mergekit(_mk(parameters={"normalize": True})).params["normalize"] is True
    assert from_mergekit(_mk(parameters={"rescale": False})).params["rescale"] == "none"
    ours = Recipe.from_dict({"method": "dare_ties", "base": "/b", "models": ["/a", "/c"], "params": {"drop": 0.2}})
    mk = to_mergekit(ours)
    assert mk["parameters"]["normalize"] is False and mk["parameters"]["rescale"] is True
    assert from_mergekit(mk).validated_params() == ours.validated_params()
    former = Recipe.from_dict({"method": "dare_ties", "base": "/b", "models": ["/a"], "params": {"rescale": "inverse"}})
    with pytest.raises(ParameterError, match=r"1/\(1 − p\).*rescale: l1"):
        to_mergekit(former)


def test_ties_normalize_and_rescale_are_imported_and_exported():
    """ties: normalize (default true: the disjoint mean; false: the sum) and rescale (L1) are read and written."""
    assert from_mergekit(_mk("ties")).params["normalize"] is True
    assert from_mergekit(_mk("ties", parameters={"normalize": False})).params["normalize"] is False
    assert from_mergekit(_mk("ties", parameters={"rescale": True})).params["rescale"] is True
    assert from_mergekit(_mk("breadcrumbs", parameters={"rescale": True})).params["rescale"] is True
    ours = Recipe.from_dict({"method": "ties", "base": "/b", "models": ["/a", "/c"], "params": {"keep": 0.3}})
    assert to_mergekit(ours)["parameters"]["normalize"] is True


@pytest.mark.parametrize("method", ["task_arithmetic", "dare_linear", "breadcrumbs"])
def test_normalize_true_without_consensus_is_the_methods_parameter(method):
    """mergekit's normalize: true for the methods without sign election (Σ wt·τt / Σ wt) is the method's own
    `normalize`; the weights stay as written, and the round trip keeps it."""
    d = _mk(method, parameters={"normalize": True})
    d["models"][1]["parameters"]["weight"] = 0.5
    if method == "task_arithmetic":
        for e in d["models"]:
            del e["parameters"]["density"]
    r = from_mergekit(d)
    assert r.validated_params()["weights"] == [1.0, 0.5] and r.validated_params()["normalize"] is True
    assert from_mergekit(to_mergekit(r)).validated_params() == r.validated_params()


def test_lora_entry_mapping_is_read_as_base_plus_adapter():
    """mergekit's `model: {model: BASE, lora: ADAPTER}` is the same model as `BASE+ADAPTER` (it was read as BASE)."""
    as_map = from_mergekit(_mk("ties", models=[{"model": "/m/b", "lora": "/m/ad"}], parameters={}))
    as_map_models = [m.model for m in as_map.models]
    d = _mk("ties")
    d["models"] = [{"model": {"model": "/m/b", "lora": "/m/ad"}, "parameters": {"weight": 1.0, "density": 0.5}},
                   {"model": "/m/c", "parameters": {"weight": 1.0, "density": 0.5}}]
    assert [m.model for m in from_mergekit(d).models] == ["/m/b+/m/ad", "/m/c"]
    d["models"][0]["model"] = "/m/b+/m/ad"
    assert [m.model for m in from_mergekit(d).models] == ["/m/b+/m/ad", "/m/c"]
    d["base_model"] = {"model": "/m/b"}
    assert from_mergekit(d).base == "/m/b"
    assert as_map_models == ["/m/b+/m/ad"]
    d["models"][0]["model"] = {"model": {"path": "/m/b", "revision": "v2"}, "lora": "/m/ad"}
    with pytest.raises(ParameterError, match=r"revision 'v2'"):
        from_mergekit(d)
    d["models"][0]["model"] = {"model": "/m/b", "lora": "/m/ad", "override_architecture": "X"}
    with pytest.raises(ParameterError, match="override_architecture"):
        from_mergekit(d)


@pytest.fixture(scope="module")
def lora_on_tiny(tiny_llama, tmp_path_factory):
    """A PEFT adapter (q_proj, v_proj, random B) on the tiny Llama base."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("lora") / "adapter"
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama.base))
    get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                     init_lora_weights=False)).save_pretrained(str(out))
    return out


def test_cli_lora_entry_mapping_merges_like_the_plus_form(tiny_llama, lora_on_tiny, tmp_path):
    from safetensors.torch import load_file

    base, ft = str(tiny_llama.base), str(tiny_llama.finetuned["ft0"])
    outs = {}
    for form, ref in [("map", {"model": base, "lora": str(lora_on_tiny)}), ("plus", f"{base}+{lora_on_tiny}")]:
        mk = {"merge_method": "task_arithmetic", "base_model": base,
              "models": [{"model": ref, "parameters": {"weight": 1.0}}, {"model": ft, "parameters": {"weight": 1.0}}],
              "dtype": "float32"}
        (tmp_path / f"{form}.yaml").write_text(yaml.safe_dump(mk))
        assert main(["merge", str(tmp_path / f"{form}.yaml"), str(tmp_path / form)]) == 0
        outs[form] = load_file(str(tmp_path / form / "model.safetensors"))
    q = next(k for k in outs["map"] if "q_proj" in k)
    base_q = load_file(str(tiny_llama.base / "model.safetensors"))[q]
    ft_q = load_file(str(tiny_llama.finetuned["ft0"] / "model.safetensors"))[q]
    assert not torch.allclose(outs["map"][q], ft_q)                    # the adapter's ΔW is in (not read as base)
    assert not torch.allclose(outs["map"][q] - base_q, ft_q - base_q)
    assert all(torch.equal(outs["map"][k], outs["plus"][k]) for k in outs["plus"])


def test_linear_with_a_base_model_averages_the_base_in():
    """mergekit's linear adds base_model to the inputs (with the top-level weight) when the models do not list it."""
    r = from_mergekit(_mk("linear", parameters={"weight": 2.0}))
    assert [m.model for m in r.models] == ["/m/a", "/m/c", "/m/b"]
    assert r.validated_params()["weights"] == [1.0, 1.0, 2.0]
    listed = _mk("linear", models=("/m/a", "/m/b"))                   # listed: counted once, with its own weight
    assert [m.model for m in from_mergekit(listed).models] == ["/m/a", "/m/b"]
    with pytest.raises(ParameterError, match=r"base_model.*needs a weight.*parameters: \{weight"):
        from_mergekit(_mk("linear"))
    assert [m.model for m in from_mergekit(_mk("linear", base=None)).models] == ["/m/a", "/m/c"]


@pytest.mark.parametrize("extra, says", [
    ({"chat_template": "chatml"}, "chat_template"),
    ({"tokenizer_source": "/m/elsewhere"}, "not among the recipe's models"),
    ({"tokenizer_source": "union", "tokenizer": {"source": "base"}}, "both tokenizer_source and tokenizer:"),
    ({"modules": {"text_decoder": {"models": [{"model": "/m/a"}]}}}, "`modules`"),
    ({"merge_methd": "ties"}, "merge_methd"),
    ({"parameters": {"normalize": True, "epsilon": 0.1}}, "epsilon"),
])
def test_mergekit_settings_forgetlab_lacks_are_refused_by_name(extra, says):
    with pytest.raises(ParameterError, match=re.escape(says)):
        from_mergekit(_mk(**{"parameters": {"normalize": True}, **extra}))


def test_mergekit_settings_that_change_nothing_are_accepted():
    r = from_mergekit(_mk(tokenizer_source="base", name="m1", parameters={"normalize": True,
                                                                                "int8_mask": True}))
    assert r.method == "dare_ties" and r.name == "m1"


def test_per_model_settings_mergekit_would_ignore_are_refused():
    d = _mk(parameters={"normalize": True})
    d["models"][0]["parameters"]["lambda"] = 0.5                      # shared in mergekit: a per-model one is ignored
    with pytest.raises(ParameterError, match=r"lambda.*top-level `parameters`"):
        from_mergekit(d)
    d = _mk(parameters={"normalize": True})
    d["models"][0]["weight"] = 0.5                                    # beside `parameters`: mergekit ignores it
    with pytest.raises(ParameterError, match=r"'weight'.*parameters: \{weight: 0.5\}"):
        from_mergekit(d)


def test_a_parameter_mergekit_ignores_is_accepted_with_a_note():
    """issue 41: task_arithmetic trims nothing and mergekit ignores its density: mergekit's result, and a note."""
    assert from_mergekit(_mk("task_arithmetic")).notes == [
        "mergekit's task_arithmetic ignores `density` (it does not sparsify the task vectors): it has no effect on "
        "this merge."]


@pytest.mark.parametrize("models", [("/m/a", "/m/a"), ("/m/b", "/m/b", "/m/a"),
                                    ({"model": "/m/b", "lora": "/m/ad"}, "/m/b+/m/ad")])
def test_a_model_listed_twice_is_refused_as_mergekit_does(models):
    d = _mk("ties", models=models, parameters={})
    with pytest.raises(ParameterError, match=r"twice.*once"):
        from_mergekit(d)
    with pytest.raises(ParameterError, match=r"twice"):
        from_mergekit(_mk("linear", models=("/m/a", "/m/a"), base=None))


def test_export_refuses_a_model_listed_twice():
    r = Recipe.from_dict({"method": "ties", "base": "/b", "models": ["/a", "/a"]})
    with pytest.raises(ParameterError, match=r"twice"):
        to_mergekit(r)


@pytest.mark.parametrize("extra, says", [({"parameters": {"lambda": "x"}}, "lam must be a number"),
                                         ({"chat_template": "chatml"}, "chat_template"),
                                         ({"duplicate": True}, "twice")])
def test_cli_refuses_mergekit_settings_by_name_and_writes_nothing(tiny_llama, tmp_path, capsys, extra, says):
    fts = [str(p) for p in tiny_llama.finetuned.values()]
    if extra.pop("duplicate", False):
        fts = [fts[0], fts[0]]
    mk = _mk("ties", models=fts, base=str(tiny_llama.base), **extra)
    (tmp_path / "mk.yaml").write_text(yaml.safe_dump(mk))
    for argv in (["merge", str(tmp_path / "mk.yaml"), str(tmp_path / "out")],
                 ["merge-export", str(tmp_path / "mk.yaml"), "--to", "forgetlab", "--out", str(tmp_path / "r.yaml")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["mk.yaml"]
