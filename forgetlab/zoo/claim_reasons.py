"""How the Models page words a zoo's claims: their groups, each merge named as the app names its method with the
method's own paper, and why a claim that fails here fails — built from its measured numbers against the claim's
threshold (`forgetlab.zoo.claims` measures them; this module only reads a claim's key, numbers and values, so
claims stored by an older build read the same way).

- `claim_group(key)`: "finetune" (what fine-tuning gained, cost and changed: `finetune:*`, `distinct`,
  `linearity`), "fixes" (`wise_ft`, `fapm`), "merges" (`merge:*`) or "sequence" (`sequence:*`: task sequences,
  forgetlab.zoo.sequence_claims); `GROUPS` gives their headings.
- `merge_claim_text(method)`, `claim_source(key, stored)`: the words and the paper of a claim.
- `why_not(claim, measure)`: "" for a claim that holds, else one short sentence per failing part.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping, Optional

from forgetlab.merge.registry import METHODS, method_title

MAX_COSINE = 0.3                 # the `distinct` claim's thresholds
MAX_OFF_TASK_SHARE = 1 / 3
REFERENCE_MERGE = "linear"       # what every merge claim is measured against: the fine-tunes' plain weight average

GROUPS = (("finetune", "Fine-tunes", "what fine-tuning gained, what it cost and what it changed"),
          ("fixes", "Fixes for forgetting", "interpolating back (WiSE-FT) and pruning the task vector (FAPM)"),
          ("merges", "Merges", "one model from the fine-tunes, against their plain weight average"),
          ("sequence", "Task sequences", "training on the tasks one after another: what each later task erases"))
"""(group, heading, what its claims are about), in the order the page shows them."""

# the paper of a claim that is not a merge: the registry's paper of the method it tests, where there is one
_CLAIM_METHOD = {"wise_ft": "wise_ft", "fapm": "fapm", "linearity": "slwm"}
_OTHER_SOURCES = {"finetune": "catastrophic forgetting", "distinct": "task arithmetic / TIES"}


def claim_group(key: str) -> str:
    """The group of the claim called `key` (see the module docstring)."""
    kind = key.split(":", 1)[0]
    if kind == "merge":
        return "merges"
    if kind == "sequence":
        return "sequence"
    return "fixes" if kind in ("wise_ft", "fapm") else "finetune"


def merge_claim_text(method: str) -> str:
    """The claim of a merge, with the method's display name: "a TIES merge of the fine-tunes keeps …" ("a PCB
    merge", not "a PCB-merging merge")."""
    name = re.sub(r"[- ](merging|merge)$", "", method_title(method), flags=re.IGNORECASE)   # "PCB-merging" → "PCB"
    article = "an" if name[:1].lower() in "aeio" else "a"
    return (f"{article} {name} merge of the fine-tunes keeps their own-task gains better than their "
            f"{method_title(REFERENCE_MERGE)}")


def claim_source(key: str, stored: str = "") -> str:
    """The paper a claim comes from: a merge's own paper (its registry declaration), the tested method's for
    WiSE-FT, FAPM and submodule linearity, else the stored or the built-in source."""
    kind, _, method = key.partition(":")
    name = method if kind == "merge" else _CLAIM_METHOD.get(kind)
    spec = METHODS.find(name) if name else None      # None: a method no longer registered (the stored source)
    if spec is not None and spec.paper:
        return spec.paper
    return stored or _OTHER_SOURCES.get(kind, "")


def claim_text(key: str, stored: str) -> str:
    """The claim's words: a merge's with its method's display name (stored claims used the registry name)."""
    kind, _, method = key.partition(":")
    return merge_claim_text(method) if kind == "merge" and method else stored


# ------------------------------------------------------------------------------------------------ reasons

