"""The model pool of this browser session, cached across reruns, pages and sessions.

`get_pool()` builds `ModelPool.from_yaml(path)` once per (pool file path, modification time) with
st.cache_resource: switching pages or changing a widget never reloads the pool, and models loaded through
`pool.load(name)` stay cached inside it. Editing pool.yaml changes its mtime, so the next run reloads it.
A model whose files were deleted while the app held the pool is reported and the pool is rebuilt.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from forgetlab.core.errors import CheckpointError, ForgetlabError, WorkspaceError
from forgetlab.core.pool import ModelPool
from forgetlab.ui.errors import render_error
from forgetlab.ui.settings import pool_path

if TYPE_CHECKING:  # pragma: no cover
    from forgetlab.core.pool import ModelPool


@st.cache_resource(max_entries=4, show_spinner="Opening the model pool…")
def _load_pool(path: str, mtime: float) -> "ModelPool":
    """Build the pool from `path`; `mtime` is part of the cache key only (a changed file reloads)."""
    return ModelPool.from_yaml(path)


def _pool_mtime(path: str) -> float:
    p = Path(path)
    if not p.is_file():
        raise WorkspaceError(f"The pool file {p} does not exist. Pick another pool in the sidebar or "
                             "build the pico zoo from the Models page.")
    return p.stat().st_mtime


def missing_models(pool: "ModelPool") -> list[tuple[str, str]]:
    """`[(name, path)]` for the pool's models (base included) whose local folder or file is gone from disk.

    Hub ids (references that never were local paths) are not checked.
    """
    missing = []
    for name in ["base", *getattr(pool, "model_names", [])]:
        try:
            ref = pool.checkpoint(name).path
        except ForgetlabError as exc:
            missing.append((name, str(exc)))
            continue
        except Exception:  # noqa: BLE001 - anything unreadable counts as missing
            continue
        if ref is not None and not Path(str(ref)).exists():
            missing.append((name, str(ref)))
    return missing


def clear_pool_cache() -> None:
    """Forget every cached pool (and the models it holds); the next `get_pool()` rebuilds."""
    _load_pool.clear()


def load_pool_cached(path: str) -> "ModelPool":
    """The cached pool for `path` (raises ForgetlabError when the file is missing or malformed)."""
    return _load_pool(str(path), _pool_mtime(str(path)))


def get_pool(*, show: bool = True) -> "ModelPool | None":
    """The pool chosen in the sidebar, or None when there is none or it cannot be opened.

    With `show=True` a problem is drawn on the page (st.info when no pool is chosen, st.error with the
    message for a malformed pool file). A pool whose model files vanished is dropped from the cache, the
    user is told which model, and a fresh pool is built from the file as it is now.
    """
    path = pool_path()
    if not path:
        if show:
            st.info("No model pool yet: the pico demo zoo opens here as soon as its base model is built (the "
                    "app builds it by itself on a fresh workspace; `forgetlab zoo build` from the command line), "
                    "or enter the path of your own pool.yaml in the sidebar.")
        return None
    try:
        pool = load_pool_cached(path)
        gone = missing_models(pool)
        if gone:
            clear_pool_cache()
            names = ", ".join(f"{n} ({p})" for n, p in gone)
            raise CheckpointError(f"These models of the pool were removed from disk while the app held them: "
                                 f"{names}. Restore them or edit {path}; the pool was dropped from memory.")
        return pool
    except Exception as exc:  # noqa: BLE001 - the page must stay usable
        if show:
            render_error(exc)
        return None


def require_pool() -> "ModelPool":
    """`get_pool()`, stopping the page (st.stop) with the reason shown when there is no usable pool."""
    pool = get_pool(show=True)
    if pool is None:
        st.stop()
    return pool


def require_tasks(pool: "ModelPool", what: str) -> None:
    """Stop the page with a hint when the pool has no task with probe data, which `what` needs."""
    if not pool.task_names:
        st.info(f"The pool has no tasks, which {what} needs: add task files under `probes: tasks:` in the pool "
                "file.")
        st.stop()


def require_finetuned(pool: "ModelPool", purpose: str) -> None:
    """Stop the page with a hint when the pool has no fine-tuned model to `purpose` (e.g. "sweep")."""
    if not pool.model_names:
        st.info(f"The pool has no fine-tuned model to {purpose}. Add one to the pool file, or make one on the "
                "Fine-tune page.")
        st.stop()
