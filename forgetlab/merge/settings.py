"""Parameter values that vary by tensor: per-layer gradients and name filters, read exactly as mergekit 0.1.5
reads them (`mergekit.config.evaluate_setting`, `plan.py`).

A parameter's value in a recipe is a plain value, or

- a **gradient** — `{gradient: [v0, v1, …]}` in forgetlab's YAML, a bare list in mergekit's: at position t ∈
  [0, 1] numbers are interpolated linearly, i = ⌊t·(n − 1)⌋, f = t·(n − 1) − i, v = (1 − f)·v_i + f·v_{i+1}
  (booleans and strings take v_⌊t·(n − 1)⌋); any length n ≥ 1 is meaningful (one value: constant);
- a **filter list** — `[{filter: self_attn, value: 0.5}, {value: 1.0}]`: the first entry whose `filter` is a
  substring of the tensor's name (or is absent or `*`) gives the value (the name in the checkpoint, or the one
  transformers ≥ 5 gives it on loading, which is what mergekit 0.1.5 matches: Mixtral's `block_sparse_moe.gate`
  loads as `mlp.gate`), which may itself be a gradient; a list
  that matches nothing leaves the parameter unset (the method's default).

t is the position of the tensor's layer in its stack: decoder layer i of L gets t = i/(L − 1) (t = 1 when
L = 1); tensors outside the layers (embeddings, final norm, lm_head) get t = 0, as mergekit plans them.
With `slices`, L and i count the layers of the tensor's slice.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from forgetlab.core.errors import ParameterError

SCALARS = (bool, int, float, str)


def is_gradient(value: Any) -> bool:
    """forgetlab's gradient: a mapping {gradient: [...]}."""
    return isinstance(value, Mapping) and set(value) == {"gradient"}


def is_filter_list(value: Any) -> bool:
    """A filter list: a non-empty list of mappings, each with `value` (and optionally `filter`)."""
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, Mapping) for v in value)


def is_setting(value: Any) -> bool:
    """Whether a parameter value varies by tensor (a gradient or a filter list)."""
    return is_gradient(value) or is_filter_list(value)


def check(value: Any, where: str) -> Any:
    """A setting checked for its shape (gradients non-empty lists of scalars, filter entries with `value` and a
    string `filter`); returns it with tuples as lists. Refuses with what to write instead, and refuses an empty
    value (YAML null: `alpha:` with nothing after it), which would otherwise silently become the default."""
    if value is None:
        raise ParameterError(f"{where} has no value (YAML null: the key is followed by nothing, `~` or `null`); "
                             "write the value after the colon (e.g. `alpha: 0.5`), or remove the key to use the "
                             "method's default.")
    if is_gradient(value):
        grad = value["gradient"]
        if not isinstance(grad, (list, tuple)) or not grad or not all(isinstance(v, SCALARS) for v in grad):
            raise ParameterError(f"{where}: a gradient is a non-empty list of numbers interpolated over the layers, "
                                 f"e.g. {{gradient: [0.2, 0.8]}}; got {grad!r}.")
        return {"gradient": list(grad)}
    if isinstance(value, Mapping):
        raise ParameterError(f"{where}: {dict(value)!r} is not a parameter value; give a number, "
                             f"{{gradient: [0.2, 0.8]}}, or a filter list [{{filter: self_attn, value: 0.5}}, "
                             f"{{value: 1.0}}].")
    if is_filter_list(value):
        out = []
        for entry in value:
            extra = [k for k in entry if k not in ("filter", "value")]
            if extra or "value" not in entry:
                raise ParameterError(f"{where}: each filter entry is {{filter: NAME-PART, value: V}} (the last one "
                                     f"may leave out filter); got {dict(entry)!r}.")
            if entry.get("filter") is not None and not isinstance(entry["filter"], str):
                raise ParameterError(f"{where}: a filter is a part of tensor names such as self_attn or mlp; got "
                                     f"{entry['filter']!r}.")
            inner = entry["value"]
            if inner is None:
                check(inner, f"{where} (the `value` of its filter entry {dict(entry)!r})")
            if isinstance(inner, (list, tuple)) and not is_filter_list(inner):
                inner = {"gradient": list(inner)}  # mergekit's bare-list gradient inside a filter entry
            if not isinstance(inner, SCALARS):
                inner = check(inner, where)
                if is_filter_list(inner):
                    raise ParameterError(f"{where}: a filter entry's value is a number or a gradient, not another "
                                         "filter list.")
            out.append({**({"filter": entry["filter"]} if entry.get("filter") is not None else {}), "value": inner})
        return out
    return value


