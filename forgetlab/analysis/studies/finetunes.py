"""What the studies made of fine-tunes share (MoFO's tables and figures, SFA's p curve): their common settings — the
task, the budget (the pool's own fine-tune recipe where left out, as `forgetlab finetune` reads it), how often
each run records, the scoring budget, where they run — the runs on equal footing (`run_configs`, through
`forgetlab.train.runs.compare`, one run per executor worker), their final table (`runs_table`) and the single
`forgetlab finetune` runs a study stands for (`finetune_singles`, for bench/studies_cost.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import pandas as pd

from forgetlab.analysis.finetune import FinetuneSettings
from forgetlab.analysis.study import study_task
from forgetlab.core.errors import ParameterError
from forgetlab.core.progress import Progress
from forgetlab.core.settings import count_field, device_field, dtype_field, seed_field, setting
from forgetlab.train.defaults import finetune_defaults
from forgetlab.train.memory import estimate_finetune
from forgetlab.train.results import FinetuneComparison, FinetuneConfig
from forgetlab.train.runs import check_start, compare

POOL_BUDGET = " (default: the pool's own fine-tune recipe of the task, as `forgetlab finetune` reads it)"
RUN_COLUMNS = ["label", "optimizer", "speciality", "answer_loss", "general_loss", "forgetting", "distance", "moved",
               "seconds"]


@dataclass
class FinetuneStudySettings:
    """The settings every fine-tune study shares: the task, each run's budget, how often it records, the scoring
    budget and where it runs."""

    task: Optional[str] = setting(None, help="the task to fine-tune on (its train split; default: the pool's first "
                                             "task)")
    steps: Optional[int] = count_field(None, "training steps of each run" + POOL_BUDGET)
    batch_size: Optional[int] = count_field(None, "training batch size" + POOL_BUDGET)
    lr: Optional[float] = setting(None, help="peak learning rate" + POOL_BUDGET, label="learning rate",
                                  range=(0.0, None))
    warmup: Optional[int] = setting(None, help="warm-up steps" + POOL_BUDGET, range=(0, None), cli_type="number")
    seed: int = seed_field("seed of the batch order (the same batches for every run)")
    eval_every: Optional[int] = count_field(None, "record every k steps (default: only the final model is scored)",
                                            label="record every k steps")
    max_general: Optional[int] = count_field(None, "at most this many general-text blocks")
    max_task: Optional[int] = count_field(None, "at most this many eval pairs per task")
    max_train: Optional[int] = count_field(None, "at most this many training pairs")
    max_length: int = setting(256, help="training sequence length: the tokens kept of each training pair",
                              range=(2, None), label="training sequence length")
    device: Optional[str] = device_field(default_cuda=True)
    dtype: Optional[str] = dtype_field("the weights, gradients and optimizer state")


def with_task(pool, settings):
    """The settings with the task filled in: the pool's first task where none is given (`study_task`)."""
    return replace(settings, task=study_task(pool, settings.task))


def budget_of(pool, settings: FinetuneStudySettings) -> dict:
    """Steps, batch size, lr and warm-up of every run: the given ones over the pool's own recipe of the task."""
    recipe = finetune_defaults(pool, with_task(pool, settings).task)
    budget = {k: getattr(recipe, k) if getattr(settings, k) is None else getattr(settings, k)
              for k in ("steps", "batch_size", "lr", "warmup")}
    if settings.warmup is None:         # the pool's warm-up, for its own steps: never longer than the steps asked
        budget["warmup"] = min(budget["warmup"], budget["steps"])
    return budget


def config(pool, settings: FinetuneStudySettings, label: str, **changes) -> FinetuneConfig:
    """One run of a study: the shared budget and seed, with `changes` (optimizer, fraction, filter, …)."""
    return FinetuneConfig(label=label, seed=settings.seed, **{**budget_of(pool, settings), **changes})


def run_options(settings: FinetuneStudySettings, steps: int) -> dict:
    """`compare`'s keyword arguments of a study (records only at the end unless `eval_every` is given)."""
    return dict(eval_every=settings.eval_every or steps, max_general=settings.max_general,
                max_task=settings.max_task, max_train=settings.max_train, max_length=settings.max_length,
                device=settings.device, dtype=settings.dtype)


def run_configs(pool, settings: FinetuneStudySettings, configs: Sequence[FinetuneConfig], progress: Progress = None,
                executor=None) -> FinetuneComparison:
    """The study's runs on equal footing (same task, data, batches and seed): `forgetlab.train.runs.compare`, one
    run per worker on a non-local executor."""
    configs = list(configs)
    return compare(pool, with_task(pool, settings).task, configs, progress=progress, executor=executor,
                   **run_options(settings, configs[0].steps))


