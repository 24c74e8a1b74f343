"""The Merge page's form: a widget per merge-method parameter, and setting those widgets from a recipe."""
from __future__ import annotations

import streamlit as st

from forgetlab.core.errors import parse_floats
from forgetlab.merge import METHODS


def preset_form(method: str, models: list[str], params: dict) -> None:
    """Set the form's widgets to a merge (`recipe_form`'s method, pool models, parameters); call it before they
    are drawn (at the top of the script, or in a button's callback)."""
    st.session_state.update({"merge_models": list(models), "merge_method": method})
    for p in METHODS[method].params:
        if p.name not in params:
            continue
        key, value = f"merge_{method}_{p.name}", params[p.name]
        if p.per_model:
            values = value if isinstance(value, (list, tuple)) else [value] * len(models)
            st.session_state.update({f"{key}_{m}": float(v) for m, v in zip(models, values)})
        elif p.type == "floats":       # a text input of comma-separated numbers
            st.session_state[key] = ", ".join(f"{v:g}" for v in value)
        else:
            st.session_state[key] = int(value) if p.type == "int" else float(value) if p.type == "float" else value


def param_widget(method: str, p, models: list[str]):
    """The widget of merge parameter `p` of `method` (one number per model for per-model parameters); its value."""
    key = f"merge_{method}_{p.name}"
    lo, hi = (p.range if p.range else (None, None))
    if p.per_model:
        # three per row: one column per model squeezed the labels to a letter per line with six models
        cols = [c for _ in range(0, max(1, len(models)), 3) for c in st.columns(3)]
        return [col.number_input(f"{p.name} · {m}", lo, hi, float(p.default), 0.05, key=f"{key}_{m}", help=p.help)
                for col, m in zip(cols, models)]
    if p.type == "float":
        small = 0 < abs(float(p.default)) < 1e-3  # e.g. nearswap's t, karcher's tol: %.4f would show 0.0000
        return st.number_input(p.name, lo, hi, float(p.default), float(p.default) if small else 0.01, key=key,
                               help=p.help, format="%g" if small else "%.4f")
    if p.type == "int":
        return int(st.number_input(p.name, int(lo) if lo is not None else None,
                                   int(min(hi, 2**31 - 1)) if hi is not None else None, int(p.default), 1,
                                   key=key, help=p.help))
    if p.type == "bool":
        return st.checkbox(p.name, bool(p.default), key=key, help=p.help)
    if p.type == "str" and not p.choices:
        return st.text_input(p.name, str(p.default), key=key, help=p.help)
    if p.type == "str":
        choices = list(p.choices)
        return st.selectbox(p.name, choices, index=choices.index(p.default), key=key, help=p.help)
    text = st.text_input(p.name, ", ".join(f"{v:g}" for v in p.default), key=key, help=p.help)
    return parse_floats(text, p.name)
