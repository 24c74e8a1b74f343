"""Plotly figures from results: results in, `go.Figure` out. One module per area; shared colours here.

Colours: the same model, task or method name gets the same colour on every chart, and two different names
never share one (so "ft0" and "ft1", or two runs, can always be told apart):

- well-known names have fixed colours: `base` (and the `general` text) grey, the demo zoo's tasks `math`,
  `code` and `translate` (which are also the names of the models fine-tuned on them, alias `ft-<task>`),
  and a lighter shade of the task's colour for `lora-<task>`;
- any other name gets a palette colour when it is first drawn, kept for the life of the process in a
  registry: its preferred slot is derived from a hash of the name (so a name usually keeps its colour
  across restarts), and when that colour is taken the next free one is used. Past the palette, further
  distinct colours are generated. `color_map(names)` registers the names of one chart in sorted order, so
  which name gets which colour does not depend on the order a page lists them in.
"""
from __future__ import annotations

import colorsys
import hashlib
import threading

import plotly.express as px

_GREYS = {"rgb(136, 136, 136)", "rgb(165, 170, 153)"}
PALETTE = [c for c in px.colors.qualitative.Safe + px.colors.qualitative.Vivid if c not in _GREYS]
_TASKS = {"math": "rgb(204, 102, 119)", "code": "rgb(51, 34, 136)", "translate": "rgb(17, 119, 51)"}
_LORA = {"math": "rgb(232, 169, 178)", "code": "rgb(142, 132, 209)", "translate": "rgb(127, 192, 143)"}
FIXED = {"base": "#4d4d4d", "general": "#4d4d4d", "generality": "#4d4d4d", **_TASKS,
         **{f"ft-{t}": c for t, c in _TASKS.items()}, **{f"lora-{t}": c for t, c in _LORA.items()}}

_assigned: dict[str, str] = {}
_lock = threading.Lock()


def _generated(i: int) -> str:
    """The i-th colour past the palette: hues spread by the golden angle, mid saturation and lightness."""
    r, g, b = colorsys.hls_to_rgb((0.11 + i * 0.618034) % 1.0, 0.45, 0.55)
    return f"rgb({round(r * 255)}, {round(g * 255)}, {round(b * 255)})"


def _assign(name: str) -> str:
    """The registry's colour of a name that has no fixed colour (call with the lock held)."""
    if name not in _assigned:
        used = set(FIXED.values()) | set(_assigned.values())
        start = int(hashlib.sha1(name.encode("utf-8")).hexdigest(), 16) % len(PALETTE)
        free = [PALETTE[(start + i) % len(PALETTE)] for i in range(len(PALETTE))]
        color = next((c for c in free if c not in used), None)
        i = 0
        while color is None or color in used:
            color, i = _generated(len(_assigned) + i), i + 1
        _assigned[name] = color
    return _assigned[name]


def color_for(name: str) -> str:
    """The colour of a model, task or method name: the same on every chart, never another name's."""
    if name in FIXED:
        return FIXED[name]
    with _lock:
        return _assign(name)


def color_map(names) -> dict[str, str]:
    """`{name: colour}` for the names of one chart (plotly's `color_discrete_map`): distinct colours for
    distinct names (the `base`/`general` aliases aside), each the name's colour on every other chart."""
    names = [str(n) for n in names]
    with _lock:
        for n in sorted(set(names) - set(FIXED)):
            _assign(n)
    return {n: color_for(n) for n in names}
