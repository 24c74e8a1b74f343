"""Figures of a text diff (`forgetlab.analysis.textdiff_results.TextDiffResult`): the text with each token shaded
by its rise or KL (HTML spans, hover = both models' top-3), its legend, the rise per token class, the rise along the
sequences and the logit lens. No external assets: the HTML is self-contained, the figures are plotly's."""
from __future__ import annotations

import html
import math

import numpy as np
import plotly.graph_objects as go

from forgetlab.plots import color_for

# diverging: blue = the model predicts the token better than the reference, red = worse (forgotten)
NEGATIVE = (33, 102, 172)
POSITIVE = (178, 24, 43)
WHITE = (255, 255, 255)
LABELS = {"rise": "rise (nats)", "kl": "KL (nats)"}
MARGIN = {"t": 50, "b": 40, "l": 50, "r": 10}


def shade_scale(result, measure: str = "rise", quantile: float = 0.99) -> float:
    """The value that gets the full colour: the `quantile` of |measure| over the scored tokens (so that a few
    outliers do not wash out the rest); 1e-6 when everything is 0."""
    values = result.scored()[measure].abs().to_numpy()
    values = values[np.isfinite(values)]
    return float(max(np.quantile(values, quantile), 1e-6)) if len(values) else 1e-6


def shade(value: float, scale: float) -> str:
    """The background colour of a value on the diverging scale [−scale, scale] (white at 0, NaN white)."""
    if value is None or not math.isfinite(value):
        return "rgb(255, 255, 255)"
    t = max(-1.0, min(1.0, value / scale))
    end = POSITIVE if t > 0 else NEGATIVE
    mix = [round(w + abs(t) * (e - w)) for w, e in zip(WHITE, end)]
    return f"rgb({mix[0]}, {mix[1]}, {mix[2]})"


def _top(row, side: str) -> str:
    return ", ".join(f"{row[f'top{k}_{side}']!r} {row[f'p{k}_{side}']:.3f}" for k in (1, 2, 3)
                     if isinstance(row[f"top{k}_{side}"], str) and row[f"top{k}_{side}"] != "")


def token_title(row, base: str, model: str) -> str:
    """The hover text of one token: its class, rise, KL, logp under both models and both models' top-3."""
    if row["position"] == 0 or not math.isfinite(row["rise"]):
        return f"{row['token']!r} ({row['token_class']}): the first token, predicted by nothing"
    return (f"{row['token']!r} ({row['token_class']}) · rise {row['rise']:+.3f} nats · KL {row['kl']:.3f} nats\n"
            f"logp: {base} {row['logp_base']:.3f}, {model} {row['logp_model']:.3f}\n"
            f"{base} predicted: {_top(row, 'base')}\n{model} predicted: {_top(row, 'model')}")


def token_html(result, doc: int, measure: str = "rise", scale: float | None = None) -> str:
    """Sequence `doc` of the result as HTML: one span per token, its background the `measure` (rise: diverging
    blue–white–red; KL: white–red) on [−scale, scale] (default `shade_scale`), its title (the hover) from
    `token_title`. Newlines are kept as line breaks, marked ↵."""
    scale = scale or shade_scale(result, measure)
    rows = result.tokens[result.tokens["doc"] == doc]
    spans = []
    for _, row in rows.iterrows():
        text = html.escape(str(row["token"])).replace("\n", "↵<br>").replace("\t", "⇥")
        color = shade(row[measure], scale)
        title = html.escape(token_title(row, result.against, result.model), quote=True)
        spans.append(f'<span title="{title}" style="background:{color};padding:1px 0;border-radius:2px">'
                     f"{text}</span>")
    return ('<div style="font-family:ui-monospace,Menlo,monospace;font-size:14px;line-height:1.9;'
            f'white-space:pre-wrap;color:#111;background:#fff;padding:8px">{"".join(spans)}</div>')


def legend_html(measure: str, scale: float) -> str:
    """The colour legend of `token_html` in nats: a gradient from −scale (or 0 for KL) to +scale."""
    lo = 0.0 if measure == "kl" else -scale
    stops = ", ".join(shade(v, scale) for v in np.linspace(lo, scale, 9))
    what = ("rise = logp(reference) − logp(model): red = the model lost probability on the token (forgot), "
            "blue = it gained" if measure == "rise" else "KL(p_reference ‖ p_model) over the vocabulary")
    return ('<div style="font-size:12px;color:#333">'
            f'<div style="height:12px;width:320px;background:linear-gradient(to right, {stops})"></div>'
            f'<div style="width:320px;display:flex;justify-content:space-between"><span>{lo:+.3f}</span>'
            f'<span>{(lo + scale) / 2:+.3f}</span><span>{scale:+.3f} nats</span></div>'
            f"<div>{html.escape(what)}; values beyond ±{scale:.3f} nats get the full colour.</div></div>")


