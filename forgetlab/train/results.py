"""What a what-if fine-tune produces: its recipe (`FinetuneConfig`), one run's record (`FinetuneRun`) and a
comparison of runs on the same data (`FinetuneComparison`), with the Pareto front of their final points.

These are the results that `forgetlab.train.runs` computes, that the fine-tune analysis saves and reopens
(`forgetlab.analysis.finetune`) and that `forgetlab.plots.finetune` draws; this module reads no weights.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import pandas as pd

from forgetlab.analysis.measures import higher_is_better, pareto_mask
from forgetlab.core.benchmarks import pick
from forgetlab.core.evaluate import Scorecard
from forgetlab.train.trainer import TrainResult


@dataclass
class FinetuneConfig:
    """One fine-tuning recipe. `label` names it in tables and charts; the rest are `train` arguments."""

    label: str = "adamw"
    optimizer: str = "adamw"
    steps: int = 100
    batch_size: int = 8
    lr: float = 1e-3
    weight_decay: float = 0.0
    fraction: float = 0.2
    filter: str = "momentum"                     # MoFO's filter (docs/methods.md#mofo-filters)
    partition: str = "tensor"                    # MoFO's partitions: "tensor" or "head" (#head-partitions)
    warmup: int = 0
    schedule: str = "cosine"
    seed: int = 0
    sfa_p: Optional[float] = None
    sfa_beta: float = 0.5
    l1: float = 0.0
    l2: float = 0.0
    hft: float = 0.0                             # HFT's frozen share of each layer's matrices; 0 = off (train.hft)
    lora: int = 0                                # LoRA rank; 0 = a full fine-tune (forgetlab.train.lora)
    lora_alpha: Optional[float] = None           # default 2·rank
    lora_targets: Optional[list[str]] = None     # default every linear layer of the blocks

    def train_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `forgetlab.train.trainer.train` this config stands for."""
        d = asdict(self)
        for key in ("label", "lora", "lora_alpha", "lora_targets"):
            d.pop(key)
        return d

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (round-trips through `from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FinetuneConfig":
        """Rebuild an object saved with `to_dict`."""
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


def records_card(record: Mapping[str, Any]) -> Scorecard:
    """The scorecard kept in one of a run's periodic records (`forgetlab.train.runs.finetune`)."""
    return Scorecard.from_dict(record["scorecard"])


@dataclass
class FinetuneRun:
    """One fine-tune: its config, the task, where it started, the training record and the final scorecard.

    `train.history` holds the periodic records (step, distance, general_loss, perplexity, exact_match,
    answer_loss); `start_card` is the scorecard of the starting model (step 0).
    """

    config: FinetuneConfig
    task: str
    start: str
    train: TrainResult
    final: Optional[Scorecard] = None
    start_card: Optional[Scorecard] = None
    pareto: bool = False
    executor: str = "local"
    worker: dict[str, Any] = field(default_factory=dict)   # {"host", "pid"} of the process that trained it

    @property
    def label(self) -> str:
        """The config's label (names the run in tables and charts)."""
        return self.config.label

    @property
    def speciality(self) -> float:
        """Final exact match on the task."""
        return self.final.tasks[self.task].exact_match if self.final else float("nan")

    def value(self, measure: str = "exact_match", card: Optional[Scorecard] = None) -> float:
        """The run's score on its task in `measure` — exact match, answer loss or an lm-eval `TASK/METRIC`
        (run at every record with `benchmarks=`) — of its final scorecard, or of `card` (e.g. `start_card`)."""
        card = card if card is not None else self.final
        if card is None:
            return float("nan")
        if "/" in str(measure):
            return pick(card.benchmarks, measure)
        return float(getattr(card.tasks[self.task], measure))

    def generality(self, measure: str = "general_loss", card: Optional[Scorecard] = None) -> float:
        """The run's generality in `measure` — held-out general loss (↓) or an lm-eval `TASK/METRIC` (run at
        every record with `benchmarks=`) — of its final scorecard, or of `card` (e.g. `start_card`)."""
        card = card if card is not None else self.final
        if card is None:
            return float("nan")
        if measure == "general_loss":
            return float(card.general_loss)
        return pick(card.benchmarks, measure)

    @property
    def general_loss(self) -> float:
        """Final held-out general loss."""
        return self.final.general_loss if self.final else float("nan")

    @property
    def forgetting(self) -> float:
        """Generality lost from the start to the end of the run (`Scorecard.forgetting`: final general loss −
        the start's); NaN when either was not recorded."""
        if self.final is None or self.start_card is None:
            return float("nan")
        return self.final.forgetting(self.start_card)

    @property
    def distance(self) -> float:
        """Final D(θ, θ0) from the start model."""
        return self.last_record("distance")

    @property
    def moved(self) -> float:
        """Final share of entries that moved more than 2e-6 from the start model (docs/methods.md#moved-share);
        NaN for a run that did not record it."""
        return self.last_record("moved")

    def last_record(self, key: str) -> float:
        """The value of `key` in the run's last record that holds it (NaN when none does)."""
        for rec in reversed(self.train.history):
            if key in rec:
                return float(rec[key])
        return float("nan")

    def trajectory(self) -> pd.DataFrame:
        """The periodic records as a table, one row per record, with the run's label."""
        df = self.train.history_frame()
        df.insert(0, "label", self.label)
        return df

    def to_frame(self) -> pd.DataFrame:
        """One row: label, settings, final speciality, general loss, forgetting, distance, pareto."""
        row = {"label": self.label, "task": self.task, "start": self.start, "optimizer": self.config.optimizer,
               "steps": self.train.completed_steps, "speciality": self.speciality,
               "answer_loss": self.final.tasks[self.task].answer_loss if self.final else float("nan"),
               "general_loss": self.general_loss, "forgetting": self.forgetting,
               "distance": self.distance, "moved": self.moved, "final_train_loss": self.train.final_loss,
               "pareto": self.pareto,
               "seconds": self.train.seconds, "stopped": self.train.stopped, "executor": self.executor,
               "worker_host": self.worker.get("host"), "worker_pid": self.worker.get("pid")}
        for btask, metrics in (self.final.benchmarks if self.final else {}).items():
            row.update({f"{btask}/{metric}": v for metric, v in metrics.items()})
        return pd.DataFrame([row])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (round-trips through `from_dict`)."""
        return {"config": self.config.to_dict(), "task": self.task, "start": self.start,
                "train": self.train.to_dict(), "final": self.final.to_dict() if self.final else None,
                "start_card": self.start_card.to_dict() if self.start_card else None, "pareto": self.pareto,
                "executor": self.executor, "worker": dict(self.worker)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FinetuneRun":
        """Rebuild an object saved with `to_dict`."""
        return cls(config=FinetuneConfig.from_dict(d["config"]), task=d["task"], start=d["start"],
                   train=TrainResult.from_dict(d["train"]),
                   final=Scorecard.from_dict(d["final"]) if d.get("final") else None,
                   start_card=Scorecard.from_dict(d["start_card"]) if d.get("start_card") else None,
                   pareto=bool(d.get("pareto", False)), executor=str(d.get("executor", "local")),
                   worker=dict(d.get("worker") or {}))


@dataclass
class FinetuneComparison:
    """Several fine-tunes of the same task on the same data and steps, with the Pareto front marked.

    Two things a run in this process leaves on it and that are never saved: `model`, the trained model of a
    single run (for the app to save into the pool afterwards), and `saved_as`, (name, folder) of the model when
    the run saved it into the pool itself (`--save-as`)."""

    task: str
    start: str
    runs: list[FinetuneRun] = field(default_factory=list)
    recipe: dict[str, Any] = field(default_factory=dict)
    model: Any = field(default=None, repr=False, compare=False)
    saved_as: Optional[tuple[str, Path]] = field(default=None, repr=False, compare=False)

    def mark_pareto(self, measure: str = "exact_match", general_measure: str = "general_loss") -> list[bool]:
        """Flag the runs whose final (speciality in `measure`, generality in `general_measure`) no other run
        beats on both."""
        sign = 1.0 if higher_is_better(measure) else -1.0
        gsign = -1.0 if higher_is_better(general_measure) else 1.0       # the mask wants a loss
        flags = pareto_mask([sign * r.value(measure) for r in self.runs],
                            [gsign * r.generality(general_measure) for r in self.runs])
        for r, f in zip(self.runs, flags):
            r.pareto = f
        return flags

    def take_model(self) -> Any:
        """The trained model of a single run, handed over once: the comparison holds it no longer."""
        model, self.model = self.model, None
        return model

    def to_frame(self) -> pd.DataFrame:
        """One row per run (see `FinetuneRun.to_frame`)."""
        if not self.runs:
            return pd.DataFrame()
        return pd.concat([r.to_frame() for r in self.runs], ignore_index=True)

    def trajectories(self) -> pd.DataFrame:
        """Every run's periodic records stacked, with a `label` column."""
        if not self.runs:
            return pd.DataFrame()
        return pd.concat([r.trajectory() for r in self.runs], ignore_index=True)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (round-trips through `from_dict`)."""
        return {"task": self.task, "start": self.start, "runs": [r.to_dict() for r in self.runs],
                "recipe": self.recipe}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FinetuneComparison":
        """Rebuild an object saved with `to_dict`."""
        return cls(task=d["task"], start=d["start"], runs=[FinetuneRun.from_dict(r) for r in d.get("runs", [])],
                   recipe=dict(d.get("recipe", {})))


def single_run_comparison(run: FinetuneRun, measure: str = "exact_match",
                          general_measure: str = "general_loss") -> FinetuneComparison:
    """One fine-tune as a comparison of one run: its recipe (task, start, config and the measures it was judged
    with) and its Pareto flag — how the CLI and the Fine-tune page both show and save a single run."""
    comp = FinetuneComparison(run.task, run.start, [run], {
        "task": run.task, "start": run.start, "configs": [run.config.to_dict()], "measure": measure,
        "general_measure": general_measure})
    comp.mark_pareto(measure, general_measure)
    return comp
