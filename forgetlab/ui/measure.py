"""One session-wide choice of how speciality is measured: exact match (↑) or answer loss (↓).

Every page that shows speciality (Models, Forgetting, Merge, Fine-tune, Runs) draws the same radio
(`speciality_measure(page, pool)`); a change on one page holds on every other page of the browser session.
The choice is kept under `MEASURE_KEY` (a plain session-state key, which Streamlit keeps across page switches,
unlike a widget's own key) and each page's radio is synced to it.

The default is the measure that moves on the pool: answer loss when exact match hardly differs between the
pool's models (e.g. the demo zoo, whose small models rarely produce an exact answer), else exact match. It is
decided from scorecards already computed — the zoo's stored ones (`stored_scorecards`) or the Models page's —
never by evaluating anything; with none at hand it is answer loss, which moves whenever exact match does.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import streamlit as st

if TYPE_CHECKING:  # pragma: no cover
    from forgetlab.evaluate import Scorecard
    from forgetlab.pool import ModelPool

MEASURE_KEY = "app_measure"
MEASURE_LABELS = {"exact_match": "exact match ↑", "answer_loss": "answer loss ↓"}
MOVES = 0.25        # exact match "moves" when some task's exact match differs by this much between models
                    # (the pico zoo's 0–0.11 is a few answers of 50–100: noise next to the answer loss)
MANIFEST = "manifest.json"


def measure_label(measure: str) -> str:
    """"exact match ↑" / "answer loss ↓" (other measures: their name)."""
    return MEASURE_LABELS.get(measure, measure)


def stored_scorecards(pool: "ModelPool") -> list["Scorecard"]:
    """The scorecards that a zoo build stored in the manifest beside the pool file, for the pool's models
    (base first, then the pool's order); [] when the pool has no manifest (a user's own pool) or none match."""
    from forgetlab.evaluate import Scorecard

    source = getattr(pool, "source", None)
    path = Path(source).parent / MANIFEST if source else None
    if path is None or not path.is_file():
        return []
    try:
        stored = json.loads(path.read_text(encoding="utf-8")).get("scorecards") or {}
    except (OSError, ValueError, AttributeError):
        return []
    cards = []
    for name in ["base", *pool.model_names]:
        data = stored.get(name)
        if isinstance(data, dict):
            try:
                card = Scorecard.from_dict(data)
            except (KeyError, TypeError, ValueError):
                continue
            card.model = name
            cards.append(card)
    return cards


def default_measure(cards: Sequence["Scorecard"]) -> str:
    """"exact_match" when some task's exact match differs by at least MOVES between the scorecards, else
    "answer_loss" (also with no scorecards)."""
    by_task: dict[str, list[float]] = {}
    for card in cards:
        for name, score in card.tasks.items():
            by_task.setdefault(name, []).append(float(score.exact_match))
    moves = any(max(v) - min(v) >= MOVES for v in by_task.values() if v)
    return "exact_match" if moves else "answer_loss"


def current_measure(pool: "ModelPool | None" = None) -> str:
    """The session's measure (set by a page's radio), else the default for `pool`'s stored scorecards."""
    chosen = st.session_state.get(MEASURE_KEY)
    if chosen in MEASURE_LABELS:
        return chosen
    return default_measure(stored_scorecards(pool)) if pool is not None else "answer_loss"


def speciality_measure(page: str, pool: "ModelPool | None" = None, *, container=None) -> str:
    """Draw the session-wide "Speciality measured by" radio on `page` (its own widget key) and return
    "exact_match" or "answer_loss". Only the charts change with it; nothing is recomputed."""
    value = current_measure(pool)
    st.session_state[MEASURE_KEY] = value
    key = f"{page}_measure"
    st.session_state[key] = value

    def sync() -> None:
        st.session_state[MEASURE_KEY] = st.session_state[key]

    where = container if container is not None else st
    where.radio("Speciality measured by", list(MEASURE_LABELS), format_func=measure_label, horizontal=True,
                key=key, on_change=sync,
                help="Exact match (↑) of the generated answers, or the loss on the answer tokens (↓), which "
                     "moves before exact match does. One choice for every page of this session; only the "
                     "charts change, nothing is recomputed.")
    return st.session_state[MEASURE_KEY]
