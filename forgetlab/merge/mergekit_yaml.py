"""mergekit 0.1.5's YAML dialect: the import (`from_mergekit`), driven by the registry. Each method declares its
mergekit name and parameters (`MethodSpec.mergekit`); the tables read from them are in
forgetlab.merge.mergekit_params, the export (`to_mergekit`, re-exported here) in forgetlab.merge.mergekit_export.

A mergekit method name is importable when a forgetlab method is registered under it with
`mergekit=MergekitSpec(<name>, …)`. Its parameters map by name: mergekit's `lambda` is forgetlab's `lam`, a per-model parameter is the ParamSpec
with `per_model=True` and `model_key` = mergekit's key (e.g. `weight` → `weights`), every other parameter keeps
mergekit's name. The six methods forgetlab had before mergekit's others keep their own names for the
sparsity knob (the tables they declare, `mergekit_params.gta_params`): `density` is `keep` for ties and
breadcrumbs and `1 − drop` for dare_*, per model as in mergekit (one value when all models agree). A parameter mergekit reads and ignores (task_arithmetic's
density, sce's weight) is accepted and named in the recipe's `notes`. Values are read with mergekit's
defaults (its `merge_methods/registry.py` and each method's signature), and written explicitly into the
imported recipe, so the merge does not depend on forgetlab's defaults. Gradients and filters
(forgetlab.merge.settings), `slices`, `tokenizer_source` / `tokenizer:` and `out_dtype` are read as mergekit
reads them; what forgetlab cannot compute is refused by name, with what to write instead (docs/merging.md).
"""
from __future__ import annotations

from typing import Any, Mapping

from forgetlab.core.errors import ParameterError
from forgetlab.merge import settings
from forgetlab.merge.recipes import (DTYPES, ModelEntry, Recipe, Slice, SliceSource, check_models_list,
                                     check_slices, check_tokenizer, combine, read_layer_range)
from forgetlab.merge.mergekit_params import (MERGEKIT_KEYS, base_policy, mergekit_method_spec, mergekit_model_key,
                                              mergekit_params)
from forgetlab.merge.mergekit_params import mergekit_methods  # noqa: F401 - re-exported
from forgetlab.merge.mergekit_export import to_mergekit  # noqa: F401 - the dialect's other direction
from forgetlab.merge.registry import REQUIRED, MethodSpec, MkParam, get_method


def _check_keys(d: Mapping[str, Any]) -> None:
    """Refuse, by name and with what to do, the top-level mergekit settings forgetlab cannot honour."""
    if "modules" in d:
        raise ParameterError("mergekit `modules` (a separate merge per module of a multimodal model) is not "
                             "supported: forgetlab merges the whole model. Use `models:` or `slices:`.")
    if d.get("chat_template") is not None:
        raise ParameterError("mergekit chat_template is not supported: forgetlab writes the output tokenizer with "
                             "its own chat template. Remove chat_template, and set the template on the merged "
                             "model's tokenizer afterwards (tokenizer.chat_template = …; "
                             "tokenizer.save_pretrained(OUT)).")
    unknown = [k for k in d if k not in MERGEKIT_KEYS]
    if unknown:
        raise ParameterError(f"Unknown mergekit setting(s) {', '.join(map(repr, unknown))}; forgetlab reads "
                             f"{', '.join(MERGEKIT_KEYS)}. Fix the name or remove it.")
    if bool(d.get("models")) == bool(d.get("slices")):
        raise ParameterError("A mergekit recipe has exactly one of `models:` (merge whole models) and `slices:` "
                             "(layer ranges); " + ("it has both." if d.get("models") else "it has neither."))
    if d.get("tokenizer_source") is not None and d.get("tokenizer") is not None:
        raise ParameterError("The mergekit recipe gives both tokenizer_source and tokenizer:, which mergekit "
                             "refuses; keep one (tokenizer_source: X is tokenizer: {source: X}).")


def _mapping(value: Any, where: str | None) -> dict:
    value = value or {}
    if not isinstance(value, Mapping):
        of = "" if where is None else f" of {where}"
        raise ParameterError(f"mergekit `parameters`{of} must be a mapping like {{weight: 1.0}}; got {value!r}.")
    return dict(value)


