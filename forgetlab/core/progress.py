"""Progress callbacks: long functions take `progress: Callable[[float, str], None] | None`."""
from __future__ import annotations

from typing import Any, Callable, Optional

Progress = Optional[Callable[[float, str], None]]


def report(progress: Progress, fraction: float, message: str = "") -> None:
    """Call `progress(fraction, message)` if a callback was given; fraction is clipped to [0, 1]."""
    if progress is not None:
        progress(min(1.0, max(0.0, float(fraction))), message)


def scaled(progress: Progress, start: float, stop: float) -> Progress:
    """A callback that maps [0, 1] of a sub-task onto [start, stop] of `progress`."""
    if progress is None:
        return None
    return lambda f, m="": report(progress, start + (stop - start) * f, m)


def prefixed(progress: Progress, prefix: str) -> Progress:
    """A callback that passes fractions on unchanged and writes `prefix` before every message
    ("run 2 of 5 · mofo-0.2 · step 3/60 · loss 0.41"), so that a sub-task's own count says whose it is."""
    if progress is None:
        return None
    return lambda f, m="": report(progress, f, f"{prefix} · {m}" if m else prefix)


def publish(progress: Progress, partial: Any) -> None:
    """Hand `partial` (a snapshot of the result so far) to a progress callback that shows one — the app's
    background job has `publish` (forgetlab.ui.jobs.Job) and draws it while the job runs; other callbacks (the
    CLI's bar, None) ignore it."""
    show = getattr(progress, "publish", None)
    if show is not None:
        show(partial)
