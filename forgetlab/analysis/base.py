"""An analysis is one object: its settings, its checks, its memory estimate, its run, its saved runs and its
figures — so that the CLI, the app's panel, Ray and the Runs page all drive every analysis the same way.

    a = ANALYSES.get("linearity")
    settings = a.settings(task="math", samples=8)   # fields declared once (forgetlab.core.settings.setting)
    a.check(settings, pool)                         # ForgetlabError for bad settings, before any model loads
    a.estimate(pool, settings)                      # MemoryEstimate (or None where the job has none)
    result = a.run(pool, settings, progress, executor)
    path = a.save(result, pool=pool)                # under the workspace's runs/, kind = a.name
    again = a.load(path); a.list(); a.figures(result)

`ANALYSES` finds each analysis in the modules of `forgetlab.analysis` (forgetlab.core.registry): a module
declares its analysis with `ANALYSES.add(Analysis(...))` beside the code it runs, and nothing else has to import
it. The CLI makes one command per analysis from its settings (forgetlab.commands.generated), the app draws it
with one panel (forgetlab.ui.panel), and Runs reopens a saved run through `load` and `figures`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

import pandas as pd

from forgetlab.core.errors import ParameterError, WorkspaceError
from forgetlab.core.memory import with_free
from forgetlab.core.progress import Progress
from forgetlab.core.registry import Registry
from forgetlab.core.settings import check_values, settings_fields, settings_from
from forgetlab.core.workspace import SavedRun, list_runs, load_run, save_run
from forgetlab.executors import ExecutorError, PoolWorkerFactory, make_executor


def pool_source(pool) -> Optional[str]:
    """What a saved run records as its pool: the pool file's absolute path, else the pool's name."""
    if pool is None:
        return None
    source = getattr(pool, "source", None)
    return str(Path(source).resolve()) if source else getattr(pool, "name", None)


@dataclass(frozen=True)
class Output:
    """An extra file the CLI can write from a result: its flag (`--curves`), what it holds, and either the table
    (`table(result)`, written as CSV or JSON) or the text (`text(result)`, e.g. a recipe's YAML; None: nothing to
    write). An output whose flag is `--out` takes the place of the results table's `--out`. `beside` adds tables
    written next to that file (`beside_paths`). An output with `files` names a folder instead (`--out DIR`) and
    writes each (file name, function) pair into it: a returned table as CSV, a returned text as it is."""

    flag: str
    help: str
    table: Optional[Callable[[Any], pd.DataFrame]] = None
    text: Optional[Callable[[Any], Optional[str]]] = None
    metavar: Optional[str] = None
    beside: tuple[tuple[str, Callable[[Any], pd.DataFrame]], ...] = ()
    files: tuple[tuple[str, Callable[[Any], "pd.DataFrame | str"]], ...] = ()

    @property
    def folder(self) -> bool:
        """Whether the output is a folder of `files`."""
        return bool(self.files)

    @property
    def dest(self) -> str:
        """The parsed arguments' attribute that holds its path (`out_folder` for a folder named by `--out`)."""
        name = self.flag.lstrip("-").replace("-", "_")
        return f"{name}_folder" if self.folder else name

    def beside_paths(self, path: str | Path) -> list[tuple[Path, Callable[[Any], pd.DataFrame]]]:
        """The files written next to `path` and their tables: `beside` holds (ending, table) pairs, and the file
        is `path`'s name without its suffix followed by the ending (norms.csv, ".cosine.csv" → norms.cosine.csv;
        only the file name's suffix counts, never a dot in a folder's name)."""
        p = Path(path)
        stem = p.stem if p.suffix else p.name
        return [(p.with_name(f"{stem}{ending}"), table) for ending, table in self.beside]