def runs_table(comparison: FinetuneComparison) -> pd.DataFrame:
    """One row per run: its label, optimizer, final speciality (exact match) and answer loss on the task, general
    loss, forgetting (general loss gained), D(θ, θ0), the share of weights moved and its seconds."""
    if not comparison.runs:
        return pd.DataFrame(columns=RUN_COLUMNS)
    return comparison.to_frame()[RUN_COLUMNS].reset_index(drop=True)


def check_task(settings: FinetuneStudySettings, pool=None) -> None:
    """A warm-up no longer than the steps given; with the pool, the task is one of its tasks (the base is every
    study's start)."""
    if settings.warmup is not None and settings.steps is not None and settings.warmup > settings.steps:
        raise ParameterError(f"--warmup {settings.warmup} is longer than --steps {settings.steps}: give a warm-up of "
                             f"at most {settings.steps} steps, or leave it out.")
    if pool is not None:
        pool.check_tasks([with_task(pool, settings).task])
        check_start(pool, "base")


def estimate_runs(pool, settings: FinetuneStudySettings, configs: Sequence[FinetuneConfig]):
    """The peak of the largest run (`forgetlab.train.memory.estimate_finetune`)."""
    return estimate_finetune(pool, with_task(pool, settings).task, configs=list(configs), device=settings.device,
                             dtype=settings.dtype, max_train=settings.max_train, max_length=settings.max_length)


def finetune_singles(pool, settings: FinetuneStudySettings,
                     configs: Sequence[FinetuneConfig]) -> list[tuple[str, object]]:
    """The single `forgetlab finetune` runs the study stands for: one per config, with its settings, budget and
    records."""
    settings = with_task(pool, settings)
    out = []
    for c in configs:
        out.append(("finetune", FinetuneSettings(
            task=settings.task, optimizer=c.optimizer, fraction=c.fraction, filter=c.filter, partition=c.partition,
            steps=c.steps, batch_size=c.batch_size, lr=c.lr, warmup=c.warmup, seed=c.seed, sfa_p=c.sfa_p,
            sfa_beta=c.sfa_beta, l1=c.l1, l2=c.l2, hft=c.hft, eval_every=settings.eval_every or c.steps,
            max_general=settings.max_general, max_task=settings.max_task, max_train=settings.max_train,
            max_length=settings.max_length, device=settings.device, dtype=settings.dtype)))
    return out


def speciality_column(table: pd.DataFrame) -> tuple[str, bool]:
    """The speciality column a verdict reads and whether higher is better: exact match, or — where no run
    reaches any (a model too small to answer exactly) — the answer loss (lower is better)."""
    if "speciality" in table and (table["speciality"].fillna(0) > 0).any():
        return "speciality", True
    return "answer_loss", False


def dominates(a: pd.Series, b: pd.Series, column: str, higher: bool) -> bool:
    """Whether run `a` is at least as good as run `b` in speciality (`column`, `higher` better) and in general loss
    (lower better), and better in one of them: `a` lies ahead of `b` on the speciality–generality plane."""
    sa, sb = (a[column], b[column]) if higher else (-a[column], -b[column])
    return bool(sa >= sb and a["general_loss"] <= b["general_loss"]
                and (sa > sb or a["general_loss"] < b["general_loss"]))


def fraction_field(what: str):
    """The MoFO update fraction of a study's MoFO runs (default 0.2, the comparison's)."""
    return setting(0.2, help=f"MoFO's update fraction α of {what}", label="MoFO fraction", range=(0.0, 1.0))


def check_fraction_in(settings, pool=None, name: str = "fraction") -> None:
    """The update fraction in (0, 1]; the task in the pool."""
    value = getattr(settings, name)
    if not 0 < value <= 1:
        raise ParameterError(f"--{name.replace('_', '-')} takes a share in (0, 1]; got {value}. E.g. 0.2.")
    check_task(settings, pool)


LION_LR_SCALE = 0.3
"""The Lion runs' learning rate as a multiple of AdamW's: Lion's authors advise 3–10× smaller (0.1–0.3); at 0.1
MoFO-Lion did not finish learning pico's tasks within the zoo's recipe (docs/studies.md, mofo-lion)."""


def lion_lr_scale_field():
    """The Lion runs' learning rate as a multiple of AdamW's (default LION_LR_SCALE)."""
    return setting(LION_LR_SCALE, help="the Lion runs' learning rate as a multiple of AdamW's (Lion's authors advise "
                                       "3–10× smaller: 0.1–0.3; 0.3, the gentler end, lets Lion finish learning "
                                       "within a short recipe)", label="Lion lr ÷ AdamW lr", range=(0.0, None))


def check_lion_scale(settings) -> None:
    """A positive Lion learning-rate multiple."""
    if not settings.lion_lr_scale > 0:
        raise ParameterError(f"--lion-lr-scale must be > 0; got {settings.lion_lr_scale}. Lion's authors advise "
                             "0.1–0.3.")
