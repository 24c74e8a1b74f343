"""Export of a forgetlab recipe as mergekit 0.1.5 YAML (`to_mergekit`), every parameter written explicitly with
mergekit's names (forgetlab.merge.mergekit_params); refused for methods or settings mergekit does not have."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from forgetlab.core.errors import ParameterError
from forgetlab.merge import settings
from forgetlab.merge.recipes import Recipe
from forgetlab.merge.mergekit_params import (NOT_MERGEKIT, base_policy, mergekit_model_key, mergekit_methods,
                                              mergekit_params)
from forgetlab.merge.registry import MethodSpec, MkParam, get_method


def _mk_values(spec: MethodSpec, table: Mapping[str, MkParam], params: Mapping[str, Any],
               per_model: list[Mapping[str, Any]]) -> tuple[dict, list[dict]]:
    """forgetlab's (global params, per-model params by model key) → mergekit's (top-level, per model)."""
    top: dict[str, Any] = {}
    models: list[dict] = [{} for _ in per_model]
    covered = set()
    for mk, p in table.items():
        if p.fl is None:
            continue
        covered.add(p.fl)
        if p.fl_per_model:
            key = mergekit_model_key(spec, p.fl)
            for i, (m, src) in enumerate(zip(models, per_model)):
                shared = params.get(p.fl)  # given once for all models: a value, or a list of one per model
                one_each = isinstance(shared, (list, tuple)) and not settings.is_filter_list(shared)
                v = src.get(key, shared[i] if one_each else shared)
                if v is None:  # forgetlab's default, written: mergekit's may differ or be missing
                    v = next(q.default for q in spec.params if q.name == p.fl)
                if v is not None:
                    m[mk] = settings.to_mergekit(p.to_mk(v))
            continue
        if p.fl not in params:
            continue
        v = settings.to_mergekit(p.to_mk(params[p.fl])) if not settings.is_setting(params[p.fl]) else \
            settings.to_mergekit(settings.map_values(params[p.fl], p.to_mk))
        if p.mk_per_model:
            for m in models:
                m[mk] = v
        else:
            top[mk] = v
    for p in spec.params:
        if p.name in covered or p.name in NOT_MERGEKIT or p.name not in params:
            continue
        if p.name == "scope" and params[p.name] == "tensor":
            continue
        if params[p.name] != p.default or p.name == "scope":
            raise ParameterError(f"{spec.name}'s {p.name} = {params[p.name]!r} has no mergekit counterpart (mergekit "
                                 + ("trims per tensor only; export a recipe with scope: tensor)." if p.name == "scope"
                                    else f"has no such parameter); export with {p.name}: {p.default!r}."))
    return top, models


def to_mergekit(recipe: Recipe) -> dict:
    """The mergekit YAML dict of a recipe: every parameter written explicitly (mergekit's defaults are not
    forgetlab's), LoRA adapters as BASE+ADAPTER, gradients as lists; refused for methods or settings mergekit
    does not have."""
    if recipe.method not in mergekit_methods():
        raise ParameterError(f"{recipe.method} has no mergekit counterpart; exportable methods: "
                             f"{', '.join(mergekit_methods())}.")
    spec = get_method(recipe.method)
    table = mergekit_params(spec)
    recipe.validated_params()
    full = {p.name: recipe.params.get(p.name, p.default) for p in spec.params if not p.per_model}
    full.update({p.name: recipe.params[p.name] for p in spec.params if p.per_model and p.name in recipe.params})
    if recipe.seed is not None:
        full.pop("seed", None)
    out: dict[str, Any] = {"merge_method": recipe.method}
    if recipe.slices is not None:
        out["base_model"] = recipe.base
        out["slices"] = []
        for sl in recipe.slices:
            sp = {k: v for k, v in full.items()}
            sp.update(sl.params)
            top, per = _mk_values(spec, table, sp, [s.params for s in sl.sources])
            srcs = []
            for s, mp in zip(sl.sources, per):
                entry: dict[str, Any] = {"model": _mergekit_ref(recipe.base, s.model), "layer_range": list(s.layer_range)}
                if s.model != recipe.base or spec.min_models == 0:
                    if spec.min_models == 0:
                        mp = {**mp, **{k: v for k, v in top.items()}}
                        top = {}
                    if mp:
                        entry["parameters"] = mp
                srcs.append(entry)
            item: dict[str, Any] = {"sources": srcs}
            if top:
                item["parameters"] = top
            out["slices"].append(item)
    else:
        names = [m.model for m in recipe.models]
        twice = sorted({m for m in names if names.count(m) > 1})
        if twice:
            raise ParameterError(f"The recipe lists {', '.join(twice)} twice; mergekit refuses duplicate inputs. "
                                 "List each model once (with the sum of its weights for linear, task_arithmetic "
                                 "and ties) before exporting.")
        per_model_src = [dict(m.params) for m in recipe.models] if recipe.method != "passthrough" else [{}]
        top, per = _mk_values(spec, table, full, per_model_src)
        if recipe.method == "passthrough":
            out["models"] = [{"model": recipe.base, "parameters": {**top, **(per[0] if per else {})}}]
            top = {}
        else:
            # linear, karcher: base_model is one more input, written when the base is listed after the first
            # model (mergekit's config donor is the first model without it); nuslerp, multislerp: it is use_base
            if (recipe.base in names[1:] if base_policy(recipe.method) == "ignored"
                    else full.get("use_base", True)):
                out["base_model"] = recipe.base
            out["models"] = [{"model": _mergekit_ref(recipe.base, m.model), "parameters": mp}
                             for m, mp in zip(recipe.models, per)]
        if top:
            out["parameters"] = top
    out["dtype"] = "float32"  # forgetlab computes in float32
    if recipe.dtype and recipe.dtype != "float32":
        out["out_dtype"] = recipe.dtype
    if recipe.tokenizer is not None:
        tok = dict(recipe.tokenizer)
        if set(tok) == {"source"}:
            out["tokenizer_source"] = tok["source"]
        else:
            out["tokenizer"] = tok
    if recipe.name is not None:
        out["name"] = recipe.name
    return out


def _mergekit_ref(base: str, model: str) -> str:
    """How mergekit names a model: a PEFT adapter folder as `base+adapter` (mergekit's LoRA syntax), any other
    model as its path."""
    if (Path(str(model)).expanduser() / "adapter_config.json").is_file():
        return f"{base}+{model}"
    return str(model)
