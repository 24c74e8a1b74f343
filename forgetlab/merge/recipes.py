"""Merge recipes: `Recipe` (what a merge computes, checked against the registry) and forgetlab's YAML dict of it.

forgetlab recipe (parameter names of docs/methods.md; per-model values under each model, e.g. `weight`):

    method: ties
    base: /models/base
    models:
      - model: /models/ft-math
        weight: 1.0
      - model: /models/ft-code
    params: {keep: 0.2, lam: 1.0, scope: tensor}
    dtype: float32        # optional: output dtype (default: the base's)
    seed: 0               # optional: for seeded methods (dare_*)

Values may vary by tensor: `{gradient: [0.2, 0.8]}` over the layers, or filter lists
`[{filter: self_attn, value: 0.5}, {value: 1.0}]` (forgetlab.merge.settings). `slices` stack layer ranges of
several models (forgetlab.merge.slicing); `tokenizer: {source: base | union | MODEL}` names the output
vocabulary.

mergekit YAML is read by forgetlab.merge.mergekit_yaml and written by forgetlab.merge.mergekit_export for every
method registered under a mergekit name, with mergekit 0.1.5's semantics and defaults (docs/merging.md);
forgetlab.merge.recipe_io reads a recipe from anything (a file, YAML text, a dict) in either dialect.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from forgetlab.core.errors import ParameterError
from forgetlab.merge import settings
from forgetlab.merge.registry import get_method, validate_params

DTYPES = ("float32", "float16", "bfloat16", "float64")


def check_seed(value: Any, where: str = "seed") -> int | None:
    """A recipe's seed as an int (None stays None): whole numbers in [0, 2**63) only — 1.9, .inf, "abc" and
    booleans are refused with a ParameterError instead of being truncated or raising a Python error."""
    if value is None:
        return None
    ok = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and value.is_integer():  # YAML `3.0`
        value, ok = int(value), True
    if not ok or not (0 <= value < 2**63):
        raise ParameterError(f"{where} must be a whole number from 0 to 2**63 − 1 (it fixes the random masks of "
                             f"dare_*); got {value!r}. Write e.g. `seed: 0`.")
    return int(value)


def check_models_list(models: Any, what: str) -> list:
    """`models` must be a YAML list: a string would be read character by character, a mapping by its keys."""
    if not isinstance(models, list):
        raise ParameterError(
            f"{what} must be a list of models (one `- path` or `- model: path` per line); got a "
            f"{type(models).__name__} ({str(models)[:80]!r}).")
    return models


@dataclass
class ModelEntry:
    """One fine-tuned model of a recipe and its per-model parameters (e.g. {"weight": 0.5})."""

    model: str
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"model": self.model, **self.params}


@dataclass
class SliceSource:
    """One source of an output slice: layers [start, end) of `model`, with per-model parameters."""

    model: str
    layer_range: tuple[int, int]
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"model": self.model, "layer_range": list(self.layer_range), **self.params}


@dataclass
class Slice:
    """An output slice (mergekit's `slices`): equally long layer ranges of its sources, merged layer by layer and
    appended to the output stack; `params` override the recipe's for its tensors."""

    sources: list[SliceSource]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return self.sources[0].layer_range[1] - self.sources[0].layer_range[0]

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"sources": [s.to_dict() for s in self.sources]}
        if self.params:
            d["params"] = dict(self.params)
        return d


def combine(high: Any, low: Any) -> Any:
    """A setting of higher precedence backed by one of lower precedence, as mergekit resolves them: the higher
    one unless it is a filter list that matches nothing for a tensor, then the lower one."""
    if high is None:
        return low
    if low is None or not settings.is_filter_list(high) or settings.has_catch_all(high):
        return high
    return list(high) + (list(low) if settings.is_filter_list(low) else [{"value": low}])