def _ok(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _pct(x: Any) -> str:
    return f"{100 * x:.0f}%" if _ok(x) else "n/a"


def nls_text(x: Any) -> str:
    """An NLS as the Linearity page's level metrics show it: three significant digits ("0.578")."""
    return f"{x:.3g}" if _ok(x) else "n/a"


def efficiency(gain: float, forgetting: float) -> float:
    """Speciality gain per nat of forgetting; +inf for a gain without forgetting, −inf for no gain (0 for no gain
    and no forgetting): the FAPM claim's comparison."""
    if gain <= 0:
        return -math.inf if forgetting > 0 else 0.0
    return gain / forgetting if forgetting > 0 else math.inf


def per_nat_text(gain: Any, forgetting: Any, unit: str = "EM") -> str:
    """A gain per nat of forgetting in words: "no gain (−0.20)", "+0.30 with no forgetting", "15.0 EM per nat"."""
    if not (_ok(gain) and _ok(forgetting)):
        return "n/a"
    if gain <= 0:
        return f"no gain ({gain:+.2f})"
    if forgetting <= 0:
        return f"{gain:+.2f} with no forgetting"
    return f"{gain / forgetting:.2f} {unit} per nat"


def _finetune(v: Mapping[str, Any], measure: str) -> list[str]:
    out = []
    task, gain, cost = v.get("task"), v.get("gain"), v.get("forgetting")
    if _ok(gain) and gain <= 0:
        if measure == "answer_loss":
            a0, a1 = v.get("answer_loss") or (float("nan"),) * 2
            out.append(f"no gain on {task}: answer loss {a0:.2f} → {a1:.2f} (the claim needs a drop)")
        else:
            e0, e1 = v.get("exact_match") or (float("nan"),) * 2
            out.append(f"no gain on {task}: exact match {e0:.2f} → {e1:.2f} (the claim needs a rise)")
    if _ok(cost) and cost <= 0:
        g0, g1 = v.get("general_loss") or (float("nan"),) * 2
        out.append(f"no forgetting: held-out loss {g0:.3f} → {g1:.3f} ({cost:+.3f} nats; the claim needs > 0)")
    return out


def _distinct(v: Mapping[str, Any]) -> list[str]:
    out = [f"cos {pair} {c:.2f} > {MAX_COSINE}" for pair, c in (v.get("cosines") or {}).items()
           if _ok(c) and c > MAX_COSINE]
    for task, shares in (v.get("off_task_share") or {}).items():
        out += [f"the {other} fine-tune gains {_pct(s)} of the {task} fine-tune's gain on {task} (the claim allows "
                f"{_pct(MAX_OFF_TASK_SHARE)})" for other, s in shares.items() if _ok(s) and s > MAX_OFF_TASK_SHARE]
    return out


def _wise_ft(v: Mapping[str, Any], unit: str) -> list[str]:
    out = []
    for name, m in v.items():
        if _ok(m.get("recovered")) and m["recovered"] <= 0:
            out.append(f"{name}: recovers {_pct(m['recovered'])} of the forgetting (the claim needs > 0%)")
        if _ok(m.get("kept")) and m["kept"] <= 0:
            out.append(f"{name}: keeps {_pct(m['kept'])} of the {unit} (the claim needs > 0%)")
    return out


def _fapm(v: Mapping[str, Any], unit: str) -> list[str]:
    out = []
    for name, m in v.items():
        f = (m.get("fapm_gain"), m.get("fapm_forgetting"))
        w = (m.get("wise_gain"), m.get("wise_forgetting"))
        if not all(_ok(x) for x in (*f, *w)):
            continue
        if efficiency(*f) <= efficiency(*w):
            out.append(f"{name}: FAPM {per_nat_text(*f, unit)} vs WiSE-FT {per_nat_text(*w, unit)} (the claim needs "
                       f"FAPM above)")
    return out


def _linearity(v: Mapping[str, Any]) -> list[str]:
    out = []
    for name, by in v.items():
        whole = by.get("model")
        if not _ok(whole):
            continue
        worse = [f"{lv} {nls_text(s)}" for lv, s in by.items() if lv != "model" and _ok(s) and s >= whole]
        if worse:
            out.append(f"{name}: NLS " + ", ".join(worse) + f" not below the whole model's {nls_text(whole)}")
    return out


def _merge(v: Mapping[str, Any]) -> list[str]:
    mean, ref = v.get("mean_share"), v.get("average_mean_share")
    if not (_ok(mean) and _ok(ref)):
        return []
    return [f"keeps {_pct(mean)} of the fine-tunes' gains on average, the {method_title(REFERENCE_MERGE)} "
            f"{_pct(ref)} (the claim needs more)"]


def why_not(claim, measure: str = "exact_match") -> str:
    """Why `claim` (a `forgetlab.zoo.claims.Claim`, stored or fresh) does not hold here: its failing numbers
    against the claim's threshold, "; "-joined; "" when it holds; a short note when it could not be measured."""
    if claim.holds:
        return ""
    if claim.holds is None:
        return "not measurable here (no gain to compare with)"
    kind = claim.key.split(":", 1)[0]
    v = claim.values or {}
    unit = "EM gain" if measure == "exact_match" else "answer-loss drop"
    reasons: Iterable[str] = {
        "finetune": lambda: _finetune(v, measure),
        "distinct": lambda: _distinct(v),
        "wise_ft": lambda: _wise_ft(v, unit),
        "fapm": lambda: _fapm(v, "EM" if measure == "exact_match" else "nats of answer loss"),
        "linearity": lambda: _linearity(v),
        "merge": lambda: _merge(v),
        "sequence": lambda: [str(what) for what, ok in v.get("checks", []) if not ok],
    }.get(kind, list)()
    return "; ".join(reasons) or "below the claim's threshold (see the measured numbers)"


def held_text(marks: Iterable[Optional[str]]) -> str:
    """"7 of 9 claims hold" (one claim: "1 of 1 claim holds"), with the unmeasurable ones counted apart."""
    marks = list(marks)
    held, unknown = marks.count("✓"), marks.count("–")
    verb = "holds" if len(marks) == 1 else "hold"
    text = f"{held} of {len(marks)} claim{'s' if len(marks) != 1 else ''} {verb}"
    return text + (f" ({unknown} not measurable)" if unknown else "")
