"""Output helpers for CLI commands (the core never prints; commands write through these)."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

import pandas as pd
from tqdm import tqdm

from forgetlab.core.outputs import write_text_file
from forgetlab.core.threads import tick


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


def write_csv(df: pd.DataFrame, out: str, overwrite: bool) -> Path:
    """Write a table as CSV atomically (forgetlab.core.outputs.write_text_file), whatever the file's suffix; an
    existing file only with `overwrite`. Says where it went."""
    path = write_text_file(out, df.to_csv(index=False), overwrite=overwrite)
    emit(f"wrote {path}")
    return path


PIPE_INTERVAL = 5.0     # seconds between progress lines when stderr is not a terminal


def tqdm_progress(desc: str, *, stream=None, interval: float = PIPE_INTERVAL,
                  clock: Callable[[], float] | None = None) -> tuple[Callable[[float, str], None], Callable[[], None]]:
    """A Progress callback and a function that closes it. On a terminal: a tqdm bar on stderr, redrawn in
    place. On anything else (piped to `tee`, a log file, CI): one plain line every `interval` seconds
    ("desc: 42% · message") and a last line with the elapsed time, instead of a redraw per step that piles
    every update into one huge line."""
    stream = stream if stream is not None else sys.stderr
    clock = clock or time.monotonic
    if not getattr(stream, "isatty", lambda: False)():
        start = clock()
        state = {"last": None, "fraction": 0.0, "message": ""}

        def line(fraction: float, message: str) -> None:
            text = f"{desc}: {fraction:.0%}" + (f" · {message[:80]}" if message else "")
            stream.write(text + "\n")
            stream.flush()

        def update_plain(fraction: float, message: str = "") -> None:
            tick()      # torch threads follow the machine's load (forgetlab.core.threads.governed_threads)
            state["fraction"], state["message"] = float(fraction), message or state["message"]
            now = clock()
            if state["last"] is None or now - state["last"] >= interval:
                state["last"] = now
                line(state["fraction"], state["message"])

        def close_plain() -> None:
            if state["last"] is not None:
                stream.write(f"{desc}: {state['fraction']:.0%}, {clock() - start:.0f} s\n")
                stream.flush()

        return update_plain, close_plain

    bar = tqdm(total=1000, desc=desc, unit="‰", leave=False, file=stream,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}")

    def update(fraction: float, message: str = "") -> None:
        tick()
        bar.n = int(fraction * 1000)
        if message:
            bar.set_postfix_str(message[:60], refresh=False)
        bar.refresh()

    return update, bar.close


def emit_estimate(est, dry_run: bool) -> bool:
    """Print a job's memory estimate (`forgetlab.core.memory.MemoryEstimate`): with `dry_run` the figure, its
    parts and whether it fits, and return True (the command stops there); otherwise raise its
    `MemoryBudgetError` when it does not fit (the job would die part-way) and return False."""
    if dry_run:
        emit(est.describe())
        emit(f"  {est.breakdown()}")
        emit("  fits" if est.fits else "  does NOT fit; to make it fit, try: " + ", ".join(est.fixes or
                                                                                        ["a smaller model"]))
        return True
    est.check()
    return False
