"""Task vectors: where in the network did fine-tuning move each model, and how alike are the moves?

For each chosen fine-tuned model, the norm of its task vector τ = θt − θ0 per layer and module (‖τ‖ and
‖τ‖/‖θ0‖), and the cosine similarity between the models' whole task vectors — streamed one tensor at a time
(the formulas: forgetlab.core.taskvectors; docs/methods.md#taskvec-stats).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import pandas as pd

from forgetlab.analysis.base import ANALYSES, Analysis, Output
from forgetlab.core.anatomy import part_words
from forgetlab.core.errors import ParameterError
from forgetlab.core.progress import Progress, scaled
from forgetlab.core.settings import setting
from forgetlab.core.taskvectors import CosineMatrix, TaskVectorNorms, cosine_matrix, task_vector_norms
from forgetlab.plots.models import cosine_heatmap, norms_heatmap


@dataclass
class TaskvecSettings:
    """Which task vectors to measure, and whether to compare them."""

    models: Optional[tuple[str, ...]] = setting(None, help="fine-tuned models whose task vectors to measure "
                                                           "(default: every fine-tuned model of the pool)")
    cosines: bool = setting(True, help="the cosine similarity between the task vectors (--no-cosines leaves it "
                                       "out)", flag="--no-cosines")


@dataclass
class TaskvecResult:
    """The norms of several task vectors and, optionally, their cosines."""

    norms: list[TaskVectorNorms]
    cosine: Optional[CosineMatrix] = None

    def by_level(self) -> pd.DataFrame:
        """model, layer, module, norm, relative: each model's norms per layer and module (layer −1: the tensors
        outside the layers)."""
        frames = [n.by_level().assign(model=n.model) for n in self.norms]
        columns = ["model", "layer", "module", "norm", "relative"]
        return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)

    def cosine_table(self) -> pd.DataFrame:
        """The cosine matrix as a table whose first column names the model of each row."""
        return self.cosine.to_frame().rename_axis("model").reset_index() if self.cosine else pd.DataFrame()

    def to_frame(self) -> pd.DataFrame:
        """One row per (model, tensor): the norms tables stacked."""
        frames = [n.to_frame().assign(model=n.model) for n in self.norms]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def to_dict(self) -> dict:
        """A JSON-ready dict (`from_dict` rebuilds it)."""
        return {"norms": [n.to_dict() for n in self.norms],
                "cosine": self.cosine.to_dict() if self.cosine is not None else None}

    @classmethod
    def from_dict(cls, d: Mapping) -> "TaskvecResult":
        """Rebuild a result saved with `to_dict`."""
        cos = d.get("cosine")
        return cls([TaskVectorNorms(n["model"], list(n.get("rows", []))) for n in d.get("norms", [])],
                   CosineMatrix(**cos) if cos else None)


def check(settings: TaskvecSettings, pool=None) -> None:
    """With the pool: every chosen model is one of its fine-tuned models, and it has some."""
    if pool is None:
        return
    pool.check_models(settings.models or ())
    if not pool.model_names:
        raise ParameterError("The pool has no fine-tuned models, so there are no task vectors to measure: add one "
                             "to the pool file.")


def compute(pool, settings: TaskvecSettings, progress: Progress = None, executor=None) -> TaskvecResult:
    """The norms of every chosen model's task vector, then (with `cosines`) the cosines between them."""
    models = list(settings.models or pool.model_names)
    steps = len(models) + (1 if settings.cosines else 0)
    norms = [task_vector_norms(pool, m, progress=scaled(progress, i / steps, (i + 1) / steps))
             for i, m in enumerate(models)]
    cos = cosine_matrix(pool, models, progress=scaled(progress, len(models) / steps, 1.0)) if settings.cosines \
        else None
    return TaskvecResult(norms, cos)


def figures(result: TaskvecResult) -> list:
    """A layer × module heatmap of ‖τ‖/‖θ0‖ per model, and the cosine matrix."""
    figs = [norms_heatmap(n.by_level(), "relative", title=f"{n.model}: ‖τ‖ / ‖θ0‖ per layer and module")
            for n in result.norms]
    cosine = cosine_heatmap(result.cosine, title="cosine similarity between task vectors") \
        if result.cosine is not None else None
    return figs + ([cosine] if cosine is not None else [])


def takeaway(result: TaskvecResult) -> list[str]:
    """The task vectors in two sentences: where fine-tuning moved the weights most — the (model, layer, module)
    with the largest relative norm ‖τ‖/‖θ0‖, in % — then, with the cosines of two models or more, the most and
    the least alike pair of task vectors (cosine similarity, 1 = the same direction, 0 = unrelated)."""
    table = result.by_level().dropna(subset=["relative"])
    if table.empty:
        return []
    top = table.loc[table["relative"].idxmax()]
    part = part_words(int(top["layer"]), str(top["module"]))
    lines = [f"Fine-tuning changed {top['model']} most in {part}: by {100 * float(top['relative']):.3g} % of the "
             "weights' size there (the norm of the change over the base's)."]
    cos = result.cosine
    pairs = [(cos.values[i][j], cos.models[i], cos.models[j]) for i in range(len(cos.models))
             for j in range(i + 1, len(cos.models)) if cos.values[i][j] == cos.values[i][j]] if cos else []
    if len(pairs) == 1:
        c, a, b = pairs[0]
        lines.append(f"The changes of {a} and {b} have a cosine similarity of {c:.3f} (1 = the same direction, "
                     "0 = unrelated).")
    elif pairs:
        (c1, a1, b1), (c2, a2, b2) = max(pairs), min(pairs)
        lines.append(f"The most alike changes are {a1}'s and {b1}'s (cosine similarity {c1:.3f}), the least alike "
                     f"{a2}'s and {b2}'s ({c2:.3f}; 1 = the same direction, 0 = unrelated).")
    return lines


def report(result: TaskvecResult) -> list:
    """The CLI's lines: the norms per level, then the cosine matrix."""
    lines: list = [result.by_level()]
    if result.cosine is not None:
        lines += ["", "cosine similarity between task vectors:", result.cosine_table()]
    return lines


ANALYSIS = ANALYSES.add("taskvec", Analysis(
    "taskvec", "task-vector norms", TaskvecSettings, compute, TaskvecResult,
    help="task-vector norms per layer/module and cosines between task vectors",
    description="Stream every fine-tuned model's task vector τ = θt − θ0 and report its norms per layer and "
                "module, and the cosine matrix.",
    checks=check, figures_fn=figures, table=TaskvecResult.by_level, report=report,
    takeaway_fn=takeaway,
    recipe=lambda r: {"models": [n.model for n in r.norms], "cosines": r.cosine is not None},
    outputs=(Output("--out", "CSV file for the per-level norms (the cosines go to <out>.cosine.csv)",
                    table=TaskvecResult.by_level, beside=((".cosine.csv", TaskvecResult.cosine_table),)),)))
