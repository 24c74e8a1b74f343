"""Tables as a person reads them: friendly headers, rounded numbers, no column that holds nothing, and no more
columns than the page's own chart shows (so that a table fits the page at the README's 1400 × 1000 px)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from forgetlab.core.evaluate import BENCHMARK_PREFIX
from forgetlab.plots import PERPLEXITY_COLUMNS, friendly_columns, friendly_header, perplexity_columns, worker_column


def styled(frame: pd.DataFrame, precision: int = 4):
    """A pandas Styler of `frame` with friendly headers, one `worker` column (host:pid) for a point's or run's
    worker host and pid, next to every Δ of the general loss (forgetting, nats) the relative change of
    perplexity it means (`plots.perplexity_columns`, shown as a signed percentage), missing values drawn empty,
    columns in % ("… %") at one decimal and other floats at `precision` decimals (st.dataframe shows the Styler's text; the numbers stay numbers for
    sorting)."""
    frame = friendly_columns(perplexity_columns(worker_column(frame)))
    percent = [h for h in map(friendly_header, PERPLEXITY_COLUMNS.values()) if h in frame.columns]
    style = frame.style.format(precision=precision, na_rep="", thousands=None)
    if percent:
        style = style.format("{:+.1%}", subset=percent, na_rep="")
    shares = [c for c in frame.columns if str(c).endswith("%") and pd.api.types.is_float_dtype(frame[c])]
    if shares:                                  # a column in % ("math kept %"): 97.2, not 97.2222
        style = style.format("{:.1f}", subset=shares, na_rep="")
    return style


def filled(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` without the columns that hold no value in any row (None, NaN or ""): a column of blanks only
    takes width (a copy; the frame itself when every column holds something)."""
    empty = [c for c in frame.columns
             if (frame[c].isna() | frame[c].map(lambda v: isinstance(v, str) and not v.strip())).all()]
    return frame.drop(columns=empty) if empty and len(empty) < len(frame.columns) else frame


SPECIALITY = ("exact_match", "answer_loss")


def measure_view(frame: pd.DataFrame, measure: str) -> pd.DataFrame:
    """A scorecards table (`forgetlab.core.evaluate.Scorecard.to_frame` rows) with the speciality columns of
    `measure` only — the measure the page's chart shows (exact match or answer loss; the other is one click on the
    page's measure away) — besides the model, its general loss, perplexity and any benchmark metric: three tasks
    × two measures made the Models page's table wider than the page. Other measures keep every column."""
    if measure not in SPECIALITY:
        return frame
    other = next(m for m in SPECIALITY if m != measure)
    return frame[[c for c in frame.columns
                  if str(c).startswith(BENCHMARK_PREFIX) or not str(c).endswith(f"/{other}")]]


def show_table(frame: pd.DataFrame | None, *, key: str | None = None, precision: int = 4, **kwargs) -> None:
    """st.dataframe of `styled(frame)` without the index and without columns that hold nothing (`filled`);
    nothing for None or an empty frame."""
    if frame is None or frame.empty:
        return
    st.dataframe(styled(filled(frame), precision), hide_index=True, key=key, **kwargs)