@dataclass
class Recipe:
    """A merge: method, base, fine-tuned models (with per-model parameters), global parameters, dtype, seed;
    optionally `slices` (layer ranges stacked into a new model, mergekit's frankenmerges) and `tokenizer`
    (the output vocabulary: {source: base | union | MODEL, tokens: …, pad_to_multiple_of: N}).

    Parameter values may vary by tensor (per-layer gradients, name filters: forgetlab.merge.settings).

    `notes`: what the reader of the recipe should be told and the merge does not show, one line each (a mergekit
    parameter that mergekit ignores, so it changes nothing here either); not part of the recipe itself (not in
    `to_dict`): the CLI prints them, a merge keeps them in its recipe.yaml and the Merge page shows them."""

    method: str
    base: str
    models: list[ModelEntry]
    params: dict[str, Any] = field(default_factory=dict)
    dtype: str | None = None
    seed: int | None = None
    name: str | None = None
    pool: str | None = None
    slices: list[Slice] | None = None
    tokenizer: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list, compare=False, repr=False)

    # -- parameters
    @property
    def varying(self) -> bool:
        """Whether a parameter varies by tensor (a gradient or a filter list, globally or for a model)."""
        values = list(self.params.values()) + [v for m in self.models for v in m.params.values()]
        return any(settings.is_setting(v) for v in values)

    def method_params(self, tensor: str | tuple[str, ...] | None = None, t: float = 0.0,
                      model_tensor: str | None = None, pick=None) -> dict[str, Any]:
        """Parameters for the method: global ones, per-model ones gathered into lists, and the seed. Values that
        vary by tensor are evaluated for `tensor` (its name, or its names: `forgetlab.merge.layers.filter_names`)
        at layer position `t` (per-model values for `model_tensor`, the name in that model, default `tensor`);
        without a tensor, `pick(setting)` chooses the value (default: its first). A filter list that matches
        nothing leaves the parameter at the method's default."""
        spec = get_method(self.method)
        if tensor is None:
            pick = pick or (lambda v: settings.leaves(v)[0])
            ev = (lambda v, _name: pick(v) if settings.is_setting(v) else v)
        else:
            ev = (lambda v, name: settings.evaluate(v, name, t))
        out = {}
        for k, v in self.params.items():
            v = ev(v, tensor)
            if v is not None:
                out[k] = v
        by_key = {(p.model_key or p.name): p for p in spec.params if p.per_model}
        for key, p in by_key.items():
            values = [m.params.get(key) for m in self.models]
            if any(v is not None for v in values):
                if p.name in self.params:
                    raise ParameterError(f"{p.name} is given both globally and per model; give it in one place.")
                values = [None if v is None else ev(v, model_tensor or tensor) for v in values]
                out[p.name] = [p.default if v is None else v for v in values]
        for m in self.models:
            unknown = [k for k in m.params if k not in by_key]
            if unknown:
                raise ParameterError(
                    f"Model {m.model}: {', '.join(map(repr, unknown))} is not a per-model parameter of "
                    f"{self.method}; per-model parameters are {', '.join(by_key) or '(none)'}.")
        if self.seed is not None and "seed" in spec.param_names and "seed" not in out:
            out["seed"] = int(self.seed)
        return out

    def validated_params(self) -> dict[str, Any]:
        """`method_params()` checked against the registry (see validate_params). Values that vary by tensor are
        checked one by one (every value of every gradient and filter); the result holds the first of each."""
        if self.slices is not None:
            return [self.slice_recipe(i).validated_params() for i in range(len(self.slices))][0]
        out = validate_params(self.method, self.method_params(), n_models=len(self.models))
        if self.varying:
            for v in [*self.params.values(), *(x for m in self.models for x in m.params.values())]:
                if settings.is_setting(v):
                    for leaf in settings.leaves(v)[1:]:
                        validate_params(self.method, self.method_params(
                            pick=lambda s, v=v, leaf=leaf: leaf if s is v else settings.leaves(s)[0]),
                            n_models=len(self.models))
        return out

    def params_at(self, tensor: str | tuple[str, ...], t: float, model_tensor: str | None = None,
                  cache: dict | None = None) -> dict:
        """The validated parameters for one tensor (see method_params); `cache` (a dict) reuses the validation of
        equal raw values."""
        raw = self.method_params(tensor, t, model_tensor)
        key = repr(sorted(raw.items()))
        if cache is not None and key in cache:
            return cache[key]
        out = validate_params(self.method, raw, n_models=len(self.models))
        if cache is not None:
            cache[key] = out
        return out

    def slice_recipe(self, index: int) -> "Recipe":
        """The recipe of output slice `index`: its sources as base (the source that is the recipe's base, for
        methods that take one; else the first source) and models, its parameters over the recipe's."""
        sl = self.slices[index]
        spec = get_method(self.method)
        srcs = list(sl.sources)
        base_i = next((i for i, s in enumerate(srcs) if s.model == self.base), None)
        if spec.min_models == 0 and len(srcs) == 1:
            base_i = 0
        if base_i is None:
            raise ParameterError(f"Slice {index + 1} does not take layers from the base {self.base}, which "
                                 f"{self.method} merges the other models into: add the base to the slice's sources "
                                 "with the same layer range.")
        params = {k: combine(sl.params.get(k), self.params.get(k)) for k in {*self.params, *sl.params}}
        models = [ModelEntry(s.model, dict(s.params)) for i, s in enumerate(srcs) if i != base_i]
        if spec.min_models == 0 and srcs[base_i].params:  # passthrough: its one input's parameters are its own
            params.update({k: combine(v, params.get(k)) for k, v in srcs[base_i].params.items()})
        return Recipe(self.method, srcs[base_i].model, models, params, self.dtype, self.seed, self.name, self.pool)

    # -- (de)serialisation
    def to_dict(self) -> dict:
        d: dict[str, Any] = {"method": self.method, "base": self.base,
                             "models": [m.to_dict() for m in self.models], "params": dict(self.params)}
        if self.slices is not None:
            d["slices"] = [s.to_dict() for s in self.slices]
        for k in ("tokenizer", "dtype", "seed", "name", "pool"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Recipe":
        """Build from forgetlab's recipe dict (checks the keys; the method must be registered)."""
        if not isinstance(d, Mapping):
            raise ParameterError("A recipe must be a YAML mapping with method, base, models and params.")
        allowed = {"method", "base", "models", "params", "dtype", "seed", "name", "pool", "slices", "tokenizer",
                   "forgetlab"}
        unknown = [k for k in d if k not in allowed]
        if unknown:
            raise ParameterError(f"Unknown recipe key(s) {', '.join(map(repr, unknown))}; a recipe has "
                                 f"{', '.join(sorted(allowed - {'forgetlab'}))}.")
        if d.get("method") in (None, ""):
            raise ParameterError("The recipe has no `method`.")
        spec = get_method(str(d["method"]))
        if d.get("models") in (None, "", []) and spec.min_models > 0 and d.get("slices") is None:
            raise ParameterError("The recipe lists no fine-tuned model: add at least one under `models`.")
        models = []
        for m in check_models_list(d.get("models") or [], "The recipe's `models`"):
            if isinstance(m, str):
                models.append(ModelEntry(m))
            elif isinstance(m, Mapping) and "model" in m:
                models.append(ModelEntry(str(m["model"]), {k: _checked(v, f"{m['model']}: {k}")
                                                           for k, v in m.items() if k != "model"}))
            else:
                raise ParameterError(f"Each entry of `models` is a path or a mapping with `model:`; got {m!r}.")
        dtype = d.get("dtype")
        if dtype is not None and dtype not in DTYPES:
            raise ParameterError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}.")
        params = d.get("params") or {}
        if not isinstance(params, Mapping):
            raise ParameterError("`params` must be a mapping of parameter names to values.")
        params = {k: _checked(v, f"params.{k}") for k, v in params.items()}
        slices = None if d.get("slices") is None else _slices(d["slices"])
        tokenizer = None if d.get("tokenizer") is None else check_tokenizer(d["tokenizer"])
        base = d.get("base")
        if base in (None, ""):
            base = _base_donor(spec, params, models, slices)
        recipe = cls(str(d["method"]), str(base), models, dict(params), dtype, check_seed(d.get("seed")),
                     d.get("name"), d.get("pool"), slices, tokenizer)
        if slices is not None:
            for sl in slices:
                for src in sl.sources:
                    if src.model != recipe.base and src.model not in [m.model for m in recipe.models]:
                        recipe.models.append(ModelEntry(src.model))
            check_slices(recipe)
        return recipe


