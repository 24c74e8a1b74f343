"""The task-vector analysis: the norms of each fine-tuned model's task vector per tensor and level, and the
cosines between them (the formulas: forgetlab.core.taskvectors)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import pandas as pd

from forgetlab.analysis.protocol import Analysis, list_results, load_result, pool_source, register
from forgetlab.core.errors import ForgetlabError, ParameterError
from forgetlab.core.progress import Progress, scaled
from forgetlab.core.taskvectors import CosineMatrix, TaskVectorNorms, cosine_matrix, task_vector_norms


# ------------------------------------------------------------------------------------------ the verbs


@dataclass
class TaskvecSettings:
    """Which task vectors to measure: the norms of each of `models` (default: every fine-tuned model of the
    pool) and, with `cosines`, the cosine matrix between them."""

    models: Optional[Sequence[str]] = None
    cosines: bool = True


@dataclass
class TaskvecResult:
    """The norms of several task vectors and, optionally, their cosines."""

    norms: list[TaskVectorNorms]
    cosine: Optional[CosineMatrix] = None

    def to_frame(self) -> pd.DataFrame:
        """One row per (model, tensor): the norms tables stacked."""
        frames = [n.to_frame().assign(model=n.model) for n in self.norms]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def to_dict(self) -> dict:
        return {"norms": [n.to_dict() for n in self.norms],
                "cosine": self.cosine.to_dict() if self.cosine is not None else None}

    @classmethod
    def from_dict(cls, d: Mapping) -> "TaskvecResult":
        """Rebuild an object saved with `to_dict`."""
        cos = d.get("cosine")
        return cls([TaskVectorNorms(n["model"], list(n.get("rows", []))) for n in d.get("norms", [])],
                   CosineMatrix(**cos) if cos else None)


def check_settings(settings: TaskvecSettings, pool=None) -> None:
    """Refuse an empty or unknown choice of models (with the pool) without reading a tensor."""
    if settings.models is not None and not list(settings.models):
        raise ParameterError("Choose at least one fine-tuned model whose task vector to measure.")
    if pool is not None:
        missing = [m for m in (settings.models or []) if m not in pool.model_names]
        if missing:
            raise ParameterError(f"The pool has no fine-tuned model {missing[0]!r}; its models are: "
                                 f"{', '.join(pool.model_names) or 'none'}.")
        if settings.models is None and not pool.model_names:
            raise ForgetlabError("The pool has no fine-tuned models, so there are no task vectors to measure.")


def run_settings(pool, settings: TaskvecSettings, progress: Progress = None, executor=None) -> TaskvecResult:
    """`task_vector_norms` of every chosen model, then `cosine_matrix` (streamed; `executor` is not used)."""
    models = list(settings.models if settings.models is not None else pool.model_names)
    steps = len(models) + (1 if settings.cosines else 0)
    norms = [task_vector_norms(pool, m, progress=scaled(progress, i / steps, (i + 1) / steps))
             for i, m in enumerate(models)]
    cos = cosine_matrix(pool, models, progress=scaled(progress, len(models) / steps, 1.0)) if settings.cosines else None
    return TaskvecResult(norms, cos)


def save_taskvec(result: TaskvecResult, home_path=None, pool=None) -> Path:
    """Save task-vector norms (and cosines) under the workspace's runs/ (kind `taskvec`)."""
    from forgetlab.core.workspace import save_run

    recipe = {"pool": pool_source(pool), "models": [n.model for n in result.norms],
              "cosines": result.cosine is not None}
    return save_run("taskvec", recipe, result.to_dict(), frame=result.to_frame(), home_path=home_path)


def load_taskvec(path) -> TaskvecResult:
    """Reopen task-vector norms saved by `save_taskvec`."""
    return load_result(path, "taskvec", TaskvecResult, "task-vector norms")


def list_taskvec(home_path=None) -> list:
    """Saved task-vector runs (`forgetlab.core.workspace.SavedRun`s, newest first)."""
    return list_results(home_path, "taskvec")


ANALYSIS = register(Analysis("taskvec", TaskvecSettings, check_settings, run_settings, save_taskvec, load_taskvec,
                             list_taskvec))
