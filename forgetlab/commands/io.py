"""Output helpers for CLI commands (the core never prints; commands write through these)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pandas as pd


def emit(text: str = "") -> None:
    """Write a line to standard output."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def emit_frame(df: pd.DataFrame, out: str | None = None, float_format: str = "{:.4f}") -> None:
    """Show a table on stdout, or save it as CSV/JSON when `out` names a file (format from its suffix)."""
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix.lower() == ".json":
            df.to_json(path, orient="records", indent=2)
        else:
            df.to_csv(path, index=False)
        emit(f"wrote {path}")
    else:
        with pd.option_context("display.max_rows", 200, "display.width", 160,
                               "display.float_format", float_format.format):
            emit(df.to_string(index=False))


def tqdm_progress(desc: str) -> tuple[Callable[[float, str], None], Callable[[], None]]:
    """A Progress callback drawing a tqdm bar on stderr, and a function that closes it."""
    from tqdm import tqdm

    bar = tqdm(total=1000, desc=desc, unit="‰", leave=False, file=sys.stderr,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}")

    def update(fraction: float, message: str = "") -> None:
        bar.n = int(fraction * 1000)
        if message:
            bar.set_postfix_str(message[:60], refresh=False)
        bar.refresh()

    return update, bar.close