def _base_donor(spec, params: Mapping[str, Any], models: list[ModelEntry], slices: list[Slice] | None) -> str:
    """The `base` of a recipe that gives none: refused for a method that reads θ0 (`MethodSpec.needs_base`); else
    the first model, which then only lends the output its config and tokenizer (as mergekit takes them from its
    first model when base_model is left out)."""
    plain = {k: v for k, v in params.items() if not settings.is_setting(v)}
    if spec.needs_base(validate_params(spec, plain, n_models=len(models) or 1)):
        hint = (" (or use_base: false, to interpolate the models themselves)" if "use_base" in spec.param_names
                else "")
        raise ParameterError(f"The recipe has no `base`, which {spec.name} merges the models into: add base: PATH, "
                             f"the model the others were fine-tuned from{hint}.")
    first = models[0].model if models else (slices[0].sources[0].model if slices else None)
    if first is None:
        raise ParameterError("The recipe has no `base` and no models: list the models to merge under `models`.")
    return first


def _checked(value: Any, where: str) -> Any:
    """A parameter value of forgetlab's YAML: plain, `{gradient: [...]}` or a filter list (checked; a null is
    refused by settings.check)."""
    return settings.check(value, where) if (value is None or isinstance(value, Mapping)
                                            or settings.is_filter_list(value)) else value


