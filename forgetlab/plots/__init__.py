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
import json
import math
import threading

import pandas as pd
import plotly.express as px

from forgetlab.core.evaluate import forgetting_text, perplexity_change, perplexity_text  # noqa: F401
from forgetlab.executors import worker_label

_GREYS = {"rgb(136, 136, 136)", "rgb(165, 170, 153)"}
PALETTE = [c for c in px.colors.qualitative.Safe + px.colors.qualitative.Vivid if c not in _GREYS]
_TASKS = {"math": "rgb(204, 102, 119)", "code": "rgb(51, 34, 136)", "translate": "rgb(17, 119, 51)"}
_LORA = {"math": "rgb(232, 169, 178)", "code": "rgb(142, 132, 209)", "translate": "rgb(127, 192, 143)"}
# the methods of the Forgetting and Fine-tune pages: fixed, clearly different hues (Paul Tol's vibrant and
# muted palettes), so that e.g. magnitude/relative or SFA/L2 are never near-identical shades
METHODS = {"wise-ft": "#0077BB", "alpha": "#0077BB", "fapm": "#EE7733", "magnitude": "#33BBEE",
           "relative": "#AA3377", "dare": "#009988", "ties": "#CC3311", "hma": "#DDAA33",
           "adamw": "#0077BB", "mofo": "#EE7733", "sfa": "#009988", "l2": "#AA3377", "l1": "#CC3311",
           "slerp": "#332288", "della": "#117733", "sce": "#999933"}
FIXED = {"base": "#4d4d4d", "general": "#4d4d4d", "generality": "#4d4d4d", **_TASKS,
         **{f"ft-{t}": c for t, c in _TASKS.items()}, **{f"lora-{t}": c for t, c in _LORA.items()}, **METHODS}
_METHOD_PREFIXES = ("mofo-", "sfa-", "l1-", "l2-")

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
    if name.startswith(_METHOD_PREFIXES) and " " not in name:     # "mofo-0.2", "sfa-p0.25", "l2-1"
        return FIXED[name.partition("-")[0]]
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


# -- forgetting as a person reads it: `perplexity_text` ("perplexity +5.0 %" for Δ = +0.049 nats) and
# `forgetting_text` ("+0.049 nats (perplexity +5.0 %)") have their home in forgetlab.core.evaluate, where the
# zoo's claims use them too; the figures import them from there.

PERPLEXITY_COLUMNS = {"forgetting": "perplexity_change", "d_general_loss": "d_perplexity"}
"""Columns holding a Δ of the general loss (nats) → the column of the relative perplexity change beside them."""


def perplexity_columns(frame):
    """`frame` with, right after each Δ-general-loss column (`PERPLEXITY_COLUMNS`), the relative change of
    perplexity it means, exp(Δ) − 1, as a fraction (a copy; frames without such a column come back as they are)."""
    todo = [c for c in PERPLEXITY_COLUMNS if c in frame.columns and PERPLEXITY_COLUMNS[c] not in frame.columns]
    if not todo:
        return frame
    frame = frame.copy()
    for col in todo:
        values = [perplexity_change(float(v)) if v is not None else float("nan") for v in frame[col]]
        frame.insert(list(frame.columns).index(col) + 1, PERPLEXITY_COLUMNS[col], values)
    return frame


# -- names a person would write: table headers and legend entries

_HEADERS = {"general_loss": "general loss ↓", "perplexity": "perplexity ↓", "exact_match": "exact match ↑",
            "answer_loss": "answer loss ↓", "distance": "D(θ, θ0)", "nls_mean": "NLS mean", "nls_std": "NLS std",
            "general_tokens": "general tokens", "pareto": "on the Pareto front", "speciality": "speciality",
            "train_loss": "training loss", "final_loss": "final training loss", "x": "setting",
            "mean_alpha": "mean α", "alpha": "α", "lam": "λ", "d_pca": "distance (PCA space)",
            "d_tsne": "distance (t-SNE plane)", "forgetting": "forgetting (nats) ↓",
            "d_general_loss": "Δ general loss (nats)", "perplexity_change": "perplexity change", "d_perplexity": "Δ perplexity",
            "retention": "own-task gain kept"}


