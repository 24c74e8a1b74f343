"""The verbs every analysis shares, so that the app, the CLI and scripts drive each one the same way:

    a = get("features")                   # or "attribution", "search", "taskvec", "textdiff"; "linearity" and the
                                          # sweeps ("sweep-alpha", …) come from forgetlab.analysis.base
    settings = a.settings(models=["base", "math"])
    a.check(settings, pool)               # ForgetlabError for bad settings, before any model is loaded
    result = a.run(pool, settings, progress, executor)
    path = a.save(result)                 # under the workspace's runs/ (recipe + results)
    again = a.load(path)
    saved = a.list()                      # SavedRuns of this analysis, newest first

Each analysis module registers one `Analysis` at its end; `get` imports the module on first use, so that
asking for one analysis does not import the others' dependencies.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from forgetlab.analysis.base import ANALYSES as MOVED
from forgetlab.core.errors import ParameterError, WorkspaceError
from forgetlab.core.workspace import list_runs, load_run

MODULES = {"linearity": "forgetlab.analysis.linearity",
           "features": "forgetlab.analysis.features", "attribution": "forgetlab.analysis.attribution",
           "search": "forgetlab.analysis.search", "taskvec": "forgetlab.analysis.taskvec",
           "textdiff": "forgetlab.analysis.textdiff"}


@dataclass(frozen=True)
class Analysis:
    """One analysis: its run kind, its settings dataclass and its five verbs.

    check(settings, pool=None) → None (checks needing the pool run only when it is given);
    run(pool, settings, progress=None, executor=None) → a result dataclass with `.to_frame()`;
    save(result, home_path=None) → Path; load(path) → result; list(home_path=None) → [SavedRun]."""

    kind: str
    settings: type
    check: Callable[..., None]
    run: Callable[..., Any]
    save: Callable[..., Any]
    load: Callable[..., Any]
    list: Callable[..., list]


ANALYSES: dict[str, Analysis] = {}


def register(analysis: Analysis) -> Analysis:
    """Add an analysis under its kind (once)."""
    if analysis.kind in ANALYSES and ANALYSES[analysis.kind] is not analysis:
        raise ParameterError(f"An analysis named {analysis.kind!r} is registered already.")
    ANALYSES[analysis.kind] = analysis
    return analysis


def get(kind: str) -> Analysis:
    """The analysis called `kind` (its module imported on first use), or a ParameterError naming the others.
    An analysis already moved onto forgetlab.analysis.base comes from its registry (this module goes once every
    analysis has moved)."""
    if kind in MOVED:
        return MOVED.get(kind)
    if kind not in ANALYSES and kind in MODULES:
        importlib.import_module(MODULES[kind])
    if kind not in ANALYSES:
        raise ParameterError(f"Unknown analysis {kind!r}; choose one of {', '.join(MODULES)}.")
    return ANALYSES[kind]


def settings_from(cls: type, values: Mapping[str, Any]) -> Any:
    """`cls(**values)` (a settings dataclass) with unknown names refused by name."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ParameterError(f"{cls.__name__} has no setting {', '.join(map(repr, unknown))}; its settings are "
                             f"{', '.join(sorted(known))}.")
    return cls(**values)


def options(settings: Any, names: Optional[set] = None) -> dict[str, Any]:
    """The settings dataclass as keyword arguments (only `names` when given), leaving out those still None so
    that the analysis' own defaults apply."""
    return {f.name: getattr(settings, f.name) for f in fields(settings)
            if getattr(settings, f.name) is not None and (names is None or f.name in names)}


def load_result(path, kind, cls: type, what: str):
    """The result saved under the workspace's runs/ at `path` (`cls.from_dict` of its results), refusing a run
    of another kind (`kind`: the run kind, or a function saying whether a kind fits) with a message naming
    `what` it should have been, and an unreadable one with what to do."""
    run = load_run(path)
    fits = kind(str(run.kind)) if callable(kind) else run.kind == kind
    if not fits:
        raise WorkspaceError(f"{path} holds a {run.kind} run, not {what}.")
    try:
        return cls.from_dict(run.results)
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkspaceError(f"The {what} in {path} is unreadable ({exc}); delete the folder or rerun it.") from None


def list_results(home_path, kind, **recipe) -> list:
    """Saved runs (`forgetlab.core.workspace.SavedRun`s, newest first) of `kind` (a run kind, or a function of
    it), optionally only those whose recipe has the given values (e.g. model="math"; None matches all)."""
    fits = kind if callable(kind) else (lambda k: k == kind)
    return [r for r in list_runs(home_path) if fits(str(r.kind))
            and all(v is None or r.recipe.get(k) == v for k, v in recipe.items())]


def pool_source(pool) -> Optional[str]:
    """What a saved run records as its pool: the pool file's absolute path, else the pool's name."""
    if pool is None:
        return None
    source = getattr(pool, "source", None)
    return str(Path(source).resolve()) if source else getattr(pool, "name", None)
