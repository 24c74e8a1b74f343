"""The weights submodule-linearity merging would choose (`forgetlab slwm-weights`): the closed-form per-submodule
task weights of `slwm` (docs/methods.md#slwm; computed by `forgetlab.merge.methods.slwm.slwm_weights`, the merge
method's own function), as an analysis whose table (`SlwmWeights.to_frame`) the CLI prints and writes, saved and
reopened like any run."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from forgetlab.analysis.base import ANALYSES, Analysis
from forgetlab.core.anatomy import part_words
from forgetlab.core.errors import ParameterError
from forgetlab.core.progress import Progress
from forgetlab.core.settings import count_field, device_field, seed_field, setting
from forgetlab.merge.memory import estimate_slwm_weights
from forgetlab.merge.methods.slwm import (DEFAULT_LEVEL, DEFAULT_RIDGE, DEFAULT_SAMPLES, SLWM_LEVELS, SlwmWeights,
                                          slwm_weights)


@dataclass
class SlwmWeightsSettings:
    """Which weights to solve: one fine-tuned model per task (`models`, `tasks`; default: the pool's models named
    like its tasks), the submodules' `level`, the probe `samples` per task and the `ridge`."""

    models: Optional[tuple[str, ...]] = setting(None, help="fine-tuned models (default: those named like the tasks)")
    tasks: Optional[tuple[str, ...]] = setting(None, help="task of each model (default: the task named like the "
                                                          "model)")
    level: str = setting(DEFAULT_LEVEL, choices=SLWM_LEVELS,
                         help="the submodules weighted: each layer; its attention and its MLP; or each attention "
                              "head and the MLP")
    samples: Optional[int] = count_field(DEFAULT_SAMPLES, "probe samples per task")
    ridge: float = setting(DEFAULT_RIDGE, range=(0.0, None), help="ridge relative to tr(G)/T")
    seed: Optional[int] = seed_field("seed of the random draw of each task's probe samples (default: the first "
                                     "ones, no draw)", default=None)
    device: Optional[str] = device_field()


def check_settings(settings: SlwmWeightsSettings, pool=None) -> None:
    """What the declarations cannot say: with the pool, the models and tasks named exist, one task per model."""
    if pool is None:
        return
    pool.check_models(settings.models or ())
    pool.check_tasks(settings.tasks or ())
    if settings.models and settings.tasks and len(settings.models) != len(settings.tasks):
        raise ParameterError(f"{len(settings.models)} models but {len(settings.tasks)} tasks; give one task per "
                             "model.")


def compute(pool, settings: SlwmWeightsSettings, progress: Progress = None, executor=None) -> SlwmWeights:
    """`slwm_weights` on the pool with these settings."""
    models = list(settings.models) if settings.models else None
    tasks = list(settings.tasks) if settings.tasks else None
    return slwm_weights(pool, tasks, models=models, level=settings.level, samples=settings.samples,
                        ridge=settings.ridge, device=settings.device, seed=settings.seed, progress=progress)


def estimate(pool, settings: SlwmWeightsSettings):
    """slwm's prepare phase (`forgetlab.merge.memory.estimate_slwm_weights`)."""
    return estimate_slwm_weights(pool, settings.models, device=settings.device)


def recipe(result: SlwmWeights) -> dict:
    """What a saved run records (besides its pool): everything but the weights."""
    return {k: v for k, v in result.to_dict().items() if k != "submodules"}


def takeaway(result: SlwmWeights) -> list[str]:
    """The weights in one or two sentences: the largest weight (which task, which submodule; unitless, the factor
    on that task's change of that submodule in the merge) and each task's mean weight over the submodules; then
    how many submodules no task changed (they fall back to equal weights, 1/T)."""
    cells = [(float(w), t, s) for s in result.submodules for t, w in zip(result.tasks, s.weights)]
    cells = [c for c in cells if c[0] == c[0]]
    if not cells:
        return []
    w, task, sub = max(cells, key=lambda c: c[0])
    means = ", ".join(f"{t} {sum(float(s.weights[i]) for s in result.submodules) / len(result.submodules):.3f}"
                      for i, t in enumerate(result.tasks))
    where = part_words(sub.layer, sub.kind, sub.head if sub.kind == "head" else None)
    lines = [f"The largest weight is {task}'s in {where}: {w:.3f}; averaged over the {len(result.submodules)} "
             f"submodules the weights are {means}."]
    fallbacks = sum(bool(s.fallback) for s in result.submodules)
    if fallbacks:
        lines.append(f"{fallbacks} of {len(result.submodules)} submodules were changed by no task and take equal "
                     f"weights ({1 / len(result.tasks):.3f} each).")
    return lines


ANALYSIS = ANALYSES.add("slwm-weights", Analysis(
    "slwm-weights", "slwm weights", SlwmWeightsSettings, compute, SlwmWeights,
    help="the per-submodule task weights of submodule-linearity merging",
    description="Solve G a = b per submodule on the pool's probe data and print the weights (submodule × task). "
                "Merge with `forgetlab merge` and method slwm.",
    checks=check_settings, estimate_fn=estimate, recipe=recipe, takeaway_fn=takeaway))
