"""The FAPM paper's relative axes: gain kept and forgetting recovered (%) against a sweep's setting
(docs/methods.md#relative-shares). Drawn from a frame alone — the `fapm-relative` study's table or
`forgetlab.analysis.retention.relative_frame` of one sweep (the Forgetting page's "relative axes" toggle)."""
from __future__ import annotations

from typing import Optional

import pandas as pd
import plotly.graph_objects as go

from forgetlab.plots import color_map, series_name

SHARES = (("gain_kept", "gain kept", "solid"), ("forgetting_recovered", "forgetting recovered", "dash"))
"""The two shares: column, legend words, line style."""


def relative_figure(frame: pd.DataFrame, x: str = "x", x_title: str = "pruning ratio", *, mark: Optional[float] = None,
                    mark_text: str = "paper's operating point", title: str = "Relative axes (FAPM paper)"
                    ) -> go.Figure:
    """Both shares (fractions in `frame`, drawn in %) against column `x`, one colour per series (column `series`
    where there is one), gain kept solid and forgetting recovered dashed; a dotted vertical line at `mark`."""
    fig = go.Figure()
    groups = list(frame.groupby("series", sort=False)) if "series" in frame else [("", frame)]
    colors = color_map([name for name, _ in groups])
    for name, part in groups:
        part = part.sort_values(x)
        for column, words, dash in SHARES:
            label = f"{series_name(name)}: {words}" if name else words
            fig.add_trace(go.Scatter(x=part[x], y=100 * part[column], mode="lines+markers", name=label,
                                     line=dict(color=colors[name], dash=dash),
                                     hovertemplate=f"{label}<br>{x_title} %{{x:g}}<br>%{{y:.1f}} %<extra></extra>"))
    if mark is not None:
        fig.add_vline(x=mark, line_dash="dot", line_color="#7f7f7f", annotation_text=mark_text,
                      annotation_position="top left")      # inside the plot: on the right it widened the x axis
    fig.add_hline(y=100, line_width=1, line_color="#c7c7c7")
    fig.update_layout(title=title, height=420, xaxis_title=x_title, yaxis_title="share (%) ↑ (100 = fine-tune's gain "
                                                                               "/ base's generality)")
    return fig
