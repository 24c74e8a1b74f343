"""mergekit 0.1.5's parameters as forgetlab reads them. What mergekit calls each method and its parameters is
declared with the method (`MethodSpec.mergekit`, a `forgetlab.merge.registry.MergekitSpec`); here: the tables read
from those declarations (`mergekit_params`: `MkParam` by mergekit name), the methods a mergekit name imports, the
value converters and the parameter table the older methods share (`gta_params`, the dialect of their sparsity
knobs), and mergekit's top-level keys (docs/merging.md). Used by the import (`forgetlab.merge.mergekit_yaml`) and
the export (`forgetlab.merge.mergekit_export`)."""
from __future__ import annotations

from typing import Any

from forgetlab.core.errors import ParameterError
from forgetlab.merge import settings
from forgetlab.merge.registry import METHODS, REQUIRED, MergekitSpec, MethodSpec, MkParam, get_method


MERGEKIT_KEYS = ("merge_method", "base_model", "models", "slices", "parameters", "dtype", "out_dtype",
                 "tokenizer_source", "tokenizer", "name")
# forgetlab parameters that mergekit expresses otherwise: use_base is whether base_model is given
NOT_MERGEKIT = ("seed", "use_base")


def complement(x: float) -> float:
    """1 − x to 15 significant digits: DARE's drop ↔ mergekit's density, so that 0.2 ↔ 0.8 ↔ 0.2 exactly."""
    return float(f"{1.0 - float(x):.15g}")


def complements(value: Any) -> Any:
    """`complement` of a value or of every value of a setting (a gradient, a filter list: forgetlab.merge.settings)."""
    return settings.map_values(value, complement)


def rescale_to_forgetlab(v: Any) -> Any:
    """mergekit's rescale (true / false) as forgetlab's (l1 / none); forgetlab's own values pass."""
    return ("l1" if v else "none") if isinstance(v, bool) else v


def rescale_to_mergekit(v: Any) -> Any:
    """forgetlab's rescale (l1 / none) as mergekit's (true / false); `inverse` has no mergekit counterpart."""
    if v == "inverse":
        raise ParameterError("mergekit has no 1/(1 − p) rescale (forgetlab's rescale: inverse, the DARE paper's "
                             "rule); export with rescale: l1 (mergekit's rescale: true) or none.")
    return v == "l1" if isinstance(v, str) else bool(v)


def gta_params(normalize: bool, rescale: bool, density: str | None, *, gamma: bool = False) -> dict[str, MkParam]:
    """The parameter table of a generalized task arithmetic method of mergekit (task_arithmetic, ties, breadcrumbs,
    dare_*) as forgetlab's methods of the same name read it; they predate the others and keep their own names for
    the sparsity knob. `normalize`, `rescale`: mergekit's defaults for the method; `density`: the forgetlab parameter
    mergekit's per-model density is — "keep" (the share kept), "drop" (1 − density, DARE's drop; rescale then reads
    true/false as l1/none) or None (task_arithmetic: density and rescale are read and left unused); `gamma`:
    breadcrumbs' per-model γ. Per-model values that agree are imported as one (`MkParam.collapse`)."""
    out = {"weight": MkParam("weight", "weights", True, True, 1.0),
           "lambda": MkParam("lambda", "lam", False, False, 1.0),
           "normalize": MkParam("normalize", "normalize", False, False, normalize),
           "int8_mask": MkParam("int8_mask", None, False, False, False)}
    if density is None:   # mergekit's task_arithmetic has no sparsification: density and rescale are read, unused
        no_sparsify = "it does not sparsify the task vectors"
        out["rescale"] = MkParam("rescale", None, False, False, rescale, ignored=no_sparsify)
        out["density"] = MkParam("density", None, True, False, 1.0, ignored=no_sparsify)
    elif density == "keep":
        out["rescale"] = MkParam("rescale", "rescale", False, False, rescale)
        out["density"] = MkParam("density", "keep", True, True, 1.0, collapse=True)
    elif density == "drop":
        out["rescale"] = MkParam("rescale", "rescale", False, False, rescale, rescale_to_forgetlab,
                                 rescale_to_mergekit)
        out["density"] = MkParam("density", "drop", True, True, 1.0, complements, complements, collapse=True)
    else:
        raise ParameterError(f"internal: density is keep, drop or None; got {density!r}.")
    if gamma:
        out["gamma"] = MkParam("gamma", "gamma", True, True, 0.01, collapse=True)
    return out


def mergekit_params(spec: MethodSpec) -> dict[str, MkParam]:
    """mergekit's parameters of a registered method, by mergekit name: its declared table, or the table made from
    its parameters (`MergekitSpec`)."""
    mk = spec.mergekit or MergekitSpec(spec.name)
    if mk.params is not None:
        return dict(mk.params)
    out = {}
    for p in spec.params:
        if p.name in NOT_MERGEKIT:
            continue
        rescale = p.type == "str" and p.choices is not None and {"l1", "none"} <= set(p.choices)
        conv = dict(to_fl=rescale_to_forgetlab, to_mk=rescale_to_mergekit) if rescale else {}
        key = (p.model_key or p.name) if p.per_model else ("lambda" if p.name == "lam" else p.name)
        default = REQUIRED if key in mk.required else p.default
        out[key] = MkParam(key, p.name, p.per_model, p.per_model, default, **conv)
    if mk.int8_mask and "int8_mask" not in out:
        out["int8_mask"] = MkParam("int8_mask", None, False, False, False)
    for p in mk.ignored:
        out.setdefault(p.mk, p)
    return out


def base_policy(method: str) -> str:
    """mergekit's base_model policy of a method (`MergekitSpec.base`): "required", "ignored" (base_model is one more
    input if given) or "optional" (without it the models themselves are interpolated); "required" for a method
    mergekit does not have."""
    mk = get_method(method).mergekit
    return "required" if mk is None else mk.base


def mergekit_methods() -> tuple[str, ...]:
    """The registered methods that are mergekit methods of the same name (importable and exportable)."""
    return tuple(n for n, s in METHODS.items() if s.mergekit is not None and s.mergekit.name == n)


def mergekit_method_spec(name: Any) -> MethodSpec:
    """The forgetlab method that computes mergekit's `name`; ParameterError listing the importable ones."""
    if not isinstance(name, str) or name not in mergekit_methods():
        raise ParameterError(f"mergekit method {name!r} has no forgetlab counterpart; importable methods: "
                             f"{', '.join(mergekit_methods())}.")
    return get_method(name)


# -- import


def mergekit_model_key(spec: MethodSpec, fl_name: str) -> str:
    """The key a per-model parameter `fl_name` of `spec` has under a model entry (e.g. `weight` for `weights`)."""
    for p in spec.params:
        if p.name == fl_name:
            return p.model_key or p.name
    return fl_name