@dataclass(frozen=True)
class Analysis:
    """One analysis (module docstring). Its fields:

    name: the registry name, the kind its saved runs carry and (with '-' as a space) its CLI command;
    title: what it computes, in a few words ("non-linearity scores");
    settings: its settings dataclass, every field declared with `forgetlab.core.settings.setting`;
    compute(pool, settings, progress, executor) -> result: the job itself;
    result: the result class (`to_dict`, `from_dict`, `to_frame`);
    help / description: the CLI's one line and its longer text;
    command: the CLI words when they are not the name split at '-' (e.g. ("sweep", "alpha"));
    checks(settings, pool_or_None): what the declared ranges cannot say (names in the pool, grids);
    estimate(pool, settings) -> MemoryEstimate: the job's peak before it starts;
    figures(result) -> [go.Figure]: its charts (the page's, the Runs page's);
    compare(results, ids) -> [go.Figure]: several saved runs of it on shared charts (Runs);
    recipe(result) -> dict: what its saved run records besides the pool;
    table(result) -> DataFrame: its results table (default `result.to_frame()`);
    saved_table(result) -> DataFrame: the table a saved run keeps as results.csv, where it is not `table` (e.g. a
    summary beside the long table `--out` writes);
    to_saved(result) -> dict: what results.json holds (default `result.to_dict()`), and from_saved(SavedRun) ->
    result: the result of a saved run (default `result.from_dict(run.results)`), for a result that keeps part of
    itself beside results.json (a token table in results.csv);
    report(result) -> lines or tables: what the CLI prints; report_settings: it is `report(result, settings)`
    (what the CLI prints depends on a setting, e.g. how many rows a table shows);
    measured: its figures and comparison take the speciality measure the app shows ("exact_match" or
    "answer_loss"): `figures_fn(result, measure)`, `compare_fn(results, ids, measure)`;
    outputs: extra files the CLI writes (`Output`);
    points: True when `compute` spreads its own points over the executor (sweeps, searches); otherwise a
    non-local executor runs the whole analysis as one item on a worker;
    kinds: the saved kinds it reopens, when older runs were saved under other names;
    pool_arg: how the CLI takes the pool: "positional" (POOL) or "option" (`--pool`, after a positional
    setting such as a recipe); pool_help: what the CLI's help says the pool is for;
    group_help: the help of the first CLI word when several analyses share it (`forgetlab sweep`);
    status(result) -> int: the CLI's exit status for a finished result (default 0);
    takeaway(result) -> [str]: one or two plain sentences built from the result — its largest effect, with the
    number and its unit — that the app shows above the charts and the CLI prints after the table;
    study: for a study of a paper's table or figure (forgetlab.analysis.study), what it reproduces and its page;
    singles(pool, settings) -> [(analysis name, settings) or (label, job(pool))]: the single runs a study is made
    of (bench/studies_cost.py)."""

    name: str
    title: str
    settings: type
    compute: Callable[..., Any]
    result: type
    help: str
    description: str = ""
    command: tuple[str, ...] = ()
    checks: Optional[Callable[[Any, Any], None]] = None
    estimate_fn: Optional[Callable[[Any, Any], Any]] = None
    figures_fn: Optional[Callable[[Any], list]] = None
    compare_fn: Optional[Callable[[list, list], list]] = None
    recipe: Optional[Callable[[Any], dict]] = None
    table: Optional[Callable[[Any], pd.DataFrame]] = None
    saved_table: Optional[Callable[[Any], pd.DataFrame]] = None
    to_saved: Optional[Callable[[Any], dict]] = None
    from_saved: Optional[Callable[[SavedRun], Any]] = None
    report: Optional[Callable[..., Iterable[Any]]] = None
    report_settings: bool = False
    measured: bool = False
    outputs: tuple[Output, ...] = ()
    points: bool = False
    kinds: tuple[str, ...] = ()
    pool_arg: str = "positional"
    pool_help: str = ""
    group_help: str = ""
    status: Optional[Callable[[Any], int]] = None
    takeaway_fn: Optional[Callable[[Any], Iterable[str]]] = None
    study: Any = None
    singles: Optional[Callable[[Any, Any], list]] = None

    # -------------------------------------------------------------------------------------------- settings

    @property
    def kind(self) -> str:
        """The kind its saved runs carry (its name)."""
        return self.name

    @property
    def words(self) -> tuple[str, ...]:
        """The CLI command's words (`forgetlab sweep alpha …`)."""
        return self.command or (self.name,)

    def make_settings(self, **values: Any) -> Any:
        """A settings instance from keyword values (unknown names refused by name)."""
        return settings_from(self.settings, values)

    def check(self, settings: Any, pool=None) -> None:
        """Refuse bad settings with a message naming the setting and the fix, before any model is loaded: the
        declared types and ranges, then the analysis' own checks (with the pool, the names in it)."""
        if not isinstance(settings, self.settings):
            raise ParameterError(f"{self.name} takes {self.settings.__name__}; got {type(settings).__name__}.")
        check_values(settings)
        if self.checks is not None:
            self.checks(settings, pool)

    def estimate(self, pool, settings: Any):
        """The job's memory estimate (`forgetlab.core.memory.MemoryEstimate`), or None where it has none."""
        return None if self.estimate_fn is None else with_free(self.estimate_fn(pool, settings))

    # -------------------------------------------------------------------------------------------- running

    def run(self, pool, settings: Any, progress: Progress = None, executor=None) -> Any:
        """The result of these settings on `pool`. With a non-local executor, an analysis whose points run on it
        (`points`) hands it the points; any other runs whole on one of its workers."""
        self.check(settings, pool)
        if executor is None or getattr(executor, "name", "local") == "local" or self.points:
            return self.compute(pool, settings, progress, executor)
        outcome = make_executor(executor).map(WholeRun(pool, self.name), [settings], progress=progress)[0]
        if not outcome.ok:
            raise ExecutorError(f"{self.title} failed on its worker: {outcome.error}")
        return outcome.value

    # -------------------------------------------------------------------------------------------- saved runs

    def save(self, result: Any, *, pool=None, home_path: str | Path | None = None) -> Path:
        """Save a result under the workspace's runs/ (kind = `name`): its recipe, `to_dict()` (or `to_saved`) and
        its table (or `saved_table`)."""
        recipe = {"pool": pool_source(pool), **(self.recipe(result) if self.recipe else {})}
        results = self.to_saved(result) if self.to_saved is not None else result.to_dict()
        frame = self.saved_table(result) if self.saved_table is not None else self.frame(result)
        return save_run(self.name, recipe, results, frame=frame, home_path=home_path)

    def fits_kind(self, kind: str) -> bool:
        """Whether a saved run of `kind` is one of this analysis."""
        return kind == self.name or kind in self.kinds

    def load(self, path: str | Path) -> Any:
        """The result saved at `path`; a run of another kind, or one that cannot be read, is refused by name."""
        run = load_run(path)
        if not self.fits_kind(str(run.kind)):
            raise WorkspaceError(f"{path} holds a {run.kind} run, not {self.title}.")
        try:
            return self.from_saved(run) if self.from_saved is not None else self.result.from_dict(run.results)
        except (KeyError, TypeError, ValueError) as exc:
            raise WorkspaceError(f"The {self.title} in {path} is unreadable ({exc}); delete the folder or rerun "
                                 "it.") from None

    def list(self, home_path: str | Path | None = None, **recipe: Any) -> list[SavedRun]:
        """Saved runs of this analysis, newest first; `recipe` keeps those whose recipe has these values
        (None matches all)."""
        return [r for r in list_runs(home_path) if self.fits_kind(str(r.kind))
                and all(v is None or r.recipe.get(k) == v for k, v in recipe.items())]

    # -------------------------------------------------------------------------------------------- showing

    def frame(self, result: Any) -> pd.DataFrame:
        """The result's table (what --out and results.csv hold)."""
        return self.table(result) if self.table is not None else result.to_frame()

    def figures(self, result: Any, measure: Optional[str] = None) -> list:
        """The result's charts (speciality in `measure` where the analysis is `measured` and one is given)."""
        if self.figures_fn is None:
            return []
        return list(self.figures_fn(result, measure) if self.measured and measure else self.figures_fn(result))

    def compare(self, results: list, ids: list[str], measure: Optional[str] = None) -> list:
        """Several results on shared charts (one series per run), or [] where the analysis has no comparison
        (speciality in `measure` as for `figures`)."""
        if self.compare_fn is None:
            return []
        return list(self.compare_fn(results, ids, measure) if self.measured and measure
                    else self.compare_fn(results, ids))

    def exit_status(self, result: Any) -> int:
        """The CLI's exit status for a finished result (e.g. 1 when some points failed)."""
        return int(self.status(result)) if self.status is not None else 0

    def takeaway(self, result: Any) -> list[str]:
        """What the result means in one or two sentences with their numbers and units ([] where the analysis
        has no takeaway yet)."""
        return [] if self.takeaway_fn is None else [line for line in self.takeaway_fn(result) if line]

    def lines(self, result: Any, settings: Any = None) -> list:
        """What the CLI prints for a result (run with `settings`): text lines and tables, in order."""
        if self.report is None:
            return [self.frame(result)]
        return list(self.report(result, settings) if self.report_settings else self.report(result))


