"""A study reproduces one table or figure of the five papers on the user's own pool, with the paper's claim beside
the measurement. Each study is an analysis on the home of every analysis (forgetlab.analysis.base): it is found in
`ANALYSES` as `study-NAME`, runs as `forgetlab study NAME POOL [options] [--out DIR]`, draws on the page where its
subject lives (forgetlab.ui.studies) and is saved to Runs like any other analysis.

A study module (forgetlab/analysis/studies/) declares, per study, its settings (fields declared once with
`forgetlab.core.settings.setting`), a `compute(pool, settings, progress, executor)` that returns the study's table
in the paper's form, a `figure(table)` drawn from that table alone (so a saved run redraws it), and a
`verdict(table, settings)` that measures the claim on the table (`Verdict`: the measurement in one line, whether
the claim holds, the reason where it does not). `study_analysis` wraps these into one `Analysis`:

    STUDY = study_analysis(StudyInfo(name="sfa-frequency", paper="SFA", artifact="Figure 3", page="finetune",
                                     claim="…", title="…"), SfaFrequencySettings, compute, figure, verdict,
                           singles=singles)

`singles(pool, settings)` lists the single runs a study is made of, so that bench/studies_cost.py can time a study
against them (the issue asks for ≤ 1.2× their cost): (analysis name, settings) for a run of a registered analysis
(`forgetlab finetune …`), or (label, job) for a command that is no analysis, `job(pool)` running it as the command
does (`forgetlab merge RECIPE OUT --eval`: ("merge --eval", job)).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import pandas as pd

from forgetlab.analysis.base import ANALYSES, Analysis, Output
from forgetlab.core.errors import ParameterError
from forgetlab.core.progress import Progress
from forgetlab.plots import figures_html

STUDY_PAGES = ("finetune", "merge", "linearity", "forgetting")
"""The pages a study can live on (forgetlab.ui.studies draws each page's studies)."""
GROUP_HELP = "reproduce a table or figure of the five papers on this pool (forgetlab study --list names them)"


@dataclass(frozen=True)
class StudyInfo:
    """What a study reproduces: its CLI name, the paper and its table or figure ("Table 5"), the paper's claim in
    one line, the app page it appears on (one of STUDY_PAGES) and what it computes in a few words."""

    name: str
    paper: str
    artifact: str
    claim: str
    page: str
    title: str

    def __post_init__(self):
        if self.page not in STUDY_PAGES:
            raise ParameterError(f"Study {self.name}: page must be one of {', '.join(STUDY_PAGES)}; got {self.page!r}.")


@dataclass(frozen=True)
class Verdict:
    """The claim measured on a study's table: the measurement in one line with its numbers, whether the claim
    holds there (None: the table cannot say, e.g. a model that learned nothing), and why not where it does not."""

    measured: str
    holds: Optional[bool]
    reason: str = ""

    @property
    def word(self) -> str:
        """"holds", "does not hold" or "undecided"."""
        return {True: "holds", False: "does not hold", None: "undecided"}[self.holds]


@dataclass
class StudyResult:
    """A study's table in the paper's form, its verdict, the settings it ran with and its wall time."""

    study: str
    table: pd.DataFrame
    verdict: Verdict
    recipe: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_frame(self) -> pd.DataFrame:
        """The study's table."""
        return self.table

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (round-trips through `from_dict`)."""
        return {"study": self.study, "table": self.table.to_dict(orient="split", index=False),
                "verdict": asdict(self.verdict), "recipe": self.recipe, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StudyResult":
        """Rebuild a result saved with `to_dict`."""
        t = d["table"]
        return cls(study=d["study"], table=pd.DataFrame(t["data"], columns=t["columns"]),
                   verdict=Verdict(**d["verdict"]), recipe=dict(d.get("recipe", {})),
                   seconds=float(d.get("seconds", 0.0)))


def study_analysis(info: StudyInfo, settings: type,
                   compute: Callable[[Any, Any, Progress, Any], pd.DataFrame],
                   figure: Callable[[pd.DataFrame], Any],
                   verdict: Callable[[pd.DataFrame, Any], Verdict], *,
                   checks: Optional[Callable[[Any, Any], None]] = None,
                   estimate: Optional[Callable[[Any, Any], Any]] = None,
                   singles: Optional[Callable[[Any, Any], list[tuple[str, Any]]]] = None,
                   points: bool = False, description: str = "") -> Analysis:
    """Declare one study (module docstring) as the analysis `study-NAME` and return it. `points`: its compute
    spreads its own runs over the executor (a study of several fine-tunes); otherwise a non-local executor runs it
    whole on one worker."""

    def run(pool, s, progress: Progress = None, executor=None) -> StudyResult:
        """The study's table on `pool`, measured against the claim."""
        start = time.perf_counter()
        table = compute(pool, s, progress, executor)
        return StudyResult(study=info.name, table=table, verdict=verdict(table, s), recipe=asdict(s),
                           seconds=round(time.perf_counter() - start, 2))

    def figures(result: StudyResult) -> list:
        return [figure(result.table)]

    def takeaway(result: StudyResult) -> list[str]:
        v = result.verdict
        why = f": {v.reason.rstrip('.')}." if v.reason else "."
        return [f"{info.paper}, {info.artifact}: {info.claim}",
                f"Measured here: {v.measured} The claim {v.word} on this pool{why}"]

    def report(result: StudyResult) -> list:
        return [f"{info.paper}, {info.artifact} — {info.title}", result.table]

    analysis = Analysis(
        f"study-{info.name}", info.title, settings, run, StudyResult, help=f"{info.paper} {info.artifact}: "
        f"{info.title}", description=description or f"{info.paper}, {info.artifact}: {info.title}. The paper's "
        f"claim: {info.claim}", command=("study", info.name), checks=checks, estimate_fn=estimate,
        figures_fn=figures, recipe=lambda r: {"study": r.study, **r.recipe}, report=report, points=points,
        group_help=GROUP_HELP, takeaway_fn=takeaway, study=info, singles=singles,
        outputs=(Output("--out", "write table.csv (the study's table) and figure.html (its figure, opens without a "
                                 "network) into this folder", metavar="DIR",
                        files=(("table.csv", StudyResult.to_frame),
                               ("figure.html", lambda r: figures_html(figures(r), title=f"{info.paper} "
                                                                                       f"{info.artifact}")))),))
    return ANALYSES.add(analysis.name, analysis)


def study_task(pool, task: Optional[str]) -> Optional[str]:
    """The task a study runs on: the given one, else the pool's first (None without a pool to ask)."""
    if task is not None or pool is None:
        return task
    if not pool.task_names:
        raise ParameterError(f"The pool {pool.name} has no tasks; add one under tasks: in its pool file (or build the "
                             "demo zoo: forgetlab zoo build).")
    return pool.task_names[0]


def studies(page: Optional[str] = None) -> list[Analysis]:
    """Every study (those of one app page when `page` is given), in the order of their names."""
    return [a for _, a in ANALYSES.items() if a.study is not None and (page is None or a.study.page == page)]


def study_names() -> list[str]:
    """Every study's CLI name (`forgetlab study --list`)."""
    return [a.study.name for a in studies()]