def read_layer_range(value: Any, where: str) -> tuple[int, int]:
    """A slice's `layer_range` [START, END) as two whole numbers with 0 ≤ START < END; ParameterError naming
    `where` otherwise."""
    ok = (isinstance(value, (list, tuple)) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in value))
    if not ok or not (0 <= value[0] < value[1]):
        raise ParameterError(f"{where}: layer_range is [START, END) with 0 ≤ START < END (whole numbers), e.g. "
                             f"[0, 8]; got {value!r}.")
    return int(value[0]), int(value[1])


def _slices(value: Any) -> list[Slice]:
    """forgetlab's `slices`: [{sources: [{model, layer_range, <per-model params>}], params: {…}}]."""
    if not isinstance(value, list) or not value:
        raise ParameterError("`slices` is a non-empty list of {sources: [{model: PATH, layer_range: [START, END]}]}.")
    out = []
    for i, sl in enumerate(value):
        where = f"slice {i + 1}"
        if not isinstance(sl, Mapping) or not isinstance(sl.get("sources"), list) or not sl["sources"]:
            raise ParameterError(f"{where}: a slice is {{sources: [{{model: PATH, layer_range: [START, END]}}]}}; "
                                 f"got {sl!r}.")
        extra = [k for k in sl if k not in ("sources", "params")]
        if extra:
            raise ParameterError(f"{where}: unknown key(s) {', '.join(map(repr, extra))}; a slice has sources and "
                                 "params.")
        sources = []
        for src in sl["sources"]:
            if not isinstance(src, Mapping) or not src.get("model") or "layer_range" not in src:
                raise ParameterError(f"{where}: each source is {{model: PATH, layer_range: [START, END]}}; got "
                                     f"{src!r}.")
            sources.append(SliceSource(str(src["model"]), read_layer_range(src["layer_range"], where),
                                       {k: _checked(v, f"{where} {src['model']}: {k}")
                                        for k, v in src.items() if k not in ("model", "layer_range")}))
        params = sl.get("params") or {}
        if not isinstance(params, Mapping):
            raise ParameterError(f"{where}: params must be a mapping of parameter names to values.")
        out.append(Slice(sources, {k: _checked(v, f"{where} params.{k}") for k, v in params.items()}))
    return out


