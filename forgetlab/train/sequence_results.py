"""What a task sequence produces: the scores after every stage of every chain (one chain per method: fine-tuning or
merging through the order), the score matrix R of each chain and its continual-learning metrics
(forgetlab.analysis.sequence_metrics, docs/methods.md#sequence-metrics).

`forgetlab.train.sequence` computes these; the sequence analysis saves and reopens them and
`forgetlab.plots.sequence` draws them. This module reads no weights.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional

import numpy as np
import pandas as pd

from forgetlab.analysis.measures import higher_is_better
from forgetlab.analysis.sequence_metrics import sequence_metrics

SCORES = ("exact_match", "answer_loss")
"""The two scores of R: exact match (higher is better) and answer loss (lower is better)."""

MATRIX_COLUMNS = ("method", "stage", "after_task", "task", "exact_match", "answer_loss", "general_loss",
                  "distance_to_base")
"""The columns of `SequenceResult.matrix_frame` (matrix.csv): one row per method, stage and task; stage 0 is the
base, and `after_task` the task its stage trained on (empty for the base)."""


@dataclass
class StageScores:
    """The model after one stage: every task's exact match and answer loss, the general held-out loss, D(θ, θ0) to
    the base and D to the previous stage's weights (0 and NaN for the base), and the stage's time in seconds."""

    stage: int
    after_task: Optional[str]
    exact_match: dict[str, float]
    answer_loss: dict[str, float]
    general_loss: float
    distance_to_base: float = 0.0
    distance_to_previous: float = math.nan
    seconds: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StageScores":
        """Rebuild one saved with `dataclasses.asdict`."""
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class SequenceChain:
    """One method through the whole order: its stages 1…T (`stages`), what each stage ran (`settings`), its time in
    seconds, `kind` "finetune" or "merge", and the worker that ran it."""

    method: str
    stages: list[StageScores]
    kind: str = "finetune"
    seconds: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    worker: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (round-trips through `from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SequenceChain":
        """Rebuild one saved with `to_dict`."""
        d = dict(d)
        d["stages"] = [StageScores.from_dict(s) for s in d.get("stages", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class SequenceResult:
    """A task sequence: the order, the base's scores (stage 0, shared by every chain), one chain per method, and
    the run's recipe (steps, learning rates, strengths, budgets, executor)."""

    order: list[str]
    base: StageScores
    chains: list[SequenceChain] = field(default_factory=list)
    recipe: dict[str, Any] = field(default_factory=dict)

    @property
    def methods(self) -> list[str]:
        """The chains' names, in order."""
        return [c.method for c in self.chains]

    def chain(self, method: str) -> SequenceChain:
        """The chain named `method` (KeyError naming the chains otherwise)."""
        for c in self.chains:
            if c.method == method:
                return c
        raise KeyError(f"no chain {method!r}; the chains are {', '.join(self.methods)}")

    def stages_of(self, method: str) -> list[StageScores]:
        """The base followed by the chain's stages: R's rows."""
        return [self.base, *self.chain(method).stages]

    def matrix(self, method: str, score: str = "exact_match") -> np.ndarray:
        """R of a chain for `score`: R[i, j] is task j's score after stage i (row 0: the base), shape (T + 1, T)."""
        return np.array([[getattr(s, score)[t] for t in self.order] for s in self.stages_of(method)], dtype=float)

    def matrix_frame(self) -> pd.DataFrame:
        """Every chain's scores, one row per method, stage and task (`MATRIX_COLUMNS`: matrix.csv)."""
        rows = []
        for c in self.chains:
            for s in self.stages_of(c.method):
                for t in self.order:
                    rows.append({"method": c.method, "stage": s.stage, "after_task": s.after_task or "", "task": t,
                                 "exact_match": s.exact_match[t], "answer_loss": s.answer_loss[t],
                                 "general_loss": s.general_loss, "distance_to_base": s.distance_to_base})
        return pd.DataFrame(rows, columns=list(MATRIX_COLUMNS))

    def stage_frame(self) -> pd.DataFrame:
        """One row per chain and stage (the base included): general loss, distances and seconds."""
        rows = []
        for c in self.chains:
            for s in self.stages_of(c.method):
                rows.append({"method": c.method, "stage": s.stage, "after_task": s.after_task or "",
                             "general_loss": s.general_loss, "distance_to_base": s.distance_to_base,
                             "distance_to_previous": s.distance_to_previous, "seconds": s.seconds})
        return pd.DataFrame(rows)

    def summary_frame(self) -> pd.DataFrame:
        """One row per method and score: OP, TRACE's and GEM's BWT, FWT and each task's forgetting (summary.csv;
        forgetting of the last task is empty: no later stage)."""
        rows = []
        for c in self.chains:
            for score in SCORES:
                m = sequence_metrics(self.matrix(c.method, score), higher_is_better(score))
                row = {"method": c.method, "score": score, "op": m.op, "bwt_trace": m.bwt_trace, "bwt_gem": m.bwt_gem,
                       "fwt": m.fwt}
                row.update({f"forgetting_{t}": f for t, f in zip(self.order, m.forgetting)})
                rows.append(row)
        return pd.DataFrame(rows)

    def retained_gain(self, method: str, task: Optional[str] = None, score: str = "exact_match") -> float:
        """The share of a task's gain that survives to the end: (R[T, j] − R[0, j]) / (R[j, j] − R[0, j]) for task j
        (default: the first of the order); NaN when its own stage gained nothing."""
        j = self.order.index(task or self.order[0])
        r = self.matrix(method, score)
        gain = r[j + 1, j] - r[0, j]
        if not higher_is_better(score):
            gain = -gain
        if not gain > 0:
            return math.nan
        kept = r[-1, j] - r[0, j]
        return float((kept if higher_is_better(score) else -kept) / gain)

    def to_frame(self) -> pd.DataFrame:
        """The summary (`summary_frame`): the results table the CLI prints and a saved run keeps."""
        return self.summary_frame()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (round-trips through `from_dict`)."""
        return {"order": list(self.order), "base": asdict(self.base), "chains": [c.to_dict() for c in self.chains],
                "recipe": dict(self.recipe)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SequenceResult":
        """Rebuild a result saved with `to_dict`."""
        return cls(order=list(d["order"]), base=StageScores.from_dict(d["base"]),
                   chains=[SequenceChain.from_dict(c) for c in d.get("chains", [])], recipe=dict(d.get("recipe", {})))
