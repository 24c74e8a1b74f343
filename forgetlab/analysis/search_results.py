"""What a merge search (`forgetlab.analysis.search`) gives: every evaluated candidate (`SearchPoint`) and the
search as a whole (`SearchResult`: the best point, the recipe that reproduces it, the settings). Kept apart from
the search itself so that its figures (`forgetlab.plots.merge.search_figure`) and the Runs page read a saved
search without importing the search."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import pandas as pd

from forgetlab.analysis.measures import value_text
from forgetlab.core.evaluate import forgetting_text


@dataclass
class SearchPoint:
    """One evaluated candidate: the searched values (per model, then per block α), its measures and worker."""

    index: int
    values: list[float]
    alphas: Optional[list[float]] = None
    scalars: Optional[list[float]] = None      # the searched method-wide parameters (`SearchResult.scalar_names`)
    speciality: float = float("nan")
    answer_loss: float = float("nan")
    general_loss: float = float("nan")
    forgetting: float = float("nan")
    objective: float = float("inf")
    pareto: bool = False
    seconds: float = 0.0
    executor: str = "local"
    worker: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        """Every field, as saved in a run's results.json."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SearchPoint":
        """The point `to_dict` saved (fields an older run lacks keep their defaults)."""
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class SearchResult:
    """Every evaluated candidate of a merge search, the best one, and the recipe that reproduces it."""

    method: str
    param: Optional[str]
    models: list[str]
    objective: str
    measure: str
    max_forgetting: float
    forgetting_weight: float
    base_general_loss: float
    base_speciality: float
    points: list[SearchPoint] = field(default_factory=list)
    best: Optional[int] = None
    recipe: dict[str, Any] = field(default_factory=dict)        # the input recipe
    best_recipe: dict[str, Any] = field(default_factory=dict)   # the recipe with the best values
    settings: dict[str, Any] = field(default_factory=dict)      # budget, seed, sigma0, bounds, hma_blocks, task…
    executor: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    scalar_names: list[str] = field(default_factory=list)   # method-wide parameters searched (lines: alpha, beta)

    @property
    def best_point(self) -> Optional[SearchPoint]:
        """The point the objective chose (`best`), or None when no point could be evaluated."""
        return self.points[self.best] if self.best is not None else None

    def to_frame(self) -> pd.DataFrame:
        """One row per point: index, the values (`<param>:<model>`, `alpha_<b>`), speciality, answer_loss,
        general_loss, forgetting, objective, pareto, best, executor, worker_host, worker_pid, error."""
        rows = []
        for p in self.points:
            row: dict[str, Any] = {"index": p.index}
            for m, v in zip(self.models, p.values):
                row[f"{self.param}:{m}"] = v
            for name, v in zip(self.scalar_names, p.scalars or []):
                row[name] = v
            for b, a in enumerate(p.alphas or []):
                row[f"alpha_{b + 1}"] = a
            row.update(speciality=p.speciality, answer_loss=p.answer_loss, general_loss=p.general_loss,
                       forgetting=p.forgetting, objective=p.objective, pareto=p.pareto, best=p.index == self.best,
                       executor=p.executor, worker_host=p.worker.get("host"), worker_pid=p.worker.get("pid"),
                       error=p.error)
            rows.append(row)
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        """Every field, the points as dicts (a run's results.json)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["points"] = [p.to_dict() for p in self.points]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SearchResult":
        """The search `to_dict` saved."""
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        kw["points"] = [SearchPoint.from_dict(p) for p in d.get("points", [])]
        return cls(**kw)


def takeaway(result: SearchResult) -> list[str]:
    """The search in two sentences: the best merge found, its speciality beside the base's and its forgetting
    (general loss − the base's, nats), then whether it kept within the forgetting bound (objective
    `constrained`) or how it was chosen."""
    best = result.best_point
    if best is None:
        return []
    base = value_text(result.measure, result.base_speciality)
    first = (f"The best merge found (point {best.index} of {len(result.points)}) scores "
             f"{value_text(result.measure, best.speciality)} (the base: {base}) for {forgetting_text(best.forgetting)}"
             " of general loss.")
    if result.objective != "constrained":
        return [first, f"It is the point with the best speciality less {result.forgetting_weight:g} × its forgetting."]
    if best.forgetting <= result.max_forgetting:
        return [first, f"It keeps within the forgetting bound of {result.max_forgetting:g} nats."]
    return [first, f"No point kept within the forgetting bound of {result.max_forgetting:g} nats: this one forgets "
                   "least."]
