"""Tables as a person reads them: friendly headers, empty cells instead of "None", rounded numbers."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from forgetlab.plots import PERPLEXITY_COLUMNS, friendly_columns, friendly_header, perplexity_columns, worker_column


def styled(frame: pd.DataFrame, precision: int = 4):
    """A pandas Styler of `frame` with friendly headers, one `worker` column (host:pid) for a point's or run's
    worker host and pid, next to every Δ of the general loss (forgetting, nats) the relative change of
    perplexity it means (`plots.perplexity_columns`, shown as a signed percentage), missing values drawn empty
    and floats at `precision` decimals (st.dataframe shows the Styler's text; the numbers stay numbers for
    sorting)."""
    frame = friendly_columns(perplexity_columns(worker_column(frame)))
    percent = [h for h in map(friendly_header, PERPLEXITY_COLUMNS.values()) if h in frame.columns]
    style = frame.style.format(precision=precision, na_rep="", thousands=None)
    if percent:
        style = style.format("{:+.1%}", subset=percent, na_rep="")
    return style


def show_table(frame: pd.DataFrame | None, *, key: str | None = None, precision: int = 4, **kwargs) -> None:
    """st.dataframe of `styled(frame)` without the index (nothing for None or an empty frame)."""
    if frame is None or frame.empty:
        return
    st.dataframe(styled(frame, precision), hide_index=True, key=key, **kwargs)