def _check_params(method: str, table: Mapping[str, MkParam], params: Mapping[str, Any], model: str | None) -> dict:
    """Refuse parameters mergekit's `method` does not have (mergekit ignores them: usually a misspelling) and,
    per model, the shared ones mergekit reads only at the top level; returns the values as settings."""
    out = {}
    for k, v in params.items():
        if k not in table:
            raise ParameterError(f"{k!r} is not a parameter of mergekit's {method} (its parameters: "
                                 f"{', '.join(table)}); mergekit would ignore it. Fix the name or remove it.")
        if model is not None and not table[k].mk_per_model:
            raise ParameterError(f"mergekit parameter {k} is one value for the whole merge; mergekit ignores it in "
                                 f"the parameters of {model}. Give it in the top-level `parameters`.")
        out[k] = settings.from_mergekit(v, f"mergekit parameter {k}" + (f" of {model}" if model else ""))
        if k == "density":
            for x in settings.leaves(out[k]):
                if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= float(x) <= 1.0:
                    raise ParameterError(f"mergekit density must lie in [0, 1] (the share of each task vector "
                                         f"kept); got {x}.")
    return out


def _model_entry(e: Any, where: str) -> tuple[str, dict]:
    if isinstance(e, str):
        e = {"model": e}
    if not isinstance(e, Mapping) or not e.get("model"):
        raise ParameterError(f"Each mergekit {where} entry is a path or a mapping with `model:`; got {e!r}.")
    ref = _mergekit_model(e["model"], "model")
    allowed = ("model", "parameters", "layer_range") if where == "slice source" else ("model", "parameters")
    extra = [k for k in e if k not in allowed]
    if extra:
        hint = ", ".join(f"{k}: {e[k]!r}" for k in extra)
        raise ParameterError(f"The mergekit entry of {ref} has {', '.join(map(repr, extra))} beside "
                             f"{' and '.join(f'`{k}`' for k in allowed)}, where mergekit ignores it; put it under "
                             f"the entry's `parameters`, e.g. parameters: {{{hint}}}.")
    return ref, _mapping(e.get("parameters"), ref)


def _to_forgetlab(method: str, table: Mapping[str, MkParam], top: dict, per_model: list[tuple[str, dict]],
                  where: str, notes: list[str] | None = None) -> tuple[dict, list[dict]]:
    """mergekit settings (top-level and per model, already read as settings) → forgetlab's (global params, one
    dict of per-model params per model), every parameter explicit. A parameter mergekit reads and ignores
    (`MkParam.ignored`) adds a line to `notes` when the recipe gives it."""
    params: dict[str, Any] = {}
    models: list[dict] = [{} for _ in per_model]
    for mk, p in table.items():
        given = top.get(mk) is not None or (p.mk_per_model and any(mp.get(mk) is not None for _, mp in per_model))
        if p.fl is None and p.ignored and given and notes is not None:
            notes.append(f"mergekit's {method} ignores `{mk}` ({p.ignored}): it has no effect on this merge.")
        if p.mk_per_model:
            values = []
            for ref, mp in per_model:
                v = combine(mp.get(mk), top.get(mk))
                if v is None or not settings.has_catch_all(v):
                    if p.default is REQUIRED and (v is None or p.fl is not None):
                        if v is None:
                            raise ParameterError(f"mergekit's {method} needs `{mk}` for {ref}{where} (mergekit stops "
                                                 f"with 'Missing required parameter {mk}'): give it under the "
                                                 f"model's parameters, or once in the top-level parameters.")
                        raise ParameterError(f"The filters of `{mk}` for {ref}{where} match only some tensors and "
                                             f"mergekit then stops ('Missing required parameter {mk}'); end them "
                                             f"with a `- value: …` for every other tensor.")
                    v = combine(v, p.default)
                values.append(v)
            if p.fl is None:
                continue
            values = [p.to_fl(v) for v in values]
            if p.fl_per_model and p.collapse and values and len({repr(v) for v in values}) == 1:
                params[p.fl] = values[0]  # one value for all models, as these methods' recipes always wrote it
            elif p.fl_per_model:
                for m, v in zip(models, values):
                    m[p.fl] = v
            else:
                if len({repr(v) for v in values}) > 1:
                    raise ParameterError(f"mergekit gives `{mk}` per model ({[settings.to_mergekit(v) for v in values]}"
                                         f"){where}; forgetlab's {method} takes one value for all models. Give the "
                                         f"models the same {mk}.")
                if values:
                    params[p.fl] = values[0]
        else:
            v = top.get(mk)
            if p.default is REQUIRED and (v is None or not settings.has_catch_all(v)):
                if v is None:
                    raise ParameterError(f"mergekit's {method} needs `{mk}`{where} (mergekit stops with 'Missing "
                                         f"required parameter {mk}'; it has no default): give it in the top-level "
                                         f"parameters, e.g. {mk}: 0.5.")
                raise ParameterError(f"The filters of `{mk}`{where} match only some tensors and mergekit then stops "
                                     f"('Missing required parameter {mk}'); end them with a `- value: …` for every "
                                     "other tensor.")
            v = p.default if v is None else combine(v, p.default)
            if p.fl is None:
                continue
            params[p.fl] = p.to_fl(v)
    if "scope" in get_method(method).param_names:
        params["scope"] = "tensor"  # mergekit trims per tensor
    return params, models


