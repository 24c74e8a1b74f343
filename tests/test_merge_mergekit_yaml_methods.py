"""Issue 25, end to end: mergekit YAML for each of mergekit 0.1.5's methods, merged by `mergekit-multi` (one call,
its own venv) and by `forgetlab merge` on the same three fine-tunes of one tiny Llama, in both directions:

1. mergekit YAML → forgetlab (import): the 13 methods beyond the first seven (slerp, nuslerp, multislerp,
   karcher, model_stock, arcee_fusion, nearswap, ram, ramplus_tl, sce, della, della_linear, breadcrumbs_ties),
   including nuslerp / multislerp without base_model and karcher with one;
2. forgetlab recipe → `to_mergekit` (export) → mergekit, for EVERY mergekit method (20, passthrough also with
   slices), written with forgetlab's own defaults so that the export has to spell out what mergekit's differ in.

Deterministic methods: every entry within 1e-5. Random ones (dare_*, della*): the share of entries changed and the
mean |merged − base| within a few per cent. Round trips without mergekit: import → export → import gives the same
recipe for every YAML case here and in tests/test_merge_mergekit_parity.py.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from forgetlab.cli import main
from forgetlab.merge import run
from forgetlab.merge.mergekit_yaml import from_mergekit, mergekit_methods, to_mergekit
from forgetlab.merge.recipes import Recipe
from tests.conftest import make_tiny_pool
from tests.reference_tools import MERGEKIT_MULTI, reference_env, skip_without_mergekit

needs_mergekit = skip_without_mergekit(MERGEKIT_MULTI)

RANDOM = ("della", "della_linear", "dare_ties", "dare_linear")
# LazyMergekit's SLERP: t by filter, a gradient over the layers for attention and MLP
LAZY_T = [{"filter": "self_attn", "value": [0, 0.5, 0.3, 0.7, 1]},
          {"filter": "mlp", "value": [1, 0.5, 0.7, 0.3, 0]}, {"value": 0.5}]


@pytest.fixture(scope="module")
def pool3(tmp_path_factory):
    """A tiny Llama base and three fine-tunes (θ0 + 0.02·noise)."""
    return make_tiny_pool(tmp_path_factory.mktemp("tiny-llama3"), "llama", n_finetuned=3)


def mergekit_cases(pool) -> dict[str, dict]:
    """mergekit YAML for each new method (parameters chosen so that every branch does something)."""
    base = str(pool.base.resolve())
    a, b, c = (str(p.resolve()) for p in pool.finetuned.values())

    def m(ref, **params):
        return {"model": ref, "parameters": params} if params else {"model": ref}

    f32 = {"dtype": "float32"}
    return {
        "slerp": {"merge_method": "slerp", "base_model": base, "models": [m(base), m(a)],
                  "parameters": {"t": LAZY_T}, **f32},
        "slerp_slices": {"merge_method": "slerp", "base_model": base,
                         "slices": [{"sources": [{"model": base, "layer_range": [0, 2]},
                                                 {"model": a, "layer_range": [0, 2]}]}],
                         "parameters": {"t": LAZY_T}, **f32},
        "nuslerp": {"merge_method": "nuslerp", "base_model": base, "models": [m(a, weight=1.0), m(b, weight=0.5)],
                    **f32},
        "nuslerp_nobase": {"merge_method": "nuslerp", "models": [m(a, weight=0.3), m(b, weight=0.7)],
                           "parameters": {"nuslerp_flatten": False}, **f32},
        "multislerp": {"merge_method": "multislerp", "base_model": base,
                       "models": [m(a, weight=1.0), m(b, weight=2.0), m(c, weight=0.5)], **f32},
        "multislerp_nobase": {"merge_method": "multislerp",
                              "models": [m(a, weight=1.0), m(b, weight=1.0), m(c, weight=2.0)],
                              "parameters": {"normalize_weights": False}, **f32},
        "karcher": {"merge_method": "karcher", "models": [m(a), m(b), m(c)], **f32},
        "karcher_base": {"merge_method": "karcher", "base_model": base, "models": [m(a), m(b)],
                         "parameters": {"max_iter": 20, "tol": 1e-6}, **f32},
        "model_stock": {"merge_method": "model_stock", "base_model": base, "models": [m(a), m(b), m(c)], **f32},
        "model_stock_filter": {"merge_method": "model_stock", "base_model": base, "models": [m(a), m(b)],
                               "parameters": {"filter_wise": True}, **f32},
        "arcee_fusion": {"merge_method": "arcee_fusion", "base_model": base, "models": [m(a)], **f32},
        "nearswap": {"merge_method": "nearswap", "base_model": base, "models": [m(base), m(a)],
                     "parameters": {"t": 0.01}, **f32},
        "ram": {"merge_method": "ram", "base_model": base, "models": [m(a), m(b), m(c)],
                "parameters": {"epsilon": 0.01}, **f32},
        "ramplus_tl": {"merge_method": "ramplus_tl", "base_model": base, "models": [m(a), m(b), m(c)],
                       "parameters": {"epsilon": 0.01, "r": 0.5, "alpha": 0.3}, **f32},
        "sce": {"merge_method": "sce", "base_model": base, "models": [m(a), m(b), m(c)],
                "parameters": {"select_topk": 0.5}, **f32},
        "breadcrumbs_ties": {"merge_method": "breadcrumbs_ties", "base_model": base,
                             "models": [m(a, weight=1.0, density=0.5, gamma=0.05),
                                        m(b, weight=0.5, density=0.5, gamma=0.05)], **f32},
        "della": {"merge_method": "della", "base_model": base,
                  "models": [m(a, weight=1.0, density=0.5, epsilon=0.1), m(b, weight=1.0, density=0.5, epsilon=0.1)],
                  "parameters": {"lambda": 1.0}, **f32},
        "della_linear": {"merge_method": "della_linear", "base_model": base,
                         "models": [m(a, weight=0.5, density=0.4), m(b, weight=0.5, density=0.4)], **f32},
    }


def forgetlab_cases(pool) -> dict[str, dict]:
    """A forgetlab recipe for every mergekit method, mostly with forgetlab's defaults."""
    base = str(pool.base.resolve())
    a, b, c = (str(p.resolve()) for p in pool.finetuned.values())
    two = [a, b]
    out = {name: {"method": name, "base": base, "models": list(two)} for name in mergekit_methods()}
    out["linear"]["models"] = [{"model": a, "weight": 2.0}, b]
    out["task_arithmetic"]["params"] = {"lam": 0.7}
    out["ties"]["params"] = {"keep": 0.3}
    out["breadcrumbs"]["params"] = {"keep": 0.4, "gamma": 0.05}
    out["dare_linear"]["params"] = {"drop": 0.5}
    for one in ("slerp", "nearswap", "arcee_fusion"):
        out[one]["models"] = [a]
    out["nearswap"]["params"] = {"t": 0.01}
    out["slerp"]["params"] = {"t": {"gradient": [0.2, 0.9]}}
    out["multislerp"]["models"] = [a, b, c]
    out["multislerp"]["params"] = {"use_base": False}
    out["karcher"]["models"] = [a, b, base]
    out["model_stock"]["models"] = [a, b, c]
    out["ram"]["params"] = {"epsilon": 0.01}
    out["ramplus_tl"]["params"] = {"epsilon": 0.01}
    out["sce"]["params"] = {"select_topk": 0.3}
    out["della"]["models"] = [{"model": a, "density": 0.5}, {"model": b, "density": 0.5}]
    out["della_linear"]["models"] = [{"model": a, "density": 0.6, "weight": 0.5}, {"model": b, "density": 0.6}]
    out["breadcrumbs_ties"]["models"] = [{"model": a, "density": 0.5}, {"model": b, "density": 0.5}]
    out["passthrough"] = {"method": "passthrough", "base": a, "models": [], "params": {"scale": 0.5}}
    out["passthrough_slices"] = {"method": "passthrough", "base": base, "models": [a, b],
                                 "slices": [{"sources": [{"model": a, "layer_range": [0, 2]}]},
                                            {"sources": [{"model": b, "layer_range": [1, 2]}]}]}
    return out



