"""The app's pages and its menu: a fixed order, listed only when their file exists under pages/.

Streamlit lists a `pages/` folder beside the entry script in its own sidebar menu as soon as a browser
session opens, before `app.py` has run `st.navigation` — on a cold server that list (file names, not our
titles) flashed for a moment. `.streamlit/config.toml` therefore sets `client.showSidebarNavigation = false`
(Streamlit never draws its automatic menu), `app.py` calls `st.navigation(..., position="hidden")` and
`render_menu` draws the menu with `st.page_link`, first thing in the sidebar.

A page opened by its own URL (e.g. /finetune) as the very first request of a fresh server is the other case:
until some session has run `st.navigation`, Streamlit serves `pages/` the old way and runs the page file alone,
without app.py (no sidebar, no wide layout). Every page therefore starts with `require_app()`, which reruns
such a session through app.py.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import streamlit as st

try:
    from streamlit.runtime.pages_manager import PagesManager
except ImportError:          # a Streamlit without the old pages/ mode: require_app has nothing to do
    PagesManager = None

MENU_KEY = "app_menu"      # the menu's container key: its element has the CSS class "st-key-app_menu"
# The browser tab's icon, shipped with forgetlab and served by the app itself. A ":material/...:" page icon
# made the browser fetch that symbol from Google's font host (Streamlit 1.67 draws a Material favicon from
# fonts.gstatic.com); the menu's Material icons below are drawn with the font Streamlit bundles.
APP_ICON = Path(__file__).resolve().parent / "assets" / "icon.png"


@dataclass(frozen=True)
class PageSpec:
    """One page of the app: file stem under pages/, navigation title, icon, and its place in the menu."""

    stem: str
    title: str
    icon: str
    order: float = 0.0


MENU_NAME = "MENU"
"""Each page file declares its menu entry near its top as a literal: MENU = ("Title", ":material/icon:", order)."""


def page_spec(path: str | Path) -> PageSpec | None:
    """The menu entry a page file declares (`MENU = (title, icon, order)`, read without running the page), or
    None for a file that declares none (it is not a page of the menu)."""
    path = Path(path)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == MENU_NAME):
            try:
                title, icon, order = ast.literal_eval(node.value)
            except (ValueError, TypeError):
                return None
            return PageSpec(path.stem, str(title), str(icon), float(order))
    return None


def existing_pages(pages_dir: str | Path) -> list[PageSpec]:
    """The pages under `pages_dir` that declare a menu entry, in their declared order: a new page joins the
    menu by declaring its `MENU`, with no other file touched."""
    specs = [s for f in sorted(Path(pages_dir).glob("*.py")) if (s := page_spec(f)) is not None]
    return sorted(specs, key=lambda s: (s.order, s.stem))


def build_pages(pages_dir: str | Path) -> list:
    """One `st.Page` per existing page (the first is the default, served at "/"; the others at "/<stem>")."""
    root = Path(pages_dir)
    return [st.Page(str(root / f"{p.stem}.py"), title=p.title, icon=p.icon, url_path=p.stem, default=(i == 0))
            for i, p in enumerate(existing_pages(root))]


def require_app() -> None:
    """Call first thing in every page file: when Streamlit ran the page alone (its pre-`st.navigation` way of
    serving `pages/`, used until the first `st.navigation` call of the process), switch that off and rerun, so
    the session goes through app.py (menu, sidebar, layout) and lands on the same page. Otherwise a no-op."""
    if PagesManager is not None and getattr(PagesManager, "uses_pages_directory", False):
        PagesManager.uses_pages_directory = False      # what st.navigation itself does on its first call
        st.rerun()


def render_menu(pages: Sequence) -> None:
    """The app's menu: one `st.page_link` per page, in the active container (app.py: top of the sidebar).

    The current page is drawn highlighted by Streamlit. Nothing is drawn for a single page.
    """
    if len(pages) < 2:
        return
    with st.container(key=MENU_KEY):
        for page in pages:
            st.page_link(page, label=page.title, icon=page.icon)
    st.divider()


def page_header(title: str, caption: str | None = None) -> None:
    """What every page starts with: `require_app` (a page opened by its URL on a fresh server goes through app.py),
    then the page's title and the caption that says what it answers."""
    require_app()
    st.title(title)
    if caption:
        st.caption(caption)
