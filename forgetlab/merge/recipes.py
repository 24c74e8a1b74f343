"""Merge recipes: forgetlab's YAML ↔ `Recipe`, and import/export of mergekit YAML.

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

mergekit YAML (detected by its `merge_method` key) is imported for linear, task_arithmetic, ties,
dare_linear, dare_ties and breadcrumbs: `density` → `keep` (ties, breadcrumbs) or `drop = 1 − density`
(dare_*), `lambda` → `lam`, `weight` → `weight`, `gamma` → `gamma`, `out_dtype`/`dtype` → `dtype`,
`{model: BASE, lora: ADAPTER}` → `BASE+ADAPTER`. mergekit 0.1.5's defaults are read as mergekit reads them
(`normalize` is true for linear and ties only, `rescale` true for dare_* only): forgetlab's ties and dare_ties
are mergekit's `normalize: true`; `normalize: true` for task_arithmetic, dare_linear and breadcrumbs divides
the weights by their sum; linear with a base_model averages the base in. Settings forgetlab cannot compute
(a sum for ties/dare_ties, `rescale: true` for ties/breadcrumbs, chat_template, tokenizer, modules, slices,
a model listed twice, parameters the method does not have …) are refused by name with what to write instead.
The table and the remaining differences (DARE's rescaling, TIES's scope) are in docs/merging.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from forgetlab.core.errors import ParameterError
from forgetlab.core.yamlio import YamlError, load_file, safe_load
from forgetlab.merge.registry import get_method, validate_params

DTYPES = ("float32", "float16", "bfloat16", "float64")
MERGEKIT_METHODS = ("linear", "task_arithmetic", "ties", "dare_linear", "dare_ties", "breadcrumbs")


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


def _check_models_list(models: Any, what: str) -> list:
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
class Recipe:
    """A merge: method, base, fine-tuned models (with per-model parameters), global parameters, dtype, seed."""

    method: str
    base: str
    models: list[ModelEntry]
    params: dict[str, Any] = field(default_factory=dict)
    dtype: str | None = None
    seed: int | None = None
    name: str | None = None
    pool: str | None = None

    # -- parameters
    def method_params(self) -> dict[str, Any]:
        """Parameters for the method: global ones, per-model ones gathered into lists, and the seed."""
        spec = get_method(self.method)
        out = dict(self.params)
        by_key = {(p.model_key or p.name): p for p in spec.params if p.per_model}
        for key, p in by_key.items():
            values = [m.params.get(key) for m in self.models]
            if any(v is not None for v in values):
                if p.name in self.params:
                    raise ParameterError(f"{p.name} is given both globally and per model; give it in one place.")
                default = p.default
                out[p.name] = [default if v is None else v for v in values]
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
        """`method_params()` checked against the registry (see validate_params)."""
        return validate_params(self.method, self.method_params(), n_models=len(self.models))

    # -- (de)serialisation
    def to_dict(self) -> dict:
        d: dict[str, Any] = {"method": self.method, "base": self.base,
                             "models": [m.to_dict() for m in self.models], "params": dict(self.params)}
        for k in ("dtype", "seed", "name", "pool"):
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
        allowed = {"method", "base", "models", "params", "dtype", "seed", "name", "pool", "forgetlab"}
        unknown = [k for k in d if k not in allowed]
        if unknown:
            raise ParameterError(f"Unknown recipe key(s) {', '.join(map(repr, unknown))}; a recipe has "
                                 f"{', '.join(sorted(allowed - {'forgetlab'}))}.")
        for k in ("method", "base", "models"):
            if k not in d or d[k] in (None, "", []):
                if k == "models":
                    raise ParameterError("The recipe lists no fine-tuned model: add at least one under `models`.")
                raise ParameterError(f"The recipe has no `{k}`.")
        get_method(str(d["method"]))
        models = []
        for m in _check_models_list(d["models"], "The recipe's `models`"):
            if isinstance(m, str):
                models.append(ModelEntry(m))
            elif isinstance(m, Mapping) and "model" in m:
                models.append(ModelEntry(str(m["model"]), {k: v for k, v in m.items() if k != "model"}))
            else:
                raise ParameterError(f"Each entry of `models` is a path or a mapping with `model:`; got {m!r}.")
        dtype = d.get("dtype")
        if dtype is not None and dtype not in DTYPES:
            raise ParameterError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}.")
        params = d.get("params") or {}
        if not isinstance(params, Mapping):
            raise ParameterError("`params` must be a mapping of parameter names to values.")
        return cls(str(d["method"]), str(d["base"]), models, dict(params), dtype,
                   check_seed(d.get("seed")), d.get("name"), d.get("pool"))

    # -- mergekit
    @classmethod
    def from_mergekit(cls, d: Mapping[str, Any]) -> "Recipe":
        """Import a mergekit YAML dict (linear, task_arithmetic, ties, dare_linear, dare_ties, breadcrumbs) as the
        forgetlab recipe that computes the same merge (mergekit 0.1.5's semantics, docs/merging.md); a setting
        forgetlab cannot compute is refused by name, with what to write instead — never ignored."""
        method = d.get("merge_method")
        if method not in MERGEKIT_METHODS:
            raise ParameterError(f"mergekit method {method!r} has no forgetlab counterpart; importable methods: "
                                 f"{', '.join(MERGEKIT_METHODS)}.")
        _check_mergekit_keys(d)
        top = d.get("parameters") or {}
        if not isinstance(top, Mapping):
            raise ParameterError(f"mergekit `parameters` must be a mapping like {{lambda: 1.0}}; got {top!r}.")
        top = dict(top)
        _check_mergekit_params(method, top, None)
        entries = d.get("models") or []
        if not entries:
            raise ParameterError("The mergekit recipe lists no models.")
        _check_models_list(entries, "The mergekit recipe's `models`")
        base = None if d.get("base_model") is None else _mergekit_model(d["base_model"], "base_model")
        models: list[ModelEntry] = []
        per_model: list[dict] = []
        seen: set[str] = set()
        for e in entries:
            if isinstance(e, str):
                e = {"model": e}
            if not isinstance(e, Mapping) or not e.get("model"):
                raise ParameterError(f"Each mergekit model entry is a path or a mapping with `model:`; got {e!r}.")
            ref = _mergekit_model(e["model"], "model")
            extra = [k for k in e if k not in ("model", "parameters")]
            if extra:
                hint = ", ".join(f"{k}: {e[k]!r}" for k in extra)
                raise ParameterError(f"The mergekit entry of {ref} has {', '.join(map(repr, extra))} beside `model` "
                                     f"and `parameters`, where mergekit ignores it; put it under the entry's "
                                     f"`parameters`, e.g. parameters: {{{hint}}}.")
            if ref in seen:
                raise ParameterError(f"The mergekit recipe lists {ref} twice under `models`; mergekit refuses "
                                     "duplicate inputs. List each model once (give it the weight it should have).")
            seen.add(ref)
            mp = e.get("parameters") or {}
            if not isinstance(mp, Mapping):
                raise ParameterError(f"mergekit `parameters` of {ref} must be a mapping like {{weight: 1.0}}; "
                                     f"got {mp!r}.")
            mp = dict(mp)
            _check_mergekit_params(method, mp, ref)
            if base is not None and ref == base and method != "linear":
                continue  # mergekit lets the base appear among the models; its task vector is zero
            models.append(ModelEntry(ref))
            per_model.append(mp)
        if method == "linear" and base is not None and base not in seen:
            # mergekit's linear averages base_model in as one more input, with the top-level parameters
            if top.get("weight") is None:
                raise ParameterError(f"mergekit's linear averages base_model ({base}) in with the models, so it needs "
                                     f"a weight for it, which this recipe does not give (mergekit stops with 'Missing "
                                     f"required parameter weight'). List it under `models` with parameters: "
                                     f"{{weight: …}}, or remove base_model to average only the models listed.")
            models.append(ModelEntry(base))
            per_model.append({})
        if base is None:
            if method != "linear":
                raise ParameterError(f"mergekit {method} needs a base_model.")
            base = models[0].model
        if not models:
            raise ParameterError(f"The mergekit recipe lists only its base_model ({base}) under `models`; add the "
                                 "fine-tuned models to merge into it.")
        for k, v in list(top.items()):
            if not isinstance(v, (int, float, bool)):
                raise ParameterError(f"mergekit parameter {k}={v!r} (gradients or filters) is not supported; "
                                     "give plain numbers.")

        def value(key, default=None):
            vals = [mp.get(key, top.get(key, default)) for mp in per_model]
            for v in vals:
                if v is not None and not isinstance(v, (int, float)):
                    raise ParameterError(f"mergekit parameter {key}={v!r} (gradients or filters) is not supported.")
            return vals

        def single(key, default):
            vals = value(key, default)
            if key == "density":
                for v in vals:
                    if not (0.0 <= float(v) <= 1.0):
                        raise ParameterError(f"mergekit density must lie in [0, 1] (the share of each task vector "
                                             f"kept); got {v}.")
            if len(set(vals)) > 1:
                raise ParameterError(f"mergekit gives {key} per model ({vals}); forgetlab's {method} takes one value "
                                     f"for all models.")
            return vals[0]

        params: dict[str, Any] = {}
        weights = [float(w) for w in value("weight", 1.0)]
        # mergekit 0.1.5's defaults (merge_methods/registry.py): normalize is true for linear and ties, false for
        # task_arithmetic, dare_linear, dare_ties and breadcrumbs; rescale is true for dare_*, false otherwise
        normalize = bool(top.get("normalize", method in ("linear", "ties")))
        rescale = bool(top.get("rescale", method in ("dare_linear", "dare_ties")))
        density = 1.0 if method in ("linear", "task_arithmetic") else float(single("density", 1.0))
        if method == "linear":
            params["normalize"] = normalize
        else:
            params["lam"] = float(top.get("lambda", 1.0))
            if method in ("ties", "dare_ties") and not normalize:
                fix = ("remove it or write `normalize: true` (mergekit's default for ties)" if method == "ties"
                       else "write `normalize: true` under `parameters`")
                raise ParameterError(
                    f"mergekit {method} with normalize: false{' (its default)' if 'normalize' not in top else ''} "
                    f"adds up the entries that agree with the elected sign (a sum); forgetlab's {method} averages "
                    f"them (the disjoint mean), which is mergekit's normalize: true. To import it as that mean, "
                    f"{fix} (the merge then differs from mergekit's sum); for a plain sum without sign election use "
                    f"{'task_arithmetic' if method == 'ties' else 'dare_linear'}.")
            if method not in ("ties", "dare_ties") and normalize:
                total = sum(weights)  # mergekit divides Σ wt·τt by Σ wt (by 1 when |Σ wt| < 1e-8)
                if abs(total) >= 1e-8:
                    weights = [w / total for w in weights]
        if method == "task_arithmetic" and any(float(v) != 1.0 for v in value("density", 1.0)):
            raise ParameterError("mergekit's task_arithmetic has a density parameter but trims nothing with it (it "
                                 "is ignored there); remove density, or use ties, dare_linear or breadcrumbs to "
                                 "sparsify the task vectors.")
        if rescale and density < 1 and method in ("ties", "breadcrumbs"):
            raise ParameterError(f"mergekit {method} with rescale: true scales each sparsified task vector back to "
                                 f"its L1 norm; forgetlab's {method} does not rescale. Remove `rescale` (mergekit's "
                                 f"default for {method} is false) to import it without the rescale, or use "
                                 f"dare_ties/dare_linear, which rescale their survivors.")
        if not rescale and density < 1 and method in ("dare_linear", "dare_ties"):
            raise ParameterError("mergekit DARE with rescale: false has no forgetlab counterpart (forgetlab always "
                                 "rescales survivors by 1/(1 − drop)); remove `rescale` (mergekit's default for "
                                 "DARE is true).")
        if method == "ties":
            params["keep"] = density
            params["scope"] = "tensor"
        elif method in ("dare_linear", "dare_ties"):
            params["drop"] = _complement(density)
        elif method == "breadcrumbs":
            params["keep"] = density
            params["gamma"] = float(single("gamma", 0.01))
        models = [ModelEntry(m.model, {"weight": w}) if w != 1.0 else m for m, w in zip(models, weights)]
        dtype = d.get("out_dtype") or d.get("dtype")
        if dtype is not None and dtype not in DTYPES:
            raise ParameterError(f"mergekit dtype {dtype!r} is not one of {', '.join(DTYPES)}.")
        name = d.get("name")
        recipe = cls(method, str(base), models, params, dtype, name=None if name is None else str(name))
        recipe.validated_params()  # an imported recipe is a valid forgetlab recipe, or a message now
        return recipe

    def to_mergekit(self) -> dict:
        """The equivalent mergekit YAML dict (refused for methods or settings mergekit does not have)."""
        if self.method not in MERGEKIT_METHODS:
            raise ParameterError(f"{self.method} has no mergekit counterpart; exportable methods: "
                                 f"{', '.join(MERGEKIT_METHODS)}.")
        p = self.validated_params()
        names = [m.model for m in self.models]
        twice = sorted({m for m in names if names.count(m) > 1})
        if twice:
            raise ParameterError(f"The recipe lists {', '.join(twice)} twice; mergekit refuses duplicate inputs. "
                                 "List each model once (with the sum of its weights for linear, task_arithmetic "
                                 "and ties) before exporting.")
        weights = p.get("weights") or [1.0] * len(self.models)
        models = []
        for m, w in zip(self.models, weights):
            mp: dict[str, Any] = {"weight": float(w)}
            if self.method in ("ties", "breadcrumbs"):
                mp["density"] = float(p["keep"])
            if self.method in ("dare_linear", "dare_ties"):
                mp["density"] = _complement(p["drop"])
            if self.method == "breadcrumbs":
                mp["gamma"] = float(p["gamma"])
            models.append({"model": _mergekit_ref(self.base, m.model), "parameters": mp})
        out: dict[str, Any] = {"merge_method": self.method}
        if self.method == "linear":
            out["parameters"] = {"normalize": bool(p["normalize"])}
        else:
            if self.method == "ties" and p["scope"] != "tensor":
                raise ParameterError("mergekit's TIES trims per tensor only; export a recipe with scope: tensor.")
            out["base_model"] = self.base
            # forgetlab's ties and dare_ties take the disjoint mean (mergekit's normalize: true); the others add
            out["parameters"] = {"lambda": float(p["lam"]), "normalize": self.method in ("ties", "dare_ties")}
            if self.method in ("dare_linear", "dare_ties"):
                out["parameters"]["rescale"] = True
        out["models"] = models
        out["dtype"] = self.dtype or "float32"
        return out


# mergekit 0.1.5's settings: the top-level keys of MergeConfiguration that forgetlab reads (`slices`, `modules`,
# `tokenizer`, `chat_template` and a tokenizer_source other than `base` are refused with their own messages), and
# each method's parameters (merge_methods/registry.py, generalized_task_arithmetic.py, linear.py): shared ones
# (one value for the merge) and per-model ones (per entry, or top-level for every model)
MERGEKIT_KEYS = ("merge_method", "base_model", "models", "parameters", "dtype", "out_dtype", "tokenizer_source", "name")
_GTA_SHARED = ("lambda", "normalize", "rescale", "int8_mask")
MERGEKIT_PARAMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # method: (shared, per model)
    "linear": (("normalize",), ("weight",)),
    "task_arithmetic": (_GTA_SHARED, ("weight", "density")),
    "ties": (_GTA_SHARED, ("weight", "density")),
    "dare_linear": (_GTA_SHARED, ("weight", "density")),
    "dare_ties": (_GTA_SHARED, ("weight", "density")),
    "breadcrumbs": (_GTA_SHARED, ("weight", "density", "gamma")),
}


def _check_mergekit_keys(d: Mapping[str, Any]) -> None:
    """Refuse, by name and with what to do, the top-level mergekit settings forgetlab cannot honour."""
    if "slices" in d:
        raise ParameterError("mergekit `slices` (layer ranges) are not supported; use `models:`.")
    if "modules" in d:
        raise ParameterError("mergekit `modules` (a separate merge per module of a multimodal model) is not "
                             "supported: forgetlab merges the whole model. Use `models:` with one merge for all "
                             "tensors.")
    if d.get("tokenizer") is not None:
        raise ParameterError("mergekit `tokenizer:` (a merged vocabulary, token embeddings set by hand) is not "
                             "supported: forgetlab writes the base's tokenizer and merges the embedding rows as "
                             "they are, so the models must share the base's vocabulary. Remove `tokenizer:`.")
    source = d.get("tokenizer_source")
    if source is not None and source != "base":
        raise ParameterError(f"mergekit tokenizer_source: {source} builds a new vocabulary and reorders the "
                             f"embedding rows; forgetlab writes the base's tokenizer and merges the rows as they "
                             f"are (mergekit's tokenizer_source: base when the models share the base's "
                             f"vocabulary). Write tokenizer_source: base, or remove it.")
    if d.get("chat_template") is not None:
        raise ParameterError("mergekit chat_template is not supported: forgetlab writes the base's tokenizer with "
                             "its own chat template. Remove chat_template, and set the template on the merged "
                             "model's tokenizer afterwards (tokenizer.chat_template = …; "
                             "tokenizer.save_pretrained(OUT)).")
    unknown = [k for k in d if k not in MERGEKIT_KEYS]
    if unknown:
        raise ParameterError(f"Unknown mergekit setting(s) {', '.join(map(repr, unknown))}; forgetlab reads "
                             f"{', '.join(MERGEKIT_KEYS)}. Fix the name or remove it.")


def _check_mergekit_params(method: str, params: Mapping[str, Any], model: str | None) -> None:
    """Refuse parameters that mergekit's `method` does not have (mergekit ignores them: usually a misspelling)
    and, per model (`model` given), the shared ones that mergekit reads only at the top level."""
    shared, per_model = MERGEKIT_PARAMS[method]
    for k in params:
        if model is not None and k in shared:
            raise ParameterError(f"mergekit parameter {k} is one value for the whole merge; mergekit ignores it in "
                                 f"the parameters of {model}. Give it in the top-level `parameters`.")
        if k not in shared + per_model:
            raise ParameterError(f"{k!r} is not a parameter of mergekit's {method} (its parameters: "
                                 f"{', '.join(shared + per_model)}); mergekit would ignore it. Fix the name or "
                                 "remove it.")


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


def _complement(x: float) -> float:
    """1 − x to 15 significant digits: DARE's drop ↔ mergekit's density, so that 0.2 ↔ 0.8 ↔ 0.2 exactly
    (1 − 0.8 is 0.19999999999999996 in floating point)."""
    return float(f"{1.0 - float(x):.15g}")


def _mergekit_ref(base: str, model: str) -> str:
    """How mergekit names a model: a PEFT adapter folder as `base+adapter` (mergekit's LoRA syntax), any other
    model as its path."""
    if (Path(str(model)).expanduser() / "adapter_config.json").is_file():
        return f"{base}+{model}"
    return str(model)


def is_mergekit(d: Mapping[str, Any]) -> bool:
    """A YAML dict is a mergekit recipe when it has `merge_method` (ours has `method`)."""
    return isinstance(d, Mapping) and "merge_method" in d


def load_recipe(source: str | Path | Mapping[str, Any] | Recipe) -> Recipe:
    """A Recipe from a Recipe, a dict, a YAML string or a recipe file; the format (ours or mergekit's) is detected
    from the keys. A one-line string is a file path: a path that exists is read as a file whatever its name
    (`recipe.yaml`, `recipe.txt`, `recipe`); a folder, a file that is not UTF-8 text, or a missing file is a
    message naming it."""
    if isinstance(source, Recipe):
        return source
    if isinstance(source, Mapping):
        return _from_any(source)
    text = str(source)
    if isinstance(source, Path) or "\n" not in text:
        path = Path(text).expanduser()
        if path.is_dir():
            inside = path / "recipe.yaml"
            hint = (f"this folder holds {inside} (a merge writes its recipe there): give that file" if inside.is_file()
                    else "give the recipe's YAML file, not a folder")
            raise ParameterError(f"The recipe {path} is a folder; {hint}.")
        if path.exists():
            d = load_file(path, "recipe")
            if not isinstance(d, Mapping):
                raise ParameterError(f"The recipe {path} must be a YAML mapping (forgetlab's method/base/models/params "
                                     f"or mergekit's merge_method/base_model/models); it holds "
                                     f"{'nothing' if d is None else 'a ' + type(d).__name__}.")
            return resolve_paths(_from_any(d), path.resolve().parent, f"the recipe {path}")
        try:
            d = safe_load(text, "The recipe")
        except YamlError:
            if text.lstrip().startswith("{"):  # a one-line YAML mapping with a mistake in it
                raise
            d = None
        if not isinstance(d, Mapping):  # a file name, not YAML text
            raise ParameterError(f"Recipe file {path} does not exist. Check the path (relative paths start in the "
                                 f"current folder, {Path.cwd()}).")
        return _from_any(d)
    return _from_any(safe_load(text, "The recipe"))


def _from_any(d: Any) -> Recipe:
    """Our recipe dict or mergekit's (detected by `merge_method`)."""
    return Recipe.from_mergekit(d) if is_mergekit(d) else Recipe.from_dict(d)


def resolve_paths(recipe: Recipe, folder: Path, where: str) -> Recipe:
    """Make the recipe's relative model paths relative to `folder` (the recipe file's folder, as a pool file's
    paths are relative to the pool file); hub ids stay as they are; a path that exists nowhere is refused with
    the folder it was resolved against. `base+adapter` references are resolved part by part."""
    from forgetlab.core.checkpoints import looks_like_hub_id

    def one(ref: str) -> str:
        p = Path(ref).expanduser()
        if p.is_absolute():
            return str(p)
        cand = folder / p
        if cand.exists():
            return str(cand)
        if looks_like_hub_id(ref):
            return ref
        raise ParameterError(f"{ref!r} in {where} does not exist (relative paths are resolved against the "
                             f"recipe's folder, {folder}). Fix the path or give an absolute one.")

    def ref(value: str) -> str:
        model, sep, adapter = str(value).rpartition("+")
        if sep and model and adapter and not (folder / str(value)).exists():
            return f"{one(model)}+{one(adapter)}"
        return one(str(value))

    recipe.base = ref(recipe.base)
    for m in recipe.models:
        m.model = ref(m.model)
    if recipe.pool:
        recipe.pool = one(str(recipe.pool))
    return recipe


def mergekit_yaml(recipe: Recipe) -> str:
    """mergekit YAML text for a recipe (see Recipe.to_mergekit)."""
    return yaml.safe_dump(recipe.to_mergekit(), sort_keys=False)