@pytest.fixture(scope="module")
def merged(pool3, tmp_path_factory):
    """{case: (mergekit output folder, forgetlab output folder, the mergekit YAML dict)} for every case of both
    directions; mergekit runs once (mergekit-multi) over all of them."""
    root = tmp_path_factory.mktemp("mk-methods")
    docs, ours = {}, {}
    for name, d in mergekit_cases(pool3).items():
        docs[f"mk-{name}"] = d
        ours[f"mk-{name}"] = run(d, root / "ours" / f"mk-{name}").out_dir
    for name, d in forgetlab_cases(pool3).items():
        src, exported = root / f"fl-{name}.yaml", root / f"fl-{name}.mergekit.yaml"
        src.write_text(yaml.safe_dump(d, sort_keys=False))
        assert main(["merge-export", str(src), "--to", "mergekit", "--out", str(exported)]) == 0
        docs[f"fl-{name}"] = yaml.safe_load(exported.read_text())
        ours[f"fl-{name}"] = run(Recipe.from_dict(d), root / "ours" / f"fl-{name}").out_dir
    multi = root / "multi.yaml"
    multi.write_text(yaml.safe_dump_all([{**d, "name": f"out-{n}"} for n, d in docs.items()], sort_keys=False))
    proc = subprocess.run([str(MERGEKIT_MULTI), str(multi), "-I", str(root / "mk"), "--no-lazy", "--no-write-model-card",
                           "--no-copy-tokenizer", "--quiet"], env=reference_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"mergekit-multi failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return {n: (root / "mk" / f"out-{n}", ours[n], docs[n]) for n in docs}


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    t = {}
    for f in sorted(folder.glob("*.safetensors")):
        t.update({k: v.float() for k, v in load_file(str(f)).items()})
    return t


def _method(case: str) -> str:
    name = case.split("-", 1)[1]
    for m in sorted(mergekit_methods(), key=len, reverse=True):
        if name == m or name.startswith(m + "_"):
            return m
    raise KeyError(case)


def _cases(pool_free: bool = False) -> list[str]:
    fake = type("P", (), {"base": Path("/b"), "finetuned": {"a": Path("/a"), "b": Path("/x"), "c": Path("/c")}})
    return [f"mk-{n}" for n in mergekit_cases(fake)] + [f"fl-{n}" for n in forgetlab_cases(fake)]


DETERMINISTIC = [c for c in _cases() if _method(c) not in RANDOM]
STOCHASTIC = [c for c in _cases() if _method(c) in RANDOM]


def test_every_mergekit_method_is_covered_both_ways():
    assert {_method(c) for c in _cases() if c.startswith("fl-")} == set(mergekit_methods())
    assert len(mergekit_methods()) == 20
    new = {"slerp", "nuslerp", "multislerp", "karcher", "model_stock", "arcee_fusion", "nearswap", "ram",
           "ramplus_tl", "sce", "della", "della_linear", "breadcrumbs_ties"}
    assert {_method(c) for c in _cases() if c.startswith("mk-")} == new


@needs_mergekit
@pytest.mark.parametrize("case", DETERMINISTIC)
def test_same_tensors_as_mergekit(merged, case):
    mk_dir, our_dir, doc = merged[case]
    a, b = _tensors(mk_dir), _tensors(our_dir)
    assert set(a) == set(b)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= 1e-5, f"{case}: max |mergekit − forgetlab| = {worst}"
    # the merge changed the weights (it is neither a copy of the base nor of one input)
    ref = doc.get("base_model") or (doc.get("models") or doc["slices"][0]["sources"])[0]["model"]
    src = _tensors(Path(ref))
    changed = [float((a[k] - src[k]).abs().max()) for k in a if k in src and src[k].shape == a[k].shape]
    assert max(changed) > 1e-3, f"{case}: the output equals {ref}"


@needs_mergekit
@pytest.mark.parametrize("case", STOCHASTIC)
def test_random_methods_match_mergekit_in_distribution(merged, case):
    mk_dir, our_dir, doc = merged[case]
    a, b = _tensors(mk_dir), _tensors(our_dir)
    base = _tensors(Path(doc["base_model"]))
    big = [k for k in a if a[k].numel() >= 1000]

    def stats(t):
        d = torch.cat([(t[k] - base[k]).reshape(-1) for k in big])
        return float((d != 0).float().mean()), float(d.abs().mean())

    (fa, ma), (fb, mb) = stats(a), stats(b)
    assert abs(fa - fb) < 0.02, (case, fa, fb)
    assert abs(ma - mb) / ma < 0.05, (case, ma, mb)
    assert 0.05 < fa < 0.999, (case, fa)  # something was dropped, something kept


def test_import_export_import_gives_the_same_recipe(pool3, tiny_llama):
    """mergekit YAML → recipe → export → import again: the same recipe (here and the parity file's cases)."""
    from tests.test_merge_mergekit_parity import _recipes

    docs = {**mergekit_cases(pool3), **{f"parity-{k}": v for k, v in _recipes(tiny_llama).items()}}
    for name, d in docs.items():
        first = from_mergekit(d)
        again = from_mergekit(to_mergekit(first))
        assert again.to_dict() == first.to_dict(), name


def test_forgetlab_recipe_export_import_keeps_the_merge(pool3):
    """forgetlab recipe → export → import: the same method, parameters and models, so the same merge (only the
    config donor may differ where mergekit has no base: linear and karcher without the base among the models)."""
    for name, d in forgetlab_cases(pool3).items():
        recipe = Recipe.from_dict(d)
        back = from_mergekit(to_mergekit(recipe))
        assert back.method == recipe.method, name
        assert back.validated_params() == recipe.validated_params(), name
        if recipe.slices is None:
            assert [m.model for m in back.models] == [m.model for m in recipe.models], name


def test_nuslerp_without_base_interpolates_the_models(pool3):
    """mergekit's nuslerp without base_model is use_base: false (the models themselves); with one, the task
    vectors: the two imports give different merges."""
    cases = mergekit_cases(pool3)
    assert from_mergekit(cases["nuslerp_nobase"]).params["use_base"] is False
    assert from_mergekit(cases["nuslerp"]).params["use_base"] is True
    assert "base_model" not in to_mergekit(from_mergekit(cases["nuslerp_nobase"]))
    kb = from_mergekit(cases["karcher_base"])
    assert [m.model for m in kb.models][-1] == kb.base  # mergekit averages the base in as one more input


def test_merge_export_round_trips_on_the_command_line(pool3, tmp_path):
    """`forgetlab merge-export` both ways for every case: mergekit YAML → --to forgetlab → --to mergekit →
    --to forgetlab gives the forgetlab recipe of the first step; forgetlab recipe → --to mergekit → --to forgetlab →
    --to mergekit gives the mergekit YAML of the first step."""
    def export(src: Path, to: str, out: Path) -> dict:
        assert main(["merge-export", str(src), "--to", to, "--out", str(out)]) == 0
        return yaml.safe_load(out.read_text())

    docs = {**{f"mk-{k}": v for k, v in mergekit_cases(pool3).items()},
            **{f"fl-{k}": v for k, v in forgetlab_cases(pool3).items()}}
    for name, d in docs.items():
        src = tmp_path / f"{name}.yaml"
        src.write_text(yaml.safe_dump(d, sort_keys=False))
        first, second = ("forgetlab", "mergekit") if name.startswith("mk-") else ("mergekit", "forgetlab")
        one = export(src, first, tmp_path / f"{name}.1.yaml")
        export(tmp_path / f"{name}.1.yaml", second, tmp_path / f"{name}.2.yaml")
        three = export(tmp_path / f"{name}.2.yaml", first, tmp_path / f"{name}.3.yaml")
        assert three == one, name
