"""Plotly figures from results: results in, `go.Figure` out. One module per area; shared colours here.

The same model or task gets the same colour on every chart: `color_for(name)` derives it from the name, so
it does not depend on the order in which a page happens to list things.
"""
from __future__ import annotations

import hashlib

import plotly.express as px

PALETTE = px.colors.qualitative.Safe + px.colors.qualitative.Vivid
_FIXED = {"base": "#4d4d4d", "general": "#4d4d4d", "generality": "#4d4d4d"}


def color_for(name: str) -> str:
    """A stable colour for a model, task or method name (same name, same colour, in every chart)."""
    if name in _FIXED:
        return _FIXED[name]
    digest = int(hashlib.sha1(name.encode("utf-8")).hexdigest(), 16)
    return PALETTE[digest % len(PALETTE)]


def color_map(names) -> dict[str, str]:
    """`{name: color_for(name)}` for plotly's `color_discrete_map`."""
    return {n: color_for(n) for n in names}