def friendly_header(column: str) -> str:
    """A column name as a person would write it: "general_loss" → "general loss ↓", "math/exact_match" →
    "math exact match ↑", lm-eval columns ("lm-eval:zoo_math/acc") as written, other snake_case → words."""
    column = str(column)
    if column in _HEADERS:
        return _HEADERS[column]
    if column.startswith("lm-eval:"):       # an lm-eval task/metric keeps the name the user types (zoo_math/acc)
        return column
    head, sep, tail = column.rpartition("/")
    if sep and tail in _HEADERS:
        return f"{head} {_HEADERS[tail]}"
    return column.replace("_", " ")


UNITS = {"general_loss": "nats", "answer_loss": "nats", "train_loss": "nats", "final_loss": "nats",
         "forgetting": "nats", "d_general_loss": "nats", "d_answer_loss": "nats", "loss": "nats", "rise": "nats",
         "kl": "nats", "mean_rise": "nats", "mean_kl": "nats", "total_rise": "nats", "loss_base": "nats",
         "loss_model": "nats", "base_general_loss": "nats", "seconds": "s", "peak_gb": "GB"}
"""The unit of a column's values, where it has one (losses are natural-log cross-entropies: nats)."""


def axis_title(column: str) -> str:
    """A column's name as an axis or chart title, with its unit before the direction arrow: "general_loss" →
    "general loss (nats) ↓", "math/answer_loss" → "math answer loss (nats) ↓", "exact_match" → "exact match ↑"
    (no unit), "forgetting" → "forgetting (nats) ↓"."""
    column = str(column)
    text = friendly_header(column)
    unit = UNITS.get(column.rpartition("/")[2])
    if not unit or f"({unit})" in text or f", {unit}" in text:
        return text
    head, arrow = (text[:-2], text[-2:]) if text.endswith((" ↓", " ↑")) else (text, "")
    return f"{head} ({unit}){arrow}"


MEASURE_TITLES = {m: axis_title(m) for m in ("exact_match", "answer_loss")}
"""The speciality measures' axis texts: "exact match ↑", "answer loss (nats) ↓"."""


