"""Widgets drawn from settings declarations (forgetlab.core.settings.setting): the label, default, bounds,
choices and tooltip of a page's widget come from the one place the CLI reads them too.

    samples = field_widget(LinearitySettings, "samples", key="linearity_samples", high=n_probe)
    alphas = field_widget(LinearitySettings, "alphas", key="linearity_alphas")        # "0, 0.1, …" → floats

A page passes what only it knows (bounds from the pool, the options a pool offers, a default that depends on
the pool); a comma-separated number list (a sequence of number tuples: one per line) that cannot be read is shown
as an error and gives None, and so does an optional list left empty (without an error: None is its "not given").
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import streamlit as st

from forgetlab.core.errors import ForgetlabError, parse_floats
from forgetlab.core.settings import FieldInfo, checked_value, settings_fields


def field_info(settings_cls: type, name: str) -> FieldInfo:
    """The declaration of field `name` of a settings class."""
    for info in settings_fields(settings_cls):
        if info.name == name:
            return info
    raise KeyError(f"{settings_cls.__name__} declares no setting {name!r}")


def follow_defaults(defaults: Mapping[str, Any], memo: str) -> None:
    """Let the widgets under these keys show their new default when it changes (another task, mode or pool gives
    another default): a widget keeps its value across reruns, even when the default passed to it changes, so the
    keys whose default differs from the one remembered under `memo` are reset before the widgets are drawn."""
    before = st.session_state.get(memo) or {}
    for key, value in defaults.items():
        if key in before and before[key] != value:
            st.session_state.pop(key, None)
    st.session_state[memo] = dict(defaults)


def _csv(values: Sequence[Any]) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def field_widget(settings_cls: type, name: str, *, key: str, options: Optional[Sequence[Any]] = None,
                 default: Any = None, high: Optional[float] = None, low: Optional[float] = None,
                 label: Optional[str] = None, help: Optional[str] = None, format_func=None, radio: bool = False,
                 container=None, disabled: bool = False, format: Optional[str] = None) -> Any:
    """The widget of one settings field, returning its value in the field's type (None for an unreadable number
    list, after showing why, or an optional one left empty). `options` override the declared choices (e.g. the
    pool's tasks), `default` the declared default, `low` and `high` the declared bounds (a page's narrower or
    wider range: a learning rate above 0); `label` and `help` add to the declaration's; `radio` draws a word with
    few choices as radio buttons instead of a select box; `disabled` greys it out (a setting that the others make
    irrelevant); `format` is a number's printf format ("%.6f")."""
    info = field_info(settings_cls, name)
    where = container or st
    text = label or info.label
    tip = info.spec.help + (f"  \n{help}" if help else "")
    value = info.default if default is None else default
    choices = list(options) if options is not None else (list(info.spec.choices) if info.spec.choices else None)
    kwargs = {"key": key, "help": tip, "disabled": disabled}
    if format_func is not None:
        kwargs["format_func"] = format_func
    if info.base is bool:
        return where.checkbox(text, value=bool(value), key=key, help=tip, disabled=disabled)
    if choices is not None and info.sequence:
        chosen = [v for v in (value if value is not None else choices) if v in choices]
        return tuple(where.multiselect(text, choices, default=chosen, **kwargs))
    if choices is not None:
        index = choices.index(value) if value in choices else 0
        return (where.radio if radio else where.selectbox)(text, choices, index=index, **kwargs)
    if info.nested:             # number tuples: one per line
        raw = where.text_area(text, "\n".join(_csv(t) for t in value or ()), key=key, help=tip, height=160)
        try:
            return checked_value(info, [parse_floats(line, f"the {text}") for line in raw.splitlines()
                                        if line.strip()])
        except ForgetlabError as exc:
            where.error(str(exc))
            return None
    if info.sequence and info.base in (int, float):
        raw = where.text_input(text, _csv(value or ()), key=key, help=tip, disabled=disabled)
        if info.optional and not raw.strip():
            return None
        try:
            return checked_value(info, parse_floats(raw, f"the {text}"))
        except ForgetlabError as exc:
            where.error(str(exc))
            return None
    if info.base in (int, float):
        lo, hi = info.spec.range or (None, None)
        lo = low if low is not None else lo
        hi = high if high is not None else hi
        cast = int if info.base is int else float
        start = value if value is not None else (lo if lo is not None else 0)
        if hi is not None:
            start = min(start, hi)
        extra = {"format": format} if format is not None else {}
        return cast(where.number_input(text, min_value=cast(lo) if lo is not None else None,
                                       max_value=cast(hi) if hi is not None else None, value=cast(start),
                                       key=key, help=tip, disabled=disabled, **extra))
    return where.text_input(text, "" if value is None else str(value), key=key, help=tip,
                            disabled=disabled) or None
