"""Figures of the Merge page: generality and speciality of a merge beside its base and parents."""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from forgetlab.evaluate import Scorecard
from forgetlab.plots.models import scorecards_figure


def scorecard_figure(cards: Sequence[Scorecard], measure: str = "exact_match", *, title: str = "",
                     merged: Sequence[str] = ()) -> go.Figure:
    """General-text loss (↓) and speciality per task (`measure`: exact match ↑ or answer loss ↓) of merges
    (`merged`, hatched) beside their base and parents, on separate axes (`plots.models.scorecards_figure`)."""
    return scorecards_figure(cards, measure, title=title, merged=merged)
