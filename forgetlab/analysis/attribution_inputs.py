"""What an attribution map reads (`forgetlab.analysis.attribution`), checked against the pool before any weight is
loaded: the level, the fine-tuned model, held-out text, the task and its evaluation pairs, the selection of
submodules and the α line. The map and its memory estimate (`attribution_memory`) both start here."""
from __future__ import annotations

from typing import Optional

from forgetlab.analysis.sweeps import check_swept_model, default_task
from forgetlab.core.anatomy import Anatomy
from forgetlab.core.errors import ParameterError, ProbeDataError, check_fraction

LEVELS = ("layer", "module", "head", "expert")
"""Attribution's levels; ``expert`` (each expert of each MoE layer) only for a mixture of experts."""


def check_level(level: str) -> str:
    """`level` if attribution offers it, else a ParameterError naming the levels."""
    if level not in LEVELS:
        hint = " (attn and mlp are parts of the 'module' level)" if level in ("attn", "mlp") else ""
        raise ParameterError(f"Attribution has no level {level!r}{hint}; choose one of {', '.join(LEVELS)}.")
    return level


def levels_of(pool) -> tuple[str, ...]:
    """The attribution levels the pool's architecture has: `LEVELS`, ``expert`` only for a mixture of experts;
    the whole list when the anatomy cannot be read (choosing a level then says why it is unavailable)."""
    try:
        experts = Anatomy.from_config(pool.config, names=()).num_experts
    except ParameterError:
        return LEVELS
    return LEVELS if experts else tuple(lv for lv in LEVELS if lv != "expert")


def check_pool_level(pool, level: str) -> None:
    """ParameterError when the pool's architecture lacks `level`: ``expert`` on a dense model, any per-part
    level on an architecture whose anatomy cannot be read (the anatomy's message)."""
    check_level(level)
    anatomy = Anatomy.from_config(pool.config, names=())
    if level in ("head", "expert"):
        anatomy.check_level(level)


def resolve_attribution(pool, model: str, task: Optional[str], level: str, select,
                        alphas) -> tuple[str, Optional[list[str]], list[float]]:
    """(task, selected submodules, α grid) of an attribution, checked against the pool: a fine-tuned model,
    held-out text, the task (guessed from the model's name when not given) and the level's selection."""
    check_level(level)
    check_swept_model(pool, model)
    check_pool_level(pool, level)
    if not pool.probes.general:
        raise ProbeDataError("Attribution needs held-out general text to measure generality; add "
                             "`probes: general:` to the pool file.")
    if task is None:
        task = default_task(pool, model)
        if task is None:
            raise ProbeDataError(f"Name the task whose speciality {model} should keep (--task); the pool's tasks "
                                 f"are: {', '.join(pool.task_names) or 'none (add probes: tasks: to the pool)'}.")
    if task not in pool.task_names:
        raise ProbeDataError(f"The pool has no probe data for task {task!r}; its tasks are: "
                             f"{', '.join(pool.task_names) or 'none'}. Add it under `probes: tasks:`.")
    if not pool.probes.tasks[task].eval:
        raise ProbeDataError(f"Task {task!r} has no evaluation pairs (its `eval:` split is empty); add some to "
                             "the pool's probe data.")
    sel = None
    if select is not None:
        sel = [str(s) for s in select]
        if not sel:
            raise ParameterError("The selection of submodules is empty; pick at least one, or pass none to map "
                                 "every submodule.")
    if alphas is None:
        grid: list[float] = []
    else:
        grid = [check_fraction("every alpha", a) for a in alphas]
        if not grid:
            raise ParameterError("The α line is empty; give values in [0, 1] (e.g. 0 0.5 1) or none for 0/1.")
    return task, sel, grid
