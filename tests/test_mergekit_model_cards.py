"""Issue 41: mergekit YAMLs written as model cards write them, which mergekit runs, run in forgetlab and give
mergekit's tensors (mergekit-multi: mergekit-yaml's merge code, one interpreter start for every case):

1. per-model density (and gamma, epsilon) of ties, breadcrumbs, dare_ties, dare_linear and della, as values,
   gradients or filter lists, beside per-model weight gradients and filters;
2. parameters mergekit reads and ignores (sce's `weight`, task_arithmetic's `density`): mergekit's result, and a
   one-line notice that the CLI prints and a saved merge keeps;
3. linear and multislerp weights of 1e-13 each, normalised;
4. forgetlab's own recipe `method: linear` without `base`, through `forgetlab merge`.

Deterministic cases: every entry within 1e-5. Random ones (dare_*, della): per layer (where the per-model densities
differ), the share of entries changed and the mean |merged − base| agree within sampling error.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from forgetlab.cli import main
from forgetlab.merge.mergekit_export import to_mergekit
from forgetlab.merge.mergekit_yaml import from_mergekit
from forgetlab.merge.recipe_io import load_recipe
from forgetlab.merge.recipes import Recipe
from tests.conftest import make_tiny_pool
from tests.reference_tools import MERGEKIT_MULTI, reference_env, skip_without_mergekit

needs_mergekit = skip_without_mergekit(MERGEKIT_MULTI)

RANDOM = ("dare_ties", "dare_linear", "della")
SCE_NOTE = ("mergekit's sce ignores `weight` (SCE weighs each model by the mean square of its selected task "
            "vector): it has no effect on this merge.")
TA_NOTE = "mergekit's task_arithmetic ignores `density` (it does not sparsify the task vectors): it has no effect on " \
          "this merge."


@pytest.fixture(scope="module")
def pool3(tmp_path_factory):
    return make_tiny_pool(tmp_path_factory.mktemp("tiny-llama-cards"), "llama", n_finetuned=3)


def cases(pool) -> dict[str, dict]:
    """Model-card-style mergekit YAMLs (float32, so that deterministic merges compare to 1e-5)."""
    base = str(pool.base.resolve())
    a, b, c = (str(p.resolve()) for p in pool.finetuned.values())

    def m(ref, **params):
        return {"model": ref, "parameters": params}

    f32 = {"dtype": "float32"}
    mlp_half = [{"filter": "mlp", "value": 0.5}, {"value": 1.0}]
    return {
        "ties": {"merge_method": "ties", "base_model": base,
                 "models": [m(a, density=[0.2, 0.9], weight=1.0), m(b, density=0.5, weight=[0.3, 1.0]),
                            m(c, density=[{"filter": "self_attn", "value": 0.1}, {"value": 0.7}], weight=mlp_half)],
                 "parameters": {"normalize": True, "int8_mask": True}, **f32},
        "breadcrumbs": {"merge_method": "breadcrumbs", "base_model": base,
                        "models": [m(a, density=[0.3, 0.8], gamma=0.02, weight=[1.0, 0.5]),
                                   m(b, density=0.5, gamma=[0.1, 0.0], weight=0.7)], **f32},
        "dare_ties": {"merge_method": "dare_ties", "base_model": base,
                      "models": [m(a, density=[0.1, 0.9], weight=[0.5, 1.0]), m(b, density=0.6, weight=1.0)],
                      "parameters": {"int8_mask": True}, **f32},
        "dare_linear": {"merge_method": "dare_linear", "base_model": base,
                        "models": [m(a, density=[0.9, 0.2], weight=1.0), m(b, density=0.4, weight=[1.0, 0.3])],
                        **f32},
        "della": {"merge_method": "della", "base_model": base,
                  "models": [m(a, density=[0.2, 0.8], epsilon=0.1, weight=1.0),
                             m(b, density=0.5, epsilon=[0.05, 0.15], weight=[0.5, 1.0])], **f32},
        "sce": {"merge_method": "sce", "base_model": base,
                "models": [m(a, weight=1.0), m(b, weight=0.5), m(c, weight=0.3)],
                "parameters": {"select_topk": 0.8}, **f32},
        "task_arithmetic": {"merge_method": "task_arithmetic", "base_model": base,
                            "models": [m(a, weight=1.0, density=0.5), m(b, weight=0.7, density=0.5)], **f32},
        "linear_tiny_weights": {"merge_method": "linear",
                                "models": [m(a, weight=1e-13), m(b, weight=1e-13), m(c, weight=2e-13)],
                                "parameters": {"normalize": True}, **f32},
        "multislerp_tiny_weights": {"merge_method": "multislerp", "base_model": base,
                                    "models": [m(a, weight=1e-13), m(b, weight=3e-13)], **f32},
        "linear_no_base": {"merge_method": "linear", "models": [m(a, weight=2.0), m(b, weight=1.0)], **f32},
    }



@pytest.fixture(scope="module")
def mergekit_outputs(pool3, tmp_path_factory):
    """{case: (its YAML file, mergekit's output folder)}."""
    root = tmp_path_factory.mktemp("mk-cards")
    docs = cases(pool3)
    files = {}
    for name, d in docs.items():
        files[name] = root / f"{name}.yaml"
        files[name].write_text(yaml.safe_dump(d, sort_keys=False))
    multi = root / "multi.yaml"
    multi.write_text(yaml.safe_dump_all([{**d, "name": f"out-{n}"} for n, d in docs.items()], sort_keys=False))
    proc = subprocess.run([str(MERGEKIT_MULTI), str(multi), "-I", str(root / "mk"), "--no-lazy", "--no-write-model-card",
                           "--no-copy-tokenizer", "--quiet"], env=reference_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"mergekit-multi failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return {n: (files[n], root / "mk" / f"out-{n}") for n in docs}


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    t = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        t.update({k: v.float() for k, v in load_file(str(f)).items()})
    return t


def _merge(recipe, out: Path, capsys) -> str:
    """`forgetlab merge RECIPE OUT`; its standard output."""
    capsys.readouterr()
    assert main(["merge", str(recipe), str(out)]) == 0
    return capsys.readouterr().out


DETERMINISTIC = ("ties", "breadcrumbs", "sce", "task_arithmetic", "linear_tiny_weights", "multislerp_tiny_weights")


@needs_mergekit
@pytest.mark.parametrize("case", DETERMINISTIC)
def test_same_tensors_as_mergekit(mergekit_outputs, pool3, tmp_path, capsys, case):
    recipe, mk_dir = mergekit_outputs[case]
    printed = _merge(recipe, tmp_path / "out", capsys)
    a, b = _tensors(mk_dir), _tensors(tmp_path / "out")
    assert set(a) == set(b)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= 1e-5, f"{case}: max |mergekit − forgetlab| = {worst}"
    base = _tensors(pool3.base)
    assert max(float((a[k] - base[k]).abs().max()) for k in a) > 1e-3  # the merge is not the base
    notes = {"sce": [SCE_NOTE], "task_arithmetic": [TA_NOTE]}.get(case, [])
    assert [line[len("note: "):] for line in printed.splitlines() if line.startswith("note: ")] == notes
    assert yaml.safe_load((tmp_path / "out" / "recipe.yaml").read_text())["forgetlab"].get("notes", []) == notes


@needs_mergekit
@pytest.mark.parametrize("case", RANDOM)
def test_random_methods_follow_each_models_density(mergekit_outputs, pool3, tmp_path, capsys, case):
    """Per layer (the per-model densities are gradients over the two layers), the share of entries changed and
    the mean |Δ| agree with mergekit's; the layers differ, so one density for all models would not agree."""
    recipe, mk_dir = mergekit_outputs[case]
    _merge(recipe, tmp_path / "out", capsys)
    a, b, base = _tensors(mk_dir), _tensors(tmp_path / "out"), _tensors(pool3.base)

    def stats(t, layer):
        keys = [k for k in a if re.search(rf"\.layers\.{layer}\.", k) and a[k].numel() >= 1000]
        d = torch.cat([(t[k] - base[k]).reshape(-1) for k in keys])
        return float((d != 0).float().mean()), float(d.abs().mean())

    per_layer = []
    for layer in (0, 1):
        (fa, ma), (fb, mb) = stats(a, layer), stats(b, layer)
        assert abs(fa - fb) < 0.03, (case, layer, fa, fb)
        assert abs(ma - mb) / ma < 0.07, (case, layer, ma, mb)
        per_layer.append(fa)
    assert abs(per_layer[0] - per_layer[1]) > 0.1, per_layer  # the densities differ by layer


@needs_mergekit
def test_forgetlab_recipe_linear_without_base_through_the_cli(mergekit_outputs, pool3, tmp_path, capsys):
    """A weighted average needs no base: `method: linear` without `base` merges as mergekit's linear without
    base_model (the first model lends config and tokenizer)."""
    a, b, _ = (str(p.resolve()) for p in pool3.finetuned.values())
    recipe = tmp_path / "linear.yaml"
    recipe.write_text(yaml.safe_dump({"method": "linear", "models": [{"model": a, "weight": 2.0},
                                                                     {"model": b, "weight": 1.0}]}))
    _merge(recipe, tmp_path / "out", capsys)
    mk, ours = _tensors(mergekit_outputs["linear_no_base"][1]), _tensors(tmp_path / "out")
    assert set(mk) == set(ours)
    assert max(float((mk[k] - ours[k]).abs().max()) for k in mk) <= 1e-6
    assert (tmp_path / "out" / "tokenizer.json").exists()


def test_recipes_without_base(tmp_path):
    """Which forgetlab recipes may leave out `base`: those whose method reads no θ0 (the registry's
    `MethodSpec.needs_base`); the others are refused with what to add."""
    r = Recipe.from_dict({"method": "linear", "models": ["/m/a", {"model": "/m/b", "weight": 0.5}]})
    assert (r.base, [m.model for m in r.models]) == ("/m/a", ["/m/a", "/m/b"])
    assert Recipe.from_dict({"method": "karcher", "models": ["/m/a", "/m/b"]}).base == "/m/a"
    assert Recipe.from_dict({"method": "multislerp", "models": ["/m/a", "/m/b"],
                             "params": {"use_base": False}}).base == "/m/a"
    with pytest.raises(Exception, match=r"no `base`.*use_base: false"):
        Recipe.from_dict({"method": "multislerp", "models": ["/m/a", "/m/b"]})
    for method in ("ties", "task_arithmetic", "slerp"):
        with pytest.raises(Exception, match=rf"no `base`, which {method} merges the models into: add base: PATH"):
            Recipe.from_dict({"method": method, "models": ["/m/a"]})
    bad = tmp_path / "ties.yaml"
    bad.write_text(yaml.safe_dump({"method": "ties", "models": ["/m/a"]}))
    assert main(["merge", str(bad), str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_per_model_sparsity_in_forgetlabs_own_recipes(tmp_path):
    """keep, drop and gamma per model in forgetlab's format (under each model, as weight): exported to mergekit as
    per-model density and imported back as the same recipe; one value for all stays one value."""
    r = load_recipe({"method": "breadcrumbs", "base": "/m/base",
                     "models": [{"model": "/m/a", "keep": 0.2, "gamma": 0.05}, {"model": "/m/b", "keep": 0.4}]})
    assert r.validated_params()["keep"] == [0.2, 0.4] and r.validated_params()["gamma"] == [0.05, 0.01]
    mk = to_mergekit(r)
    assert [e["parameters"]["density"] for e in mk["models"]] == [0.2, 0.4]
    assert [e["parameters"]["gamma"] for e in mk["models"]] == [0.05, 0.01]
    assert from_mergekit(mk).validated_params() == r.validated_params()
    dare = load_recipe({"method": "dare_ties", "base": "/m/base", "params": {"drop": [0.1, 0.7]},
                        "models": ["/m/a", "/m/b"]})
    assert [e["parameters"]["density"] for e in to_mergekit(dare)["models"]] == [0.9, 0.3]
    one = from_mergekit({"merge_method": "ties", "base_model": "/m/base",
                                "models": [{"model": "/m/a", "parameters": {"density": 0.3, "weight": 1}},
                                           {"model": "/m/b", "parameters": {"density": 0.3, "weight": 1}}]})
    assert one.params["keep"] == 0.3 and all("keep" not in m.params for m in one.models)
    with pytest.raises(Exception, match=r"keep \+ gamma ≤ 1.*for model 2"):
        load_recipe({"method": "breadcrumbs", "base": "/m/base", "models": [{"model": "/m/a", "keep": 0.5},
                                                                          {"model": "/m/b", "keep": 0.995}]}
                    ).validated_params()


def test_ignored_mergekit_parameters_are_notes_not_refusals():
    """What mergekit reads and ignores is accepted with a note (once, however many models or slices give it);
    a parameter no mergekit method has is still refused as a misspelling."""
    sce = {"merge_method": "sce", "base_model": "/m/base",
           "models": [{"model": "/m/a", "parameters": {"weight": 1.0}}, {"model": "/m/b", "parameters": {"weight": 2}}]}
    r = from_mergekit(sce)
    assert r.notes == [SCE_NOTE] and "weights" not in r.validated_params()
    assert from_mergekit({**sce, "models": ["/m/a", "/m/b"]}).notes == []
    ta = from_mergekit({"merge_method": "task_arithmetic", "base_model": "/m/base",
                               "models": ["/m/a", "/m/b"], "parameters": {"rescale": True}})
    assert ta.notes == ["mergekit's task_arithmetic ignores `rescale` (it does not sparsify the task vectors): it has "
                        "no effect on this merge."]
    with pytest.raises(Exception, match="'wieght' is not a parameter of mergekit's sce"):
        from_mergekit({**sce, "parameters": {"wieght": 1.0}})