def check_slices(recipe: "Recipe") -> None:
    """Every slice's sources span the same number of layers, list each model once, and (for methods that merge
    into a base) include the base; each slice's parameters are valid for the method."""
    for i, sl in enumerate(recipe.slices or []):
        lengths = {s.layer_range[1] - s.layer_range[0] for s in sl.sources}
        if len(lengths) > 1:
            raise ParameterError(f"Slice {i + 1} takes {sorted(lengths)} layers from its sources; every source of a "
                                 "slice must span the same number of layers (they are merged layer by layer).")
        names = [s.model for s in sl.sources]
        twice = sorted({m for m in names if names.count(m) > 1})
        if twice:
            raise ParameterError(f"Slice {i + 1} lists {', '.join(twice)} twice; list each model once per slice.")
        recipe.slice_recipe(i).validated_params()


TOKENIZER_SOURCES = ("base", "union")


def check_tokenizer(value: Any) -> dict[str, Any]:
    """forgetlab's `tokenizer`: {source: base | union | MODEL, tokens: {TOKEN: {source: …, force: …}},
    pad_to_multiple_of: N} (mergekit's `tokenizer:` block; `tokenizer_source: X` is {source: X})."""
    if not isinstance(value, Mapping) or not value.get("source"):
        raise ParameterError(f"`tokenizer` is {{source: base | union | MODEL}} (optionally tokens and "
                             f"pad_to_multiple_of); got {value!r}.")
    extra = [k for k in value if k not in ("source", "tokens", "pad_to_multiple_of")]
    if extra:
        raise ParameterError(f"`tokenizer` has unknown key(s) {', '.join(map(repr, extra))}; it has source, tokens "
                             "and pad_to_multiple_of.")
    out: dict[str, Any] = {"source": str(value["source"])}
    pad = value.get("pad_to_multiple_of")
    if pad is not None:
        if not isinstance(pad, int) or isinstance(pad, bool) or pad < 1:
            raise ParameterError(f"tokenizer pad_to_multiple_of must be a whole number ≥ 1 (e.g. 64); got {pad!r}.")
        out["pad_to_multiple_of"] = pad
    tokens = value.get("tokens")
    if tokens:
        if not isinstance(tokens, Mapping):
            raise ParameterError("tokenizer tokens is a mapping TOKEN: {source: MODEL | {kind: zero} | "
                                 "{kind: model_token, model: M, token: T}, force: false}.")
        out["tokens"] = {str(k): dict(v or {}) for k, v in tokens.items()}
    return out


def _ref_key(ref: Any) -> str:
    """A model reference compared by what it points at: an existing path resolved, anything else as written."""
    path = Path(str(ref)).expanduser()
    return str(path.resolve()) if path.exists() else str(ref)


def recipe_parents(pool, recipe: Recipe) -> list[str]:
    """Pool names of the recipe's fine-tuned models (matched by the folder they point at), in recipe order;
    the base among them (mergekit's linear merges may list it) is left out, as it is scored as "base".
    ParameterError when the recipe merges into another base than the pool's or names a model the pool lacks
    (its scorecards would not be comparable)."""
    base = _ref_key(pool.base_ref)
    if _ref_key(recipe.base) != base:
        raise ParameterError(f"The recipe merges into {recipe.base}, but the pool's base is {pool.base_ref}; "
                             "evaluate the merge with a pool of the same base.")
    by_ref = {_ref_key(e.ref): n for n, e in pool.entries.items()}
    models = [m for m in recipe.models if _ref_key(m.model) != base]
    missing = [m.model for m in models if _ref_key(m.model) not in by_ref]
    if missing:
        raise ParameterError(f"The recipe merges {', '.join(map(str, missing))}, which the pool does not hold "
                             f"(its models: {', '.join(pool.model_names)}); add them to the pool file to compare "
                             "the merge with its parents.")
    return [by_ref[_ref_key(m.model)] for m in models]