def evaluate(value: Any, tensor_name: str | tuple[str, ...], t: float) -> Any:
    """The plain value of a (checked) setting for one tensor at layer position t (None: a filter list matched
    nothing). Plain values are returned as they are. `tensor_name` may be several names of one tensor (its
    checkpoint's and its loaded model's: `forgetlab.merge.layers.filter_names`); a filter matches when it is a
    substring of any of them."""
    if is_gradient(value):
        values = value["gradient"]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if not numeric:
            return values[int(t * (len(values) - 1))]
        scaled = t * (len(values) - 1)
        i0 = int(scaled)
        i1 = min(len(values) - 1, i0 + 1)
        frac = scaled - i0
        return (1 - frac) * float(values[i0]) + frac * float(values[i1])
    if is_filter_list(value):
        for entry in value:
            flt = entry.get("filter")
            names = (tensor_name,) if isinstance(tensor_name, str) or tensor_name is None else tensor_name
            if flt is None or flt == "*" or any(n and flt in n for n in names):
                return evaluate(entry["value"], tensor_name, t)
        return None
    return value


def leaves(value: Any) -> list:
    """Every plain value a setting can give (for checking them all against the method's parameter)."""
    if is_gradient(value):
        return list(value["gradient"])
    if is_filter_list(value):
        return [x for entry in value for x in leaves(entry["value"])]
    return [value]


def map_values(value: Any, fn: Callable[[Any], Any]) -> Any:
    """The setting with `fn` applied to every plain value (e.g. density → drop = 1 − density)."""
    if is_gradient(value):
        return {"gradient": [fn(v) for v in value["gradient"]]}
    if is_filter_list(value):
        return [{**{k: v for k, v in e.items() if k != "value"}, "value": map_values(e["value"], fn)} for e in value]
    return fn(value)


def has_catch_all(value: Any) -> bool:
    """Whether a filter list ends in an entry that matches every tensor (so it never leaves the value unset)."""
    return not is_filter_list(value) or any(e.get("filter") in (None, "*") for e in value)


def layer_t(position: Any, n_layers: int) -> float:
    """mergekit's t of a tensor: i/(L − 1) for decoder layer i of L (1 when L = 1), 0 outside the layers."""
    if not isinstance(position, int) or isinstance(position, bool):
        return 0.0
    return position / (n_layers - 1) if n_layers > 1 else 1.0


def to_mergekit(value: Any) -> Any:
    """A setting in mergekit's syntax (a gradient as a bare list)."""
    if is_gradient(value):
        return list(value["gradient"])
    if is_filter_list(value):
        return [{**{k: v for k, v in e.items() if k != "value"}, "value": to_mergekit(e["value"])} for e in value]
    return value


def from_mergekit(value: Any, where: str) -> Any:
    """A mergekit parameter value (scalar, bare-list gradient, or filter list) as forgetlab's setting. A null is
    refused, as mergekit refuses it (its ParameterSetting has no None)."""
    if value is None:
        check(value, where)
    if isinstance(value, (list, tuple)):
        if not value:
            raise ParameterError(f"{where}: an empty list gives no value (mergekit then stops or takes the "
                                 "default); give a number or a non-empty gradient like [0.2, 0.8].")
        if is_filter_list(value):
            return check(list(value), where)
        if any(isinstance(v, Mapping) for v in value):
            raise ParameterError(f"{where}: a list mixes filter entries and plain values; use either a gradient "
                                 "[0.2, 0.8] or a filter list [{filter: self_attn, value: 0.5}, {value: 1.0}].")
        return check({"gradient": list(value)}, where)
    if isinstance(value, Mapping):
        if "value" in value:  # a single ConditionalParameter
            return check([dict(value)], where)
        raise ParameterError(f"{where}: {dict(value)!r} is not a mergekit parameter value; give a number, a "
                             "gradient [0.2, 0.8] or a filter list.")
    return value
