"""What every page starts with: its title (the one its MENU declares), the question it answers, and the pool it
needs, stopping with a hint when the pool lacks what the page works on."""
from __future__ import annotations

from typing import Optional

from forgetlab.core.pool import ModelPool
from forgetlab.ui.navigation import page_header
from forgetlab.ui.pool import require_finetuned, require_pool, require_tasks

NEEDS = ("pool", "finetuned", "tasks", "finetuned+tasks")


def start_page(menu: tuple, caption: str, *, needs: Optional[str] = "pool", purpose: str = "") -> Optional[ModelPool]:
    """Draw the page's title (`menu[0]`, its MENU's title) and caption, then return the sidebar's pool; `needs`
    says what the page works on ("pool", "finetuned": a fine-tuned model, "tasks": probe data, or both; None: no
    pool), and the page stops with a hint naming `purpose` when the pool lacks it."""
    page_header(menu[0], caption)
    if needs is None:
        return None
    if needs not in NEEDS:
        raise ValueError(f"needs must be one of {NEEDS}; got {needs!r}")
    pool = require_pool()
    if "finetuned" in needs:
        require_finetuned(pool, purpose)
    if "tasks" in needs:
        require_tasks(pool, purpose)
    return pool
