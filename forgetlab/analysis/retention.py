"""What a merge kept: each parent's own-task gain retained by the merged model, and what it cost in generality.

A merge of several fine-tunes is for keeping each one's skill in one model. Judged on all tasks at once, a merge
looks fine wherever an off-task parent already scores high; judged on each parent's OWN task, it shows what it
kept: retention r = (s(merge, t) − s(base, t)) / (s(parent, t) − s(base, t)), with speciality s oriented so
that higher is better (answer loss negated): 1 = the parent's level, 0 = the base's (docs/methods.md#retention).
Generality is the merge's forgetting, general loss − the base's, beside its parents'.

The relative shares have their one home here (docs/methods.md#relative-shares): `gain_kept` (the share of the
fine-tuning gain a model keeps) and `forgetting_recovered` (the share of the forgetting it wins back), on values
oriented so that higher is better; `gain_share` and `recovered_share` read them off scorecards, and
`relative_frame` off the points of a pruning or α sweep (the FAPM paper's relative axes).

`own_tasks(pool, models, cards)` says which task is each model's own; `merge_retention(cards, merged, tasks)`
gives a `MergeRetention` (one row per merge × parent, `.to_frame()`), which `forgetlab.plots.merge` draws.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import pandas as pd

from forgetlab.analysis.measures import higher_is_better
from forgetlab.analysis.sweep_results import SweepResult
from forgetlab.analysis.sweeps import default_task
from forgetlab.core.benchmarks import pick
from forgetlab.core.errors import ParameterError
from forgetlab.core.evaluate import Scorecard, forgetting_text, perplexity_change

MEASURES = ("exact_match", "answer_loss")
ENDPOINTS = {"ratio": (1.0, 0.0), "alpha": (0.0, 1.0)}
"""Where a sweep's swept value puts the base and the fine-tune (base x, fine-tune x): pruning ratio 1 is θ0 and 0
is θ1; WiSE-FT α 0 is θ0 and 1 is θ1 (forgetlab.analysis.sweeps writes both endpoints bit for bit)."""


def gain_kept(base: float, finetuned: float, other: float) -> float:
    """The share of the fine-tuning gain that `other` keeps, on a speciality oriented so that higher is better:
    (other − base) / (finetuned − base); NaN when the fine-tune gained nothing (docs/methods.md#relative-shares)."""
    gain = finetuned - base
    return (other - base) / gain if gain > 0 else float("nan")


def forgetting_recovered(base: float, finetuned: float, other: float) -> float:
    """The share of the forgetting that `other` wins back, on a generality oriented so that higher is better
    (general loss negated): (other − finetuned) / (base − finetuned); 1 = the base's generality, 0 = the
    fine-tune's; NaN when the fine-tune forgot nothing on that measure (docs/methods.md#relative-shares)."""
    lost = base - finetuned
    return (other - finetuned) / lost if lost > 0 else float("nan")


def oriented_generality(card: Scorecard, measure: str = "general_loss") -> float:
    """Generality of `card`, oriented so that higher is better: −general loss, or a benchmark metric `TASK/METRIC`
    (negated where lower is better)."""
    if measure == "general_loss":
        return -card.general_loss
    value = pick(card.benchmarks, measure)
    return value if higher_is_better(measure) else -value


def oriented_speciality(card: Scorecard, task: str, measure: str = "exact_match") -> float:
    """Speciality of `card` on `task`, oriented so that higher is better: exact match, or −answer loss."""
    score = card.tasks[task]
    return score.exact_match if measure == "exact_match" else -score.answer_loss


def gain_share(base: Scorecard, parent: Scorecard, other: Scorecard, task: str,
               measure: str = "exact_match") -> float:
    """The share of `parent`'s gain over `base` on `task` that `other` (a merge, an interpolation …) has:
    (s(other) − s(base)) / (s(parent) − s(base)); NaN when the parent gained nothing (docs/methods.md#retention)."""
    return gain_kept(oriented_speciality(base, task, measure), oriented_speciality(parent, task, measure),
                     oriented_speciality(other, task, measure))


def recovered_share(base: Scorecard, finetuned: Scorecard, other: Scorecard, measure: str = "general_loss") -> float:
    """The share of `finetuned`'s forgetting (in the generality `measure`) that `other` wins back:
    `forgetting_recovered` on the oriented generality of the three scorecards."""
    return forgetting_recovered(oriented_generality(base, measure), oriented_generality(finetuned, measure),
                                oriented_generality(other, measure))


def relative_frame(result: SweepResult, measure: Optional[str] = None,
                   general_measures: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """A pruning or α sweep on the FAPM paper's relative axes: one row per point (series, x) with `gain_kept`
    (share of the fine-tune's gain in `measure`, default the sweep's, on its task) and `forgetting_recovered` (the
    mean over `general_measures`, default the sweep's generality measure, of the share of forgetting won back,
    each also as `recovered:<measure>`); the base and fine-tune are the sweep's own endpoints (`ENDPOINTS`).
    ParameterError for another kind of sweep or a sweep without both endpoints."""
    if result.x_name not in ENDPOINTS:
        raise ParameterError(f"Relative axes need a pruning or α sweep (its endpoints are the base and the "
                             f"fine-tune); this is a {result.kind} sweep.")
    measure = measure or result.measure
    general_measures = list(general_measures or [result.general_measure])
    base_x, ft_x = ENDPOINTS[result.x_name]
    at = {p.x: p for p in result.points}
    if base_x not in at or ft_x not in at:
        raise ParameterError(f"Relative axes need the sweep's endpoints {result.x_name} = {base_x:g} (the base) and "
                             f"{ft_x:g} (the fine-tune); add both to the grid.")
    sign = 1.0 if higher_is_better(measure) else -1.0

    def spec(p) -> float:
        return sign * p.speciality(result.task, measure)

    def gen(p, g: str) -> float:
        return oriented_generality(p.scorecard, g)

    base, ft = at[base_x], at[ft_x]
    rows = []
    for p in result.points:
        row = {"series": p.series, "x": p.x, "gain_kept": gain_kept(spec(base), spec(ft), spec(p))}
        shares = {g: forgetting_recovered(gen(base, g), gen(ft, g), gen(p, g)) for g in general_measures}
        finite = [v for v in shares.values() if math.isfinite(v)]
        row["forgetting_recovered"] = sum(finite) / len(finite) if finite else float("nan")
        row.update({f"recovered:{g}": v for g, v in shares.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def own_tasks(pool, models: Sequence[str], cards: Sequence[Scorecard] = ()) -> dict[str, Optional[str]]:
    """Each model's own task: the pool task named in the model's name (the longest one it contains, as
    `forgetlab.analysis.sweeps.default_task`), else — when `cards` hold the base and the model — the task on which
    the model gained most exact match over the base (answer loss breaking ties); None when neither says."""
    by_name = {c.model: c for c in cards}
    base = by_name.get("base")
    out: dict[str, Optional[str]] = {}
    for m in models:
        task = default_task(pool, m)
        card = by_name.get(m)
        if task is None and base is not None and card is not None:
            gains = {t: (card.tasks[t].exact_match - base.tasks[t].exact_match,
                         base.tasks[t].answer_loss - card.tasks[t].answer_loss)
                     for t in card.tasks if t in base.tasks}
            best = max(gains, key=gains.get) if gains else None
            task = best if best is not None and max(gains[best]) > 0 else None
        out[m] = task
    return out


@dataclass
class RetentionRow:
    """One parent of one merge: its own task, the base's / parent's / merge's oriented speciality there, the
    retention, and both models' forgetting (nats) with its perplexity change."""

    merge: str
    parent: str
    task: Optional[str]
    base: float
    parent_score: float
    merged: float
    retention: float
    parent_forgetting: float
    merge_forgetting: float


@dataclass
class MergeRetention:
    """Per merge and parent, the share of the parent's own-task gain kept; and each model's forgetting."""

    measure: str
    base_general_loss: float
    rows: list[RetentionRow] = field(default_factory=list)
    forgetting: dict[str, float] = field(default_factory=dict)     # model (parents, then merges) → Δ general loss
    merges: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)

    def to_frame(self) -> pd.DataFrame:
        """One row per merge × parent: merge, parent, task, base / parent / merge speciality, retention, the
        merge's forgetting and its perplexity change."""
        return pd.DataFrame([{
            "merge": r.merge, "parent": r.parent, "task": r.task, "base": r.base, "parent_score": r.parent_score,
            "merged": r.merged, "retention": r.retention, "forgetting": r.merge_forgetting,
            "perplexity_change": perplexity_change(r.merge_forgetting)} for r in self.rows])

    def mean_retention(self, merge: str) -> float:
        """The mean retention of `merge` over its parents whose retention is defined (NaN when none is)."""
        vals = [r.retention for r in self.rows if r.merge == merge and math.isfinite(r.retention)]
        return sum(vals) / len(vals) if vals else float("nan")


def merge_retention(cards: Sequence[Scorecard], merged: Sequence[str], tasks: Mapping[str, Optional[str]],
                    measure: str = "exact_match", parents: Optional[Mapping[str, Sequence[str]]] = None
                    ) -> MergeRetention:
    """Retention of each merge in `merged` (card names) for each parent (`tasks`: parent → own task; every
    parent of every merge unless `parents` maps a merge to its own), from `cards` holding the base ("base"),
    the parents and the merges. ParameterError when a card is missing or `measure` is not a built-in one."""
    if measure not in MEASURES:
        raise ParameterError(f"Retention needs exact_match or answer_loss as the measure; got {measure!r}.")
    by_name = {c.model: c for c in cards}
    missing = [n for n in ["base", *tasks, *merged] if n not in by_name]
    if missing:
        raise ParameterError(f"No scorecard for {', '.join(missing)}: evaluate the base, the parents and the merges "
                             "together.")
    base = by_name["base"]
    result = MergeRetention(measure, base.general_loss, merges=list(merged), parents=list(tasks))
    for name in [*tasks, *merged]:
        result.forgetting[name] = by_name[name].forgetting(base)
    for m in merged:
        for p in (parents or {}).get(m, list(tasks)):
            t = tasks.get(p)
            known = t is not None and all(t in by_name[n].tasks for n in ("base", p, m))
            s = (lambda n: oriented_speciality(by_name[n], t, measure)) if known else (lambda n: float("nan"))
            result.rows.append(RetentionRow(
                merge=m, parent=p, task=t, base=s("base"), parent_score=s(p), merged=s(m),
                retention=gain_share(base, by_name[p], by_name[m], t, measure) if known else float("nan"),
                parent_forgetting=result.forgetting[p], merge_forgetting=result.forgetting[m]))
    return result


def takeaway(result: MergeRetention, labels: Optional[Mapping[str, str]] = None) -> list[str]:
    """What the merges kept, in one or two sentences (the Merge page and `forgetlab merge --eval`): with one merge,
    the share of its parents' own-task gains it keeps (%, their mean, then per task) and its forgetting (general
    loss − the base's, nats); with several, the one that keeps most and the one that keeps least. `labels` names
    the merges (e.g. their methods)."""
    def name(m: str) -> str:            # a display name starts the sentence capitalised; a folder name stays as is
        label = (labels or {}).get(m)
        return label[:1].upper() + label[1:] if label else m

    def kept(m: str) -> str:
        rows = [r for r in result.rows if r.merge == m and math.isfinite(r.retention)]
        each = ", ".join(f"{r.task} {100 * r.retention:.0f} %" for r in rows)
        return f"{100 * result.mean_retention(m):.0f} % of its parents' own-task gains on average ({each})"

    def cost(m: str) -> str:
        return f"{forgetting_text(result.forgetting[m])} of general loss"

    scored = [m for m in result.merges if math.isfinite(result.mean_retention(m))]
    unit = "exact match" if result.measure == "exact_match" else "answer loss"
    if not scored:
        return [f"{name(m)} costs {cost(m)} against the base; no parent gained {unit} on its own task, so what it "
                "kept is undefined." for m in result.merges[:2]]
    if len(result.merges) == 1:
        m = result.merges[0]
        return [f"{name(m)} keeps {kept(m)}, in {unit}, and costs {cost(m)} against the base."]
    best = max(scored, key=result.mean_retention)
    worst = min(scored, key=result.mean_retention)
    lines = [f"{name(best)} keeps the most: {kept(best)}, in {unit}, for {cost(best)}."]
    if worst != best:
        lines.append(f"{name(worst)} keeps the least: {100 * result.mean_retention(worst):.0f} %, for {cost(worst)}.")
    return lines
