"""The workspace: where forgetlab keeps zoo models, merges and saved runs.

`FORGETLAB_HOME` (default `~/.forgetlab`) holds `zoo/<preset>/`, `merges/<name>/` and `runs/<id>/`. A run is
saved as `recipe.json` (what was asked, with seed and versions) plus its results (`results.json` and, for
tabular results, `results.csv`), written atomically.
"""
from __future__ import annotations

import contextvars
import json
import os
import platform
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import transformers

import forgetlab
from forgetlab.core.errors import WorkspaceError
from forgetlab.core.memory import recorded_peak
from forgetlab.core.outputs import atomic_output_dir, check_name, missing_dirs, removed_if_failed


_SESSION_HOME: contextvars.ContextVar[Path | None] = contextvars.ContextVar("forgetlab_home", default=None)


def home(path: str | Path | None = None) -> Path:
    """The workspace folder: `path` if given, else this context's workspace (`use_home`: the app's session),
    else `$FORGETLAB_HOME`, else `~/.forgetlab`."""
    if path is not None:
        return Path(path).expanduser()
    session = _SESSION_HOME.get()
    if session is not None:
        return session
    return Path(os.environ.get("FORGETLAB_HOME", "~/.forgetlab")).expanduser()


def use_home(path: str | Path | None) -> None:
    """Make `path` the workspace of the current context (a thread and what it starts with a copied context:
    one app session and its jobs), leaving other sessions and the process environment alone; None goes back
    to FORGETLAB_HOME."""
    _SESSION_HOME.set(None if path is None else Path(path).expanduser())


def _sub(name: str, path: str | Path | None) -> Path:
    return home(path) / name


def zoo_dir(path: str | Path | None = None) -> Path:
    """`<home>/zoo`: the demo zoo presets."""
    return _sub("zoo", path)


def merges_dir(path: str | Path | None = None) -> Path:
    """`<home>/merges`: merged models (HF folders with recipe.yaml)."""
    return _sub("merges", path)


def runs_dir(path: str | Path | None = None) -> Path:
    """`<home>/runs`: saved analyses, sweeps and fine-tunes."""
    return _sub("runs", path)


def ensure_writable(folder: Path) -> Path:
    """Create `folder` if needed and check that files can be written in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError as exc:
        raise WorkspaceError(
            f"The workspace folder {folder} is not writable ({exc.strerror or exc}). "
            "Set FORGETLAB_HOME to a folder you can write, or fix its permissions."
        ) from None
    return folder


def versions() -> dict[str, str]:
    """Versions of forgetlab and the packages that decide its numbers (for recipes)."""
    return {
        "forgetlab": forgetlab.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


@dataclass
class SavedRun:
    """A run saved under `runs/<id>/`: its kind, recipe, results and (if tabular) results frame."""

    path: Path
    kind: str
    recipe: dict[str, Any]
    results: Any
    created: float

    @property
    def id(self) -> str:
        return self.path.name

    def frame(self) -> pd.DataFrame | None:
        """The results table (results.csv) if the run saved one."""
        csv = self.path / "results.csv"
        return pd.read_csv(csv) if csv.exists() else None


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"cannot save {type(obj).__name__} as JSON")


def save_run(kind: str, recipe: dict[str, Any], results: Any, *, frame: pd.DataFrame | None = None,
             home_path: str | Path | None = None, run_id: str | None = None) -> Path:
    """Save a run atomically as `runs/<id>/{recipe.json, results.json[, results.csv]}`; returns its folder.

    `results` must be JSON-serialisable or have `.to_dict()`; `frame` (or `results.to_frame()` when it
    exists) is saved as CSV too.
    """
    rid = check_name(run_id, "run id") if run_id else (time.strftime("%Y%m%d-%H%M%S-") + f"{kind}-"
                                                       + uuid.uuid4().hex[:6])
    with removed_if_failed(missing_dirs(runs_dir(home_path))):
        root = ensure_writable(runs_dir(home_path))
        final = root / rid
        if final.exists():
            raise WorkspaceError(f"A run named {rid} exists already in {root}; choose another id.")
        _write_run(final, kind, recipe, results, frame)
    return final


def _write_run(final: Path, kind: str, recipe: dict[str, Any], results: Any, frame: pd.DataFrame | None) -> None:
    with atomic_output_dir(final, kind="run") as tmp:  # a full disk is a message and leaves nothing

        full_recipe = {"kind": kind, "created": time.time(), "versions": versions(), **recipe}
        peak = recorded_peak()                      # measured by the CLI's or the app's `recording` block
        if peak is not None and "memory" not in full_recipe:
            full_recipe["memory"] = peak
        (tmp / "recipe.json").write_text(json.dumps(full_recipe, indent=2, default=_json_default))
        (tmp / "results.json").write_text(json.dumps(results, indent=2, default=_json_default))
        if frame is None and hasattr(results, "to_frame"):
            frame = results.to_frame()
        if frame is not None:
            frame.to_csv(tmp / "results.csv", index=False)


def load_run(path: str | Path) -> SavedRun:
    """Reopen a run saved by `save_run`."""
    p = Path(path)
    try:
        recipe = json.loads((p / "recipe.json").read_text())
        results = json.loads((p / "results.json").read_text())
    except FileNotFoundError:
        raise WorkspaceError(f"{p} is not a saved run (no recipe.json/results.json).") from None
    except json.JSONDecodeError as exc:
        raise WorkspaceError(f"The run in {p} is unreadable ({exc}); delete the folder or restore it.") from None
    return SavedRun(path=p, kind=recipe.get("kind", "unknown"), recipe=recipe, results=results,
                    created=float(recipe.get("created", p.stat().st_mtime)))


def list_runs(home_path: str | Path | None = None, kind: str | None = None) -> list[SavedRun]:
    """Every readable run under `runs/` (newest first), optionally of one kind; skips temporary folders."""
    root = runs_dir(home_path)
    out: list[SavedRun] = []
    if not root.is_dir():
        return out
    for p in root.iterdir():
        if not p.is_dir() or p.name.startswith("."):
            continue
        try:
            run = load_run(p)
        except WorkspaceError:
            continue
        if kind is None or run.kind == kind:
            out.append(run)
    return sorted(out, key=lambda r: r.created, reverse=True)


def list_merges(home_path: str | Path | None = None) -> list[Path]:
    """Merged model folders under `merges/` that are complete (have recipe.yaml)."""
    root = merges_dir(home_path)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                  and (p / "recipe.yaml").exists())
