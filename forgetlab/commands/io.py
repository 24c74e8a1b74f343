"""Output helpers for CLI commands (the core never prints; commands write through these)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pandas as pd

from forgetlab.outputs import write_text_file


def emit(text: str = "") -> None:
    """Write a line to standard output."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def emit_frame(df: pd.DataFrame, out: str | None = None, float_format: str = "{:.4f}") -> None:
    """Show a table on stdout, or save it as CSV/JSON when `out` names a file (format from its suffix), written
    atomically; whether an existing file may be replaced was decided before the command ran (cli.main)."""
    if out:
        path = Path(out)
        text = df.to_json(orient="records", indent=2) if path.suffix.lower() == ".json" else df.to_csv(index=False)
        emit(f"wrote {write_text_file(path, text, overwrite=True)}")
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