class WholeRun(PoolWorkerFactory):
    """A worker that runs one analysis whole (the item is its settings), for an analysis without points of its
    own: `forgetlab ANALYSIS … --executor ray` runs it on a Ray worker that opens the pool there."""

    def build(self, pool):
        name = self.args[0]

        def state(settings, progress=None):
            return ANALYSES.get(name).compute(pool, settings, progress, None)

        return state


ANALYSES: Registry[Analysis] = Registry("analysis", "forgetlab.analysis")
"""Every analysis, by name (discovered in forgetlab.analysis)."""


def analysis_for_kind(kind: str) -> Optional[Analysis]:
    """The analysis whose saved runs carry `kind`, or None (a run of a job that is not an analysis)."""
    found = ANALYSES.find(kind)
    if found is not None:
        return found
    return next((a for _, a in ANALYSES.items() if a.fits_kind(kind)), None)


def values_of(settings: Any) -> dict[str, Any]:
    """The settings as a plain dict (for recipes and job keys)."""
    return asdict(settings)


def with_values(settings: Any, **values: Any) -> Any:
    """A copy of `settings` with some fields changed (unknown names refused)."""
    known = {f.name for f in fields(settings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ParameterError(f"{type(settings).__name__} has no setting {', '.join(map(repr, unknown))}.")
    return replace(settings, **values)


def declared(settings_cls: type) -> Mapping[str, Any]:
    """Field name → default of the declared settings (what a page starts its widgets from)."""
    return {f.name: f.default for f in settings_fields(settings_cls)}
