"""mergekit 0.1.5's parameters as forgetlab reads them: which forgetlab method a mergekit name is (`mergekit=<name>`
in the registry), each method's parameter table (`MkParam`: name, default, conversion; the sparsity knobs of the six
older methods, `DIALECT`), and mergekit's top-level keys (docs/merging.md). Used by the import
(`forgetlab.merge.mergekit_yaml`) and the export (`forgetlab.merge.mergekit_export`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from forgetlab.core.errors import ParameterError
from forgetlab.merge import settings
from forgetlab.merge.registry import METHODS, MethodSpec, get_method


MERGEKIT_KEYS = ("merge_method", "base_model", "models", "slices", "parameters", "dtype", "out_dtype",
                 "tokenizer_source", "tokenizer", "name")
# mergekit's InputContract base policy per method (merge_methods/*.py); the others require a base
BASE_IGNORED = ("linear", "karcher", "passthrough")   # base_model is one more input (averaged in) if given
BASE_OPTIONAL = ("nuslerp", "multislerp")
# mergekit methods whose `int8_mask` only sets the dtype of a sign mask (no effect on the result)
INT8_MASK = ("task_arithmetic", "ties", "dare_ties", "dare_linear", "breadcrumbs", "breadcrumbs_ties", "della",
             "della_linear", "sce")
REQUIRED = object()
# parameters mergekit 0.1.5 requires (no default in its method signature): it stops with 'Missing required
# parameter'; forgetlab's own defaults (docs/methods.md) apply only to forgetlab recipes
MERGEKIT_REQUIRED = {"slerp": ("t",), "nearswap": ("t",), "nuslerp": ("weight",), "multislerp": ("weight",),
                     "della": ("weight",), "della_linear": ("weight",), "breadcrumbs_ties": ("weight",)}
# forgetlab parameters that mergekit expresses otherwise: use_base is whether base_model is given
NOT_MERGEKIT = ("seed", "use_base")


def _complement(x: float) -> float:
    """1 − x to 15 significant digits: DARE's drop ↔ mergekit's density, so that 0.2 ↔ 0.8 ↔ 0.2 exactly."""
    return float(f"{1.0 - float(x):.15g}")


def _rescale_to_fl(v: Any) -> Any:
    return ("l1" if v else "none") if isinstance(v, bool) else v


def _rescale_to_mk(v: Any) -> Any:
    if v == "inverse":
        raise ParameterError("mergekit has no 1/(1 − p) rescale (forgetlab's rescale: inverse, the DARE paper's "
                             "rule); export with rescale: l1 (mergekit's rescale: true) or none.")
    return v == "l1" if isinstance(v, str) else bool(v)


@dataclass(frozen=True)
class MkParam:
    """One mergekit parameter of a method: its forgetlab parameter (None: accepted, no effect), whether mergekit
    takes it per model and whether forgetlab does, value converters and mergekit's default. `collapse`: per-model
    values that agree are imported as one value (the sparsity knobs of the older methods, so that their recipes
    read as before); `ignored`: mergekit reads the parameter and ignores it — why, for the notice an imported
    recipe carries (`Recipe.notes`)."""

    mk: str
    fl: str | None
    mk_per_model: bool
    fl_per_model: bool
    default: Any = REQUIRED
    to_fl: Callable[[Any], Any] = lambda v: v
    to_mk: Callable[[Any], Any] = lambda v: v
    collapse: bool = False
    ignored: str | None = None


_GTA_DEFAULTS = {  # (normalize, rescale) defaults of mergekit's generalized task arithmetic methods
    "task_arithmetic": (False, False), "ties": (True, False), "dare_ties": (False, True),
    "dare_linear": (False, True), "breadcrumbs": (False, False)}


def _dialect(name: str) -> dict[str, MkParam] | None:
    """The parameters of forgetlab's six methods that predate the others (their own names for density)."""
    if name == "linear":
        return {"weight": MkParam("weight", "weights", True, True, 1.0),
                "normalize": MkParam("normalize", "normalize", False, False, True)}
    if name == "passthrough":  # mergekit's per-input scale; forgetlab's passthrough has one input
        return {"scale": MkParam("scale", "scale", True, False, 1.0)}
    if name not in _GTA_DEFAULTS:
        return None
    norm, resc = _GTA_DEFAULTS[name]
    out = {"weight": MkParam("weight", "weights", True, True, 1.0),
           "lambda": MkParam("lambda", "lam", False, False, 1.0),
           "normalize": MkParam("normalize", "normalize", False, False, norm),
           "int8_mask": MkParam("int8_mask", None, False, False, False)}
    if name == "task_arithmetic":  # mergekit's task_arithmetic has no sparsification: density and rescale are read
        no_sparsify = "it does not sparsify the task vectors"  # and left unused
        out["rescale"] = MkParam("rescale", None, False, False, False, ignored=no_sparsify)
        out["density"] = MkParam("density", None, True, False, 1.0, ignored=no_sparsify)
    elif name in ("ties", "breadcrumbs"):
        out["rescale"] = MkParam("rescale", "rescale", False, False, resc)
        out["density"] = MkParam("density", "keep", True, True, 1.0, collapse=True)
    else:
        out["rescale"] = MkParam("rescale", "rescale", False, False, resc, _rescale_to_fl, _rescale_to_mk)
        out["density"] = MkParam("density", "drop", True, True, 1.0,
                                 lambda v: settings.map_values(v, _complement),
                                 lambda v: settings.map_values(v, _complement), collapse=True)
    if name == "breadcrumbs":
        out["gamma"] = MkParam("gamma", "gamma", True, True, 0.01, collapse=True)
    return out


# parameters that published configs give a mergekit method which that method does not read (mergekit ignores every
# parameter its method does not declare): accepted, with a notice that they change nothing
MERGEKIT_IGNORED = {
    "sce": (MkParam("weight", None, True, False, 1.0,
                    ignored="SCE weighs each model by the mean square of its selected task vector"),),
}


def mergekit_params(spec: MethodSpec) -> dict[str, MkParam]:
    """mergekit's parameters of a registered method, by mergekit name (see the module docstring)."""
    known = _dialect(spec.name)
    if known is not None:
        return known
    out = {}
    required = MERGEKIT_REQUIRED.get(spec.name, ())
    for p in spec.params:
        if p.name in NOT_MERGEKIT:
            continue
        rescale = p.type == "str" and p.choices is not None and {"l1", "none"} <= set(p.choices)
        conv = dict(to_fl=_rescale_to_fl, to_mk=_rescale_to_mk) if rescale else {}
        key = (p.model_key or p.name) if p.per_model else ("lambda" if p.name == "lam" else p.name)
        default = REQUIRED if key in required else p.default
        out[key] = MkParam(key, p.name, p.per_model, p.per_model, default, **conv)
    if spec.name in INT8_MASK and "int8_mask" not in out:
        out["int8_mask"] = MkParam("int8_mask", None, False, False, False)
    for p in MERGEKIT_IGNORED.get(spec.name, ()):
        out.setdefault(p.mk, p)
    return out


def mergekit_methods() -> tuple[str, ...]:
    """The registered methods that are mergekit methods of the same name (importable and exportable)."""
    return tuple(n for n, s in METHODS.items() if s.mergekit == n)


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
