"""One real action per page, as a user would do it, for the end-to-end test and the latency benchmark.

Each action fills what it needs (small settings so that the pico zoo answers in seconds), clicks the page's
main button and returns how many plotly charts must be on the page afterwards. A page without an entry
here gets the generic action: click its first primary button.
"""
from __future__ import annotations

from typing import Callable

from tests.e2e.harness import PLOT, count, wait_for, wait_idle

JOB_TIMEOUT = 180.0


def _fill(page, label: str, value: str) -> None:
    box = page.get_by_label(label, exact=True).first
    box.fill(value)
    box.press("Enter")
    wait_idle(page)


def _click(page, name: str | None = None) -> None:
    button = (page.get_by_role("button", name=name, exact=True) if name
              else page.locator('[data-testid="stBaseButton-primary"]')).first
    button.click()
    page.wait_for_timeout(300)
    wait_idle(page, JOB_TIMEOUT)


def _charts_at_least(page, n: int) -> int:
    wait_for(page, lambda: count(page, PLOT) >= n, JOB_TIMEOUT, f"{n} chart(s)")
    return n


def models(page) -> int:
    """Compute the scorecards of every model (the heatmaps are drawn on load)."""
    _click(page, "Evaluate")
    return _charts_at_least(page, 3)


def forgetting(page) -> int:
    """A 3-point WiSE-FT α curve of the first fine-tuned model."""
    _fill(page, "α values", "0, 0.5, 1")
    _click(page, "Run sweep")
    return _charts_at_least(page, 2)


def runs(page) -> int:
    """The newest saved run opens with its charts."""
    return _charts_at_least(page, 1)


def generic(page) -> int:
    """Click the page's first primary button; expect at least one chart."""
    if page.locator('[data-testid="stBaseButton-primary"]').count():
        _click(page)
    return _charts_at_least(page, 1)


ACTIONS: dict[str, Callable] = {"models": models, "forgetting": forgetting, "runs": runs}


def action_for(stem: str) -> Callable:
    """The action of a page (generic when the page has no entry)."""
    return ACTIONS.get(stem, generic)
