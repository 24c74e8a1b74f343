"""What an attribution map holds (`forgetlab.analysis.attribution`): one row per (map, submodule, α) — the edited
model's scores and d against the reference — the base's and the fine-tune's scorecards, and the additivity of the
parts. Plots and the Runs page read these without importing the analysis."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional

import pandas as pd

from forgetlab.analysis.measures import change_text
from forgetlab.core.anatomy import part_words, plural_part, sentence_start
from forgetlab.core.evaluate import Scorecard, forgetting_text

KIND = "attribution"
MAPS = ("only_this", "leave_one_out")
MEASURES = ("general_loss", "speciality", "answer_loss")
COLUMNS = ["map", "key", "layer", "module", "head", "alpha", "d_general_loss", "d_speciality", "d_answer_loss",
           "general_loss", "speciality", "answer_loss", "tau_norm", "tau_share", "zero_tau", "seconds"]


def card_scores(card: Scorecard, task: str) -> dict[str, float]:
    """general_loss, speciality (exact match on `task`) and answer_loss of a scorecard."""
    t = card.tasks[task]
    return {"general_loss": float(card.general_loss), "speciality": float(t.exact_match),
            "answer_loss": float(t.answer_loss)}


@dataclass
class AttributionRow:
    """One (map, part, α) evaluation: the edited model's scores and d = edited − reference."""

    map: str
    key: str
    layer: Optional[int]
    module: str
    head: Optional[int]
    alpha: float
    general_loss: float
    speciality: float
    answer_loss: float
    d_general_loss: float
    d_speciality: float
    d_answer_loss: float
    tau_norm: float
    tau_share: float
    zero_tau: bool = False
    seconds: float = 0.0


@dataclass
class AttributionResult:
    """Both maps of one model and task at one level, the base's and the fine-tune's scorecards, the cost."""

    model: str
    task: str
    level: str
    base: Scorecard
    finetuned: Scorecard
    rows: list[AttributionRow] = field(default_factory=list)
    seconds: float = 0.0
    evaluations: int = 0
    tensors_written: int = 0
    notes: list[str] = field(default_factory=list)
    recipe: dict[str, Any] = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        """One row per (map, submodule[, α]) with the columns of `COLUMNS`."""
        frame = pd.DataFrame([asdict(r) for r in self.rows], columns=COLUMNS)
        return frame.astype({"layer": "Int64", "head": "Int64"})

    def scores(self, which: str) -> dict[str, float]:
        """general_loss, speciality (exact match on the task) and answer_loss of ``"base"`` or ``"finetuned"``."""
        return card_scores(self.base if which == "base" else self.finetuned, self.task)

    @property
    def zero_parts(self) -> list[str]:
        """Keys of the parts whose τ is zero (flagged, not evaluated)."""
        return list(dict.fromkeys(r.key for r in self.rows if r.zero_tau))

    def additivity(self) -> pd.DataFrame:
        """Per map and measure: Σk d over the parts (at α = 1 for only_this, α = 0 for leave_one_out), the
        whole (fine-tune − base, or base − fine-tune), and their ratio (1 = the parts add up exactly)."""
        base, ft = self.scores("base"), self.scores("finetuned")
        out = []
        for m, a in (("only_this", 1.0), ("leave_one_out", 0.0)):
            rows = [r for r in self.rows if r.map == m and r.alpha == a]
            for meas in MEASURES:
                total = sum(getattr(r, f"d_{meas}") for r in rows)
                whole = (ft[meas] - base[meas]) * (1 if m == "only_this" else -1)
                ratio = total / whole if abs(whole) > 1e-12 else float("nan")
                out.append({"map": m, "measure": meas, "sum_of_parts": total, "whole": whole, "ratio": ratio,
                            "parts": len(rows)})
        return pd.DataFrame(out, columns=["map", "measure", "sum_of_parts", "whole", "ratio", "parts"])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the scorecards, every row, the cost, the notes and the recipe."""
        return {"model": self.model, "task": self.task, "level": self.level, "base": self.base.to_dict(),
                "finetuned": self.finetuned.to_dict(), "rows": [asdict(r) for r in self.rows],
                "seconds": self.seconds, "evaluations": self.evaluations, "tensors_written": self.tensors_written,
                "notes": list(self.notes), "recipe": dict(self.recipe)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "AttributionResult":
        """The result of `to_dict`."""
        return cls(model=d["model"], task=d["task"], level=d["level"], base=Scorecard.from_dict(d["base"]),
                   finetuned=Scorecard.from_dict(d["finetuned"]), rows=[AttributionRow(**r) for r in d["rows"]],
                   seconds=float(d.get("seconds", 0.0)), evaluations=int(d.get("evaluations", 0)),
                   tensors_written=int(d.get("tensors_written", 0)), notes=list(d.get("notes", [])),
                   recipe=dict(d.get("recipe", {})))


def _name(row: AttributionRow) -> str:
    return part_words(row.layer, row.module, row.head)


def takeaway(result: AttributionResult) -> list[str]:
    """The map in two sentences, from its only-this map (each part of the task vector alone on the base, at α = 1
    or the line's largest α): the part that buys most speciality — exact match, or where no part alone raises it,
    the answer loss it lowers most (nats) — and the part that costs most general-text loss (nats), with what
    it buys. Parts whose task vector is zero are left out."""
    rows = [r for r in result.rows if r.map == "only_this" and not r.zero_tau]
    if not rows:
        return []
    alpha = max(r.alpha for r in rows)
    rows = [r for r in rows if r.alpha == alpha]
    scaled = "" if alpha == 1.0 else f" (scaled to {alpha:g})"
    if max(r.d_speciality for r in rows) > 0:
        column = "d_speciality"
        buyer = max(rows, key=lambda r: r.d_speciality)
        first = (f"{sentence_start(_name(buyer), 'buys', 'buy', ' alone' + scaled)} "
                 f"{change_text('exact_match', buyer.d_speciality)} on {result.task}.")
    else:
        column = "d_answer_loss"
        buyer = min(rows, key=lambda r: r.d_answer_loss)
        first = (f"No part alone{scaled} raises exact match on {result.task}; " +
                 (f"the largest drop of its answer loss comes from {_name(buyer)}: {buyer.d_answer_loss:+.3f} nats."
                  if buyer.d_answer_loss < 0 else "none lowers its answer loss either."))
    payer = max(rows, key=lambda r: r.d_general_loss)
    bought = getattr(payer, column)
    many = plural_part(_name(payer))
    if column == "d_speciality":
        buys = ("buy " if many else "buys ") + (change_text("exact_match", bought) if bought
                                                else "nothing in exact match")
    else:
        buys = f"{'change' if many else 'changes'} the answer loss by {bought:+.3f} nats"
    if payer.d_general_loss > 0:
        second = (f"{sentence_start(_name(payer), 'costs', 'cost', ' alone')} the most general-text loss, "
                  f"{forgetting_text(payer.d_general_loss)}, and {buys}.")
    else:
        second = (f"No part alone raises the general-text loss; the largest change comes from {_name(payer)}: "
                  f"{forgetting_text(payer.d_general_loss)}.")
    return [first, second]
