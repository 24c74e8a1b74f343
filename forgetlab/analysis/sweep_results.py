"""What a forgetting sweep gives back: its points (`SweepPoint`: series, swept value, settings, scorecard,
D(θ, θ0), Pareto flag, the worker that computed it) and the sweep (`SweepResult`: the points so far, what was
swept, the recipe to redo it), as tables and as JSON that round-trips."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import pandas as pd

from forgetlab.analysis.measures import check_general_measure, check_measure, is_benchmark, pareto_front
from forgetlab.core.benchmarks import pick
from forgetlab.core.evaluate import Scorecard


@dataclass
class SweepPoint:
    """One evaluated model of a sweep: its series, swept value `x`, full settings, scorecard and D(θ, θ0)."""

    series: str
    x: float
    settings: dict[str, Any]
    scorecard: Scorecard
    distance: float
    pareto: bool = False
    seconds: float = 0.0
    executor: str = "local"
    worker: dict[str, Any] = field(default_factory=dict)   # {"host": ..., "pid": ...} of the computing process

    @property
    def general_loss(self) -> float:
        """Generality as held-out general-text loss (lower is better)."""
        return self.scorecard.general_loss

    def speciality(self, task: Optional[str] = None, measure: str = "exact_match") -> float:
        """Exact match on `task` (the mean over the pool's tasks when None), or with ``measure="answer_loss"``
        its answer-token loss (lower is better; see `MEASURES`), or a benchmark metric `TASK/METRIC`."""
        if check_measure(measure) == "answer_loss":
            return self.answer_loss(task)
        if is_benchmark(measure):
            return pick(self.scorecard.benchmarks, measure)
        if task is not None and task in self.scorecard.tasks:
            return self.scorecard.tasks[task].exact_match
        return self.scorecard.speciality(None)

    def generality(self, measure: str = "general_loss") -> float:
        """Held-out general loss (lower is better), or a benchmark metric `TASK/METRIC` (see `higher_is_better`)."""
        return self.general_loss if measure == "general_loss" else pick(self.scorecard.benchmarks, measure)

    def answer_loss(self, task: Optional[str] = None) -> float:
        """Answer-token loss on `task` (mean over tasks when None)."""
        tasks = self.scorecard.tasks
        if task is not None and task in tasks:
            return tasks[task].answer_loss
        return sum(t.answer_loss for t in tasks.values()) / max(1, len(tasks))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (round-trips through `from_dict`)."""
        return {"series": self.series, "x": self.x, "settings": self.settings,
                "scorecard": self.scorecard.to_dict(), "distance": self.distance, "pareto": self.pareto,
                "seconds": self.seconds, "executor": self.executor, "worker": dict(self.worker)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SweepPoint":
        """Rebuild an object saved with `to_dict`."""
        return cls(series=d["series"], x=float(d["x"]), settings=dict(d.get("settings", {})),
                   scorecard=Scorecard.from_dict(d["scorecard"]), distance=float(d["distance"]),
                   pareto=bool(d.get("pareto", False)), seconds=float(d.get("seconds", 0.0)),
                   executor=str(d.get("executor", "local")), worker=dict(d.get("worker") or {}))


@dataclass
class SweepResult:
    """A finished (or running) sweep: the points so far, what was swept, and the recipe to redo it.

    `task` is the task whose skill is the speciality axis (None: the mean over tasks), `measure` how that
    skill is measured (`MEASURES`: exact match ↑, or answer loss ↓, which also moves when exact match is
    still 0); `x_name` names the swept setting (alpha, ratio, density, mean_alpha).
    """

    kind: str
    model: str
    task: Optional[str]
    x_name: str
    points: list[SweepPoint] = field(default_factory=list)
    recipe: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    measure: str = "exact_match"
    general_measure: str = "general_loss"
    executor: dict[str, Any] = field(default_factory=dict)   # forgetlab.executors: name, driver, workers, notes
    failed: list[dict[str, Any]] = field(default_factory=list)   # points whose worker died twice (with the error)

    @property
    def series(self) -> list[str]:
        """Series names in order of first appearance."""
        return list(dict.fromkeys(p.series for p in self.points))

    def mark_pareto(self) -> list[bool]:
        """Set `pareto` on every point (front over all series together); returns the flags."""
        return pareto_front(self.points, task=self.task, measure=self.measure,
                            general_measure=self.general_measure)

    def to_frame(self) -> pd.DataFrame:
        """One row per point: series, x (and its named column), speciality (in `measure`), measure,
        answer_loss, general_loss, perplexity, distance, pareto, settings (JSON), then `<task>/exact_match` and
        `<task>/answer_loss`."""
        rows = []
        for p in self.points:
            row = {"kind": self.kind, "model": self.model, "series": p.series, "x": p.x, self.x_name: p.x,
                   "speciality": p.speciality(self.task, self.measure), "measure": self.measure,
                   "answer_loss": p.answer_loss(self.task),
                   "general_loss": p.general_loss, "perplexity": p.scorecard.perplexity,
                   "generality": p.generality(self.general_measure), "general_measure": self.general_measure,
                   "distance": p.distance, "pareto": p.pareto,
                   "settings": json.dumps(p.settings, sort_keys=True), "executor": p.executor,
                   "worker_host": p.worker.get("host"), "worker_pid": p.worker.get("pid")}
            for t in p.scorecard.tasks.values():
                row[f"{t.task}/exact_match"] = t.exact_match
                row[f"{t.task}/answer_loss"] = t.answer_loss
            for btask, metrics in p.scorecard.benchmarks.items():
                for metric, value in metrics.items():
                    row[f"{btask}/{metric}"] = value
            rows.append(row)
        if not rows:
            return pd.DataFrame(columns=["kind", "model", "series", "x", self.x_name, "speciality", "measure",
                                         "answer_loss", "general_loss", "perplexity", "distance", "pareto",
                                         "settings"])
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (round-trips through `from_dict`)."""
        return {"kind": self.kind, "model": self.model, "task": self.task, "x_name": self.x_name,
                "points": [p.to_dict() for p in self.points], "recipe": self.recipe, "seconds": self.seconds,
                "measure": self.measure, "general_measure": self.general_measure, "executor": self.executor,
                "failed": self.failed}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SweepResult":
        """Rebuild an object saved with `to_dict`."""
        return cls(kind=d["kind"], model=d["model"], task=d.get("task"), x_name=d["x_name"],
                   points=[SweepPoint.from_dict(p) for p in d.get("points", [])],
                   recipe=dict(d.get("recipe", {})), seconds=float(d.get("seconds", 0.0)),
                   measure=check_measure(d.get("measure", "exact_match")),
                   general_measure=check_general_measure(d.get("general_measure", "general_loss")),
                   executor=dict(d.get("executor") or {}), failed=list(d.get("failed") or []))
