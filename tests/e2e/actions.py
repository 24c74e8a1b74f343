"""One real action per page, as a user would do it, for the end-to-end test and the latency benchmark.

Each action fills what it needs (small settings so that the pico zoo answers in seconds), clicks the page's
main button and returns how many plotly charts must be on the page afterwards. A page without an entry
here gets the generic action: click its first primary button.
"""
from __future__ import annotations

from typing import Callable

from tests.e2e.harness import PLOT, alerts, count, wait_for, wait_idle, wait_jobs

JOB_TIMEOUT = 180.0      # a page's background job, until it ended and the page shows its result
CHART_TIMEOUT = 20.0     # then plotly has this long to draw the charts


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
    wait_jobs(page, JOB_TIMEOUT)


def _charts_at_least(page, n: int) -> int:
    try:
        wait_for(page, lambda: count(page, PLOT) >= n, CHART_TIMEOUT, f"{n} chart(s)")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; messages on the page: {alerts(page)}") from None
    return n


def _fill_all(page, values: dict[str, str]) -> None:
    for label, value in values.items():
        _fill(page, label, value)


def small_budget(page) -> None:
    """The sidebar's evaluation budget (every page's evaluations) set small, so the pico zoo answers in seconds."""
    _fill_all(page, {"held-out blocks": "8", "pairs per task": "8"})


def models(page) -> int:
    """Compute the scorecards of every model at a small budget (the heatmaps are drawn on load)."""
    small_budget(page)
    _click(page, "Evaluate")
    return _charts_at_least(page, 3)


def linearity(page) -> int:
    """Non-linearity scores on 8 samples and a 3-point α curve (α = 1 is the reference, not a point)."""
    _fill_all(page, {"samples": "8", "α grid": "0, 0.25, 0.5"})
    _click(page, "Compute scores")
    return _charts_at_least(page, 1)


def forgetting(page) -> int:
    """A 3-point WiSE-FT α curve of the first fine-tuned model."""
    small_budget(page)
    _fill_all(page, {"α values": "0, 0.5, 1"})
    _click(page, "Run sweep")
    return _charts_at_least(page, 2)


def features(page) -> int:
    """A t-SNE map of 8 samples per task."""
    _fill_all(page, {"samples per task": "8", "perplexity": "4"})
    _click(page, "Map features")
    return _charts_at_least(page, 1)


def merge(page) -> int:
    """The composed merge (TIES of the full fine-tunes), saved and evaluated at a small budget."""
    small_budget(page)
    _click(page, "Merge and evaluate")
    return _charts_at_least(page, 1)


def finetune(page) -> int:
    """A 12-step fine-tune from the base, recorded every 4 steps."""
    _fill_all(page, {"steps": "12", "record every k steps": "4", "general blocks (max)": "8",
                     "eval pairs (max)": "8"})
    _click(page, "Fine-tune")
    return _charts_at_least(page, 1)


def runs(page) -> int:
    """The newest saved run opens with its charts."""
    return _charts_at_least(page, 1)


def glossary(page) -> int:
    """Find a term: the list narrows to it (the page has no chart)."""
    box = page.get_by_label("find a term", exact=True).first
    box.fill("MoFO")
    box.press("Enter")
    wait_idle(page)
    wait_for(page, lambda: "momentum" in page.locator('[data-testid="stMain"]').inner_text().lower(), CHART_TIMEOUT,
             "the MoFO entry")
    return 0


def generic(page) -> int:
    """Click the page's first primary button; expect at least one chart."""
    if page.locator('[data-testid="stBaseButton-primary"]').count():
        _click(page)
    return _charts_at_least(page, 1)


ACTIONS: dict[str, Callable] = {"models": models, "linearity": linearity, "forgetting": forgetting,
                                "features": features, "merge": merge, "finetune": finetune, "runs": runs,
                                "glossary": glossary}


def action_for(stem: str) -> Callable:
    """The action of a page (generic when the page has no entry)."""
    return ACTIONS.get(stem, generic)