def value_range(values, margin: float = 0.12) -> list[float] | None:
    """The range of a value axis that shows differences between `values`: their span padded by `margin` of it
    on each side; from 0 only where 0 is close (the values are no farther from 0 than their own spread), so
    that 4.68 against 4.74 is a visible gap rather than two equal bars. None without a finite value."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return None
    lo, hi = min(finite), max(finite)
    span = hi - lo
    pad = margin * span if span > 0 else max(abs(hi) * 0.05, 1e-3)
    lo, hi = lo - pad, hi + pad
    if lo > 0 and min(finite) <= span:          # positive values near 0: start at 0
        lo = 0.0
    if hi < 0 and -max(finite) <= span:         # negative values near 0: end at 0
        hi = 0.0
    return [lo, hi]


def spaced_labels(texts, xs, ys, first=(), char_width: float = 0.009, height: float = 0.08) -> list[str]:
    """The texts to write beside the points (x, y) of a chart so that no two overlap: "" for a point whose
    label would cover one already kept. Labels are kept greedily, the points in `first` (indices, e.g. a curve's
    ends) before the others in their order; two labels clash when their points are closer than the wider
    label's width (`char_width` of the x span per character, plus one) across and `height` of the y span up
    and down. Points with a non-finite coordinate get no label. Hovering still names every point."""
    texts = [str(t) for t in texts]
    pts = [(float(x), float(y)) for x, y in zip(xs, ys)]
    ok = [math.isfinite(x) and math.isfinite(y) for x, y in pts]

    def span(vals) -> float:
        vals = [v for v, good in zip(vals, ok) if good]
        return (max(vals) - min(vals)) or 1.0 if vals else 1.0

    sx, sy = span([x for x, _ in pts]), span([y for _, y in pts])
    order = list(dict.fromkeys([*first, *range(len(texts))]))
    kept: list[int] = []
    for i in order:
        if not ok[i] or not texts[i]:
            continue
        clash = any(abs(pts[i][0] - pts[j][0]) / sx < char_width * (max(len(texts[i]), len(texts[j])) + 1)
                    and abs(pts[i][1] - pts[j][1]) / sy < height for j in kept)
        if not clash:
            kept.append(i)
    keep = set(kept)
    return [t if i in keep else "" for i, t in enumerate(texts)]


def friendly_columns(frame):
    """`frame` with every column renamed by `friendly_header` (a copy; the data is untouched)."""
    return frame.rename(columns={c: friendly_header(c) for c in frame.columns})


def worker_column(frame):
    """`frame` with its `worker_host` and `worker_pid` columns (as sweeps, searches and fine-tunes save them, one
    row per point or run) shown as one `worker` column "host:pid" in the place of `worker_host`
    (`forgetlab.executors.worker_label`; empty where a row has no worker). Other frames are returned as they are."""
    if "worker_host" not in frame.columns or "worker_pid" not in frame.columns:
        return frame

    def label(host, pid) -> str:
        if pd.isna(host) or pd.isna(pid):
            return ""
        return worker_label({"host": host, "pid": int(pid) if float(pid).is_integer() else pid})

    frame = frame.copy()
    at = list(frame.columns).index("worker_host")
    workers = [label(h, p) for h, p in zip(frame["worker_host"], frame["worker_pid"])]
    frame = frame.drop(columns=["worker_host", "worker_pid"])
    frame.insert(at, "worker", workers)
    return frame


def compact(value) -> str:
    """A setting as a person writes it: "0, 0.5, 1"; a long list of numbers "0…1 (11 points)"."""
    if isinstance(value, (list, tuple)):
        if len(value) > 4 and all(isinstance(v, (int, float)) for v in value):
            return f"{compact(min(value))}…{compact(max(value))} ({len(value)} points)"
        return ", ".join(compact(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def tell_apart(items, names=None, ids=None, most: int = 3) -> list[str]:
    """A short name per item (a dict of its settings, e.g. a run's recipe) saying what differs between them:
    for each key, in order, whose values are not all equal, "<name> <value>" (`names`: key → its name, None to
    write the value alone; by default the key in words), at most `most` such parts, joined by " · ". Where that
    leaves two names equal, each gets its entry of `ids` (e.g. when it was made), else its number. One item
    alone gets an empty name."""
    items = [dict(i) for i in items]
    if len(items) < 2:
        return [""] * len(items)
    names = dict(names or {})
    parts: list[list[str]] = [[] for _ in items]
    for key in dict.fromkeys(k for item in items for k in item):
        values = [json.dumps(item.get(key), sort_keys=True, default=str) for item in items]
        if len(set(values)) < 2:
            continue
        label = names.get(key, str(key).replace("_", " "))
        for out, item in zip(parts, items):
            if item.get(key) is not None:        # a setting the others have: nothing to say
                out.append(compact(item[key]) if label is None else f"{label} {compact(item[key])}")
    labels = [" · ".join(p[:most]) for p in parts]
    if len(set(labels)) < len(labels):
        extra = list(ids) if ids is not None else [f"#{i + 1}" for i in range(len(items))]
        labels = [f"{label} · {x}" if label else str(x) for label, x in zip(labels, extra)]
    return labels


# how the methods and series of the sweeps and fine-tunes are named in legends
SERIES_NAMES = {"fapm": "FAPM", "magnitude": "magnitude", "relative": "relative (|τ|/|W0|)", "dare": "DARE",
                "ties": "TIES", "alpha": "WiSE-FT", "wise-ft": "WiSE-FT", "hma": "HMA", "adamw": "AdamW", "mofo": "MoFO", "sfa": "SFA",
                "l1": "L1-to-init", "l2": "L2-to-init", "base": "base", "slerp": "SLERP", "della": "DELLA",
                "sce": "SCE"}


def series_name(name: str) -> str:
    """A legend name for a series or run label: "fapm" → "FAPM", "mofo-0.2" → "MoFO 0.2", "sfa-p0.25" →
    "SFA p = 0.25", "l2-1" → "L2-to-init λ = 1"; unknown names unchanged."""
    name = str(name)
    if name in SERIES_NAMES:
        return SERIES_NAMES[name]
    head, sep, rest = name.partition("-")
    if sep and head in ("mofo", "l1", "l2", "sfa"):
        if head == "sfa" and rest.startswith("p"):
            return f"SFA p = {rest[1:]}"
        if head == "mofo":
            return f"MoFO {rest}"
        return f"{SERIES_NAMES[head]} λ = {rest}"
    return name


def figures_html(figures, title: str = "forgetlab") -> str:
    """Figures as one self-contained HTML page (plotly.js embedded once, so it opens without a network)."""
    parts = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figures)]
    return f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head><body>{''.join(parts)}" \
           "</body></html>"


def annotation(text: "str | None") -> dict:
    """The keyword arguments of `add_hline`/`add_vline` that write `text` beside the line, or none: plotly writes
    "new text" on a line whose annotation_text is None."""
    return {"annotation_text": text} if text else {}