def class_bars(result, measure: str = "mean_rise") -> go.Figure:
    """Bars per token class of `measure` (mean_rise, total_rise, share_of_rise or mean_kl), with the number of
    tokens of each class in the hover."""
    frame = result.by_class()
    fig = go.Figure(go.Bar(x=frame["token_class"], y=frame[measure], marker={"color": color_for(result.model)},
                           customdata=np.stack([frame["tokens"], frame["share_of_rise"]], -1),
                           hovertemplate="%{x}: %{y:.4f}<br>%{customdata[0]} tokens, %{customdata[1]:.1%} of the "
                                         "total rise<extra></extra>"))
    fig.update_layout(title=f"{measure.replace('_', ' ')} per token class · {result.model} vs {result.against}",
                      yaxis_title="nats", height=340, margin=MARGIN)
    return fig


def position_figure(result, bins: int = 16) -> go.Figure:
    """Mean rise and mean KL along the sequences (positions in `bins` ranges)."""
    frame = result.by_position(bins)
    x = (frame["position_from"] + frame["position_to"]) / 2
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=frame["mean_rise"], mode="lines+markers", name="mean rise",
                             line={"color": color_for(result.model)}))
    fig.add_trace(go.Scatter(x=x, y=frame["mean_kl"], mode="lines+markers", name="mean KL",
                             line={"color": color_for("base"), "dash": "dot"}))
    fig.update_layout(title="where along the sequence", xaxis_title="position in the sequence",
                      yaxis_title="nats", height=340, margin=MARGIN)
    return fig


def coincide(a, b, axis_span: float, share: float = 0.02) -> bool:
    """Whether two lines drawn on an axis spanning `axis_span` lie on top of each other: they are never further
    apart than `share` of the span (2 %: a few pixels on a chart)."""
    gaps = [abs(float(x) - float(y)) for x, y in zip(a, b) if math.isfinite(float(x)) and math.isfinite(float(y))]
    return bool(gaps) and max(gaps) <= share * (axis_span or 1.0)


def lens_figure(result) -> go.Figure:
    """The logit lens: both models' next-token loss read after each layer (lines: the reference dashed with open
    markers, the model solid, so that either shows where they meet; when they lie on top of each other the
    legend says so, with the largest gap in nats) and the rise (bars, right axis); depth 0 is the embeddings, the
    last depth the models' own loss. Each axis picks its own round ticks (a right axis overlaying the left one
    would otherwise copy its grid, at values like 0.0096 / 0.0197); depths tick at whole layers."""
    frame = result.lens_frame()
    fig = go.Figure()
    if frame.empty:
        fig.update_layout(title="no logit lens for this run", height=340, margin=MARGIN)
        return fig
    fig.add_trace(go.Bar(x=frame["depth"], y=frame["rise"], name="rise (model − reference)", yaxis="y2",
                         marker={"color": "rgba(178, 24, 43, 0.35)"}))
    losses = [*frame["loss_base"], *frame["loss_model"]]
    span = max(losses) - min(losses)
    same = coincide(frame["loss_base"], frame["loss_model"], span)
    gap = float((frame["loss_model"] - frame["loss_base"]).abs().max())
    styles = {"loss_base": ({"dash": "dash", "width": 2}, {"symbol": "circle-open", "size": 10}),
              "loss_model": ({"dash": "solid", "width": 2}, {"symbol": "circle", "size": 6})}
    for side, name in (("loss_base", result.against), ("loss_model", result.model)):
        line, marker = styles[side]
        colour = color_for(name.split("@")[0])
        label = f"{name} (on top of {result.against}: ≤ {gap:.3f} nats apart)" if same and side == "loss_model" \
            else name
        fig.add_trace(go.Scatter(x=frame["depth"], y=frame[side], mode="lines+markers", name=label,
                                 line={"color": colour, **line}, marker={"color": colour, **marker}))
    fig.update_layout(title="logit lens: next-token loss read after each layer",
                      xaxis={"title": "depth (0 = embeddings)", "dtick": 1, "tick0": 0},
                      yaxis={"title": "loss (nats)", "tickmode": "auto", "nticks": 6},
                      yaxis2={"title": "rise (nats)", "overlaying": "y", "side": "right", "showgrid": False,
                              "tickmode": "auto", "nticks": 6, "rangemode": "tozero", "zeroline": False},
                      height=340, margin={**MARGIN, "r": 50}, legend={"orientation": "h", "y": -0.25})
    return fig


def figures(result) -> list[go.Figure]:
    """The figures of a saved text diff, for the Runs page: per-class bars, position curve, logit lens."""
    return [class_bars(result), position_figure(result), lens_figure(result)]
