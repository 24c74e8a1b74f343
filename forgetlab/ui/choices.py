"""Defaults for the app's choice widgets."""
from __future__ import annotations

from collections.abc import Sequence


def index_of(options: Sequence, preferred) -> int:
    """The position of `preferred` in `options`, or 0 when it is not one of them: a selectbox's default that
    falls back to the first option (a user's pool may lack the demo's names)."""
    options = list(options)
    return options.index(preferred) if preferred in options else 0