def _dtype(d: Mapping[str, Any]) -> str | None:
    dtype = d.get("out_dtype") or d.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        raise ParameterError(f"mergekit dtype {dtype!r} is not one of {', '.join(DTYPES)}.")
    return dtype


def _tokenizer(d: Mapping[str, Any]) -> dict | None:
    if d.get("tokenizer") is not None:
        tok = d["tokenizer"]
        if not isinstance(tok, Mapping):
            raise ParameterError(f"mergekit `tokenizer:` is {{source: union | base | MODEL, tokens: …, "
                                 f"pad_to_multiple_of: N}}; got {tok!r}.")
        tok = {"source": "union", **dict(tok)}  # mergekit's TokenizerConfig defaults source to union
        if not isinstance(tok["source"], str):
            tok["source"] = _mergekit_model(tok["source"], "tokenizer source")
        return check_tokenizer(tok)
    src = d.get("tokenizer_source")
    if src is None:
        return None
    return check_tokenizer({"source": src if isinstance(src, str) else _mergekit_model(src, "tokenizer_source")})


def from_mergekit(d: Mapping[str, Any]) -> Recipe:
    """Import a mergekit YAML dict as the forgetlab recipe that computes the same merge (module docstring);
    a setting forgetlab cannot compute is refused by name, with what to write instead — never ignored."""
    if not isinstance(d, Mapping):
        raise ParameterError("A mergekit recipe is a YAML mapping with merge_method and models (or slices).")
    spec = mergekit_method_spec(d.get("merge_method"))
    method = spec.name
    table = mergekit_params(spec)
    _check_keys(d)
    top = _check_params(method, table, _mapping(d.get("parameters"), None), None)
    base = None if d.get("base_model") is None else _mergekit_model(d["base_model"], "base_model")
    if base is None and base_policy(method) == "required":
        raise ParameterError(f"mergekit {method} needs a base_model (mergekit stops with 'Merge method requires a "
                             "base input'): add base_model: PATH, the model the others were fine-tuned from.")
    notes: list[str] = []
    if d.get("slices"):
        recipe = _import_slices(d, spec, table, top, base, notes)
    else:
        recipe = _import_models(d, spec, table, top, base, notes)
    recipe.notes = list(dict.fromkeys(notes))  # once each (every slice reads the same parameters)
    recipe.dtype = _dtype(d)
    recipe.tokenizer = _tokenizer(d)
    if recipe.tokenizer is not None:
        _check_tokenizer_source(recipe)
    name = d.get("name")
    recipe.name = None if name is None else str(name)
    recipe.validated_params()  # an imported recipe is a valid forgetlab recipe, or a message now
    return recipe


def _check_tokenizer_source(recipe: Recipe) -> None:
    src = recipe.tokenizer["source"]
    inputs = {recipe.base, *(m.model for m in recipe.models),
              *(s.model for sl in recipe.slices or [] for s in sl.sources)}
    if src not in ("base", "union") and src not in inputs:
        raise ParameterError(f"tokenizer source {src!r} is not among the recipe's models ({', '.join(sorted(inputs))})"
                             "; mergekit takes the tokenizer of one of them. Write base, union, or one of those "
                             "paths exactly as it is written under models.")


