"""CLI progress on a non-terminal (piped output, logs): a plain line every few seconds, not a redraw per step."""
from __future__ import annotations

import io

from forgetlab.commands.io import tqdm_progress


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_piped_progress_prints_a_line_every_interval_not_every_step():
    out, clock = io.StringIO(), _Clock()
    update, close = tqdm_progress("finetune math", stream=out, interval=5.0, clock=clock)
    for step in range(1, 1001):               # 1000 steps over 20 s
        clock.now = step * 0.02
        update(step / 1000, f"step {step}/1000")
    close()
    lines = out.getvalue().splitlines()
    assert 4 <= len(lines) <= 6, lines        # one at the start, one per 5 s, the last one
    assert lines[0] == "finetune math: 0% · step 1/1000"
    assert lines[1].startswith("finetune math: 25% · step 25")     # 5 s later
    assert lines[-1] == "finetune math: 100%, 20 s"
    assert "\r" not in out.getvalue()


def test_terminal_progress_keeps_the_tqdm_bar():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    update, close = tqdm_progress("merge", stream=out)
    update(0.5, "half")
    close()
    assert "\r" in out.getvalue() and "50%" in out.getvalue()