def _import_models(d, spec: MethodSpec, table, top: dict, base: str | None, notes: list[str]) -> Recipe:
    method = spec.name
    entries = check_models_list(d.get("models"), "The mergekit recipe's `models`")
    refs: list[tuple[str, dict]] = []
    seen: set[str] = set()
    for e in entries:
        ref, mp = _model_entry(e, "model")
        if ref in seen:
            raise ParameterError(f"The mergekit recipe lists {ref} twice under `models`; mergekit refuses duplicate "
                                 "inputs. List each model once (give it the weight it should have).")
        seen.add(ref)
        mp = _check_params(method, table, mp, ref)
        if base is not None and ref == base and base_policy(method) != "ignored":
            continue  # the base among the models: its task vector is zero and mergekit skips its parameters
        refs.append((ref, mp))
    if base_policy(method) == "ignored" and base is not None and base not in seen and method != "passthrough":
        if "weight" in table and top.get("weight") is None:
            raise ParameterError(f"mergekit's {method} averages base_model ({base}) in with the models, so it needs "
                                 f"a weight for it, which this recipe does not give (mergekit stops with 'Missing "
                                 f"required parameter weight'). List it under `models` with parameters: "
                                 f"{{weight: …}}, or remove base_model to average only the models listed.")
        refs.append((base, {}))  # mergekit adds base_model as one more input, with the top-level parameters
    if method == "passthrough":
        if len(refs) != 1:
            raise ParameterError(f"mergekit passthrough copies exactly one model (or layer ranges under `slices:`); "
                                 f"this recipe gives it {len(refs)} ({', '.join(r for r, _ in refs)}): keep one "
                                 "model, or write slices.")
        params, _ = _to_forgetlab(method, _per_input_as_shared(table),
                                  {**top, **{k: combine(v, top.get(k)) for k, v in refs[0][1].items()}}, [], "",
                                  notes)
        return Recipe(method, refs[0][0], [], params)
    if base is None:
        base = refs[0][0] if refs else None  # config and tokenizer only (linear, karcher, nuslerp, multislerp)
    if not refs:
        raise ParameterError(f"The mergekit recipe lists only its base_model ({base}) under `models`; add the "
                             "fine-tuned models to merge into it.")
    _check_counts(spec, len(refs), base)
    params, per_model = _to_forgetlab(method, table, top, refs, "", notes)
    if base_policy(method) == "optional":  # without base_model mergekit interpolates the models themselves
        params["use_base"] = d.get("base_model") is not None
    models = [ModelEntry(ref, {mergekit_model_key(spec, k): v for k, v in mp.items()}) for (ref, _), mp in zip(refs, per_model)]
    return Recipe(method, str(base), models, params)


def _per_input_as_shared(table: Mapping[str, MkParam]) -> dict[str, MkParam]:
    """passthrough's per-input `scale` is forgetlab's one value (passthrough has one input)."""
    return {k: MkParam(p.mk, p.fl, False, False, p.default, p.to_fl, p.to_mk)
            for k, p in table.items() if p.mk_per_model}


def _check_counts(spec: MethodSpec, n: int, base: str | None) -> None:
    """mergekit's input counts for the methods that take a fixed number (SLERP: the base and one model)."""
    if spec.max_models is not None and n > spec.max_models:
        other = ("its base_model and one other model" if spec.max_models == 1
                 else f"its base_model and at most {spec.max_models} other models")
        raise ParameterError(f"mergekit {spec.name} merges {other}; this recipe gives it {n} models besides the "
                             f"base ({base}). Keep {spec.max_models} model(s) under `models`, or use a method that "
                             f"merges more (multislerp, karcher, linear, ties).")
    if n < spec.min_models:
        raise ParameterError(f"mergekit {spec.name} needs at least {spec.min_models} models besides the base; this "
                             f"recipe gives {n}.")


def _import_slices(d, spec: MethodSpec, table, top: dict, base: str | None, notes: list[str]) -> Recipe:
    method = spec.name
    if base_policy(method) == "optional" and base is None:
        raise ParameterError(f"mergekit {method} with slices and no base_model is not supported: forgetlab merges "
                             "every slice into a base. Add base_model: PATH, or merge whole models (`models:`).")
    raw = d["slices"]
    if not isinstance(raw, list):
        raise ParameterError("mergekit `slices` is a list of {sources: [{model: PATH, layer_range: [START, END]}]}.")
    slices: list[Slice] = []
    for i, sl in enumerate(raw):
        where = f" in slice {i + 1}"
        if not isinstance(sl, Mapping) or not isinstance(sl.get("sources"), list) or not sl["sources"]:
            raise ParameterError(f"mergekit slice {i + 1} is {{sources: [{{model: PATH, layer_range: [START, END]}}]}}"
                                 f"; got {sl!r}.")
        extra = [k for k in sl if k not in ("sources", "parameters", "base_model", "residual_weight")]
        if extra:
            raise ParameterError(f"mergekit slice {i + 1} has unknown key(s) {', '.join(map(repr, extra))}; a slice "
                                 "has sources and parameters.")
        if sl.get("residual_weight") is not None:
            raise ParameterError(f"mergekit residual_weight (slice {i + 1}) is not supported; remove it.")
        if sl.get("base_model") is not None and _mergekit_model(sl["base_model"], "base_model") != base:
            raise ParameterError(f"mergekit slice {i + 1} has its own base_model; forgetlab merges every slice into "
                                 "the recipe's base_model. Move it to the top-level base_model.")
        sparams = _check_params(method, table, _mapping(sl.get("parameters"), f"slice {i + 1}"), None)
        srcs: list[tuple[str, dict, Any]] = []
        for s in sl["sources"]:
            ref, mp = _model_entry(s, "slice source")
            if "layer_range" not in s:
                raise ParameterError(f"mergekit slice {i + 1}: the source {ref} has no layer_range [START, END].")
            srcs.append((ref, _check_params(method, table, mp, ref), s["layer_range"]))
        if method == "passthrough" and len(srcs) != 1:
            raise ParameterError(f"mergekit passthrough takes one source per slice; slice {i + 1} has {len(srcs)}. "
                                 "Give each layer range its own slice.")
        merged_top = {k: combine(sparams.get(k), top.get(k)) for k in {*top, *sparams}}
        if method == "passthrough":
            ref, mp, lr = srcs[0]
            p, _ = _to_forgetlab(method, _per_input_as_shared(table), {**merged_top, **{k: combine(v, merged_top.get(k))
                                                                                     for k, v in mp.items()}}, [], where,
                               notes)
            sources = [SliceSource(ref, _range(lr, i))]
            slices.append(Slice(sources, p))
            continue
        into_base = base is not None and base_policy(method) != "ignored"   # the base is no input: its parameters go unread
        non_base = [(r, mp) for r, mp, _ in srcs if not (into_base and r == base)]
        params, per_model = _to_forgetlab(method, table, merged_top, non_base, where, notes)
        pm = iter(per_model)
        sources = []
        for r, mp, lr in srcs:
            own = {} if (into_base and r == base) else next(pm)
            sources.append(SliceSource(r, _range(lr, i), {mergekit_model_key(spec, k): v for k, v in own.items()}))
        slices.append(Slice(sources, params))
    first = slices[0].sources[0].model
    rbase = base or first
    models = []
    for sl in slices:
        for s in sl.sources:
            if s.model != rbase and s.model not in [m.model for m in models]:
                models.append(ModelEntry(s.model))
    recipe = Recipe(method, str(rbase), models, {}, slices=slices)
    if method != "passthrough":
        for i, sl in enumerate(slices):
            _check_counts(spec, len([s for s in sl.sources if s.model != rbase]), rbase)
    check_slices(recipe)
    return recipe


def _range(value: Any, i: int) -> tuple[int, int]:
    return read_layer_range(value, f"mergekit slice {i + 1}")


# -- export


# -- model references
def _mergekit_path(value: Any, where: str) -> str:
    """A mergekit ModelPath: a path or hub id, or {path: …, revision: …} (a revision is refused: forgetlab
    opens what is at the path)."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, Mapping) and isinstance(value.get("path"), str) and value["path"]:
        extra = [k for k in value if k not in ("path", "revision")]
        if extra:
            raise ParameterError(f"mergekit model path {dict(value)!r} has unknown key(s) "
                                 f"{', '.join(map(repr, extra))}; a path is {{path: …, revision: …}}.")
        if value.get("revision") is not None:
            raise ParameterError(f"mergekit {where} {value['path']} asks for revision {value['revision']!r}; forgetlab "
                                 f"reads a model as it is on disk or the hub's default revision. Download that "
                                 f"revision (huggingface-cli download {value['path']} --revision "
                                 f"{value['revision']} --local-dir DIR) and give DIR.")
        return value["path"]
    raise ParameterError(f"A mergekit model must name a path or hub id; got {value!r}.")


def _mergekit_model(value: Any, where: str) -> str:
    """A mergekit model reference as forgetlab names it: `path`, or `BASE+ADAPTER` for a LoRA adapter on a model,
    written either as that string or as {model: BASE, lora: ADAPTER} (mergekit's ModelReference)."""
    if isinstance(value, str):
        if not value:
            raise ParameterError(f"A mergekit model must name a path or hub id; got {value!r}.")
        return value
    if not isinstance(value, Mapping) or "model" not in value:
        raise ParameterError(f"A mergekit model must name a path or hub id; got {value!r}.")
    if value.get("override_architecture") is not None:
        raise ParameterError(f"mergekit override_architecture ({value['override_architecture']!r}) is not supported: "
                             "forgetlab reads each model's architecture from its config.json. Remove it (and fix "
                             "the model's config.json if it is wrong).")
    extra = [k for k in value if k not in ("model", "lora", "override_architecture")]
    if extra:
        raise ParameterError(f"mergekit model {dict(value)!r} has unknown key(s) {', '.join(map(repr, extra))}; a "
                             "model is a path, `BASE+ADAPTER`, or {model: BASE, lora: ADAPTER}.")
    model = _mergekit_path(value["model"], where)
    if value.get("lora") is None:
        return model
    return f"{model}+{_mergekit_path(value['lora'], where + ' lora')}"
