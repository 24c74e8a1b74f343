"""What a zoo shows about forgetting as a process: the papers' claims on task sequences, measured on the zoo.

`sequence_claims(result)` reads a task sequence (forgetlab.train.sequence_results.SequenceResult) with the chains
adamw, mofo, sfa, proximal, ewc, replay and mofo+replay, and returns one `Claim` per headline, each with its numbers
and whether it holds *on this zoo* (a claim's `values` keep its checks, so that
`forgetlab.zoo.claim_reasons.why_not` words a stored one). The score is exact match; OP and BWT are TRACE's (docs/methods.md#sequence-
metrics); "retained" is the share of the first task's gain left at the end.

- `sequence:forgets` (catastrophic forgetting): naive sequential fine-tuning (AdamW) erases much of the earlier
  tasks — its BWT is below 0 and the first task keeps less than half of its gain.
- `sequence:sfa` (Soup to go): SFA retains the earlier tasks about as well as data replay (its BWT within
  `SFA_REPLAY_MARGIN` of replay's, or above it) and better than AdamW (a higher BWT).
- `sequence:mofo` (MoFO §4.3): MoFO has a higher OP and a higher BWT than AdamW.
- `sequence:between` (MoFO's rebuttal): EWC and proximal GD each sit between AdamW and MoFO, in OP and in BWT.
- `sequence:mofo+replay` (MoFO's rebuttal, "orthogonal combination"): MoFO + replay has a higher OP and BWT than
  MoFO alone and than replay alone.
"""
from __future__ import annotations

import math
from typing import Any

from forgetlab.train.sequence_results import SequenceResult
from forgetlab.zoo.claims import Claim

SFA_REPLAY_MARGIN = 0.05
"""How close SFA's BWT must come to replay's (exact match, TRACE) to count as "about as well"."""
SEQUENCE_METHODS_NEEDED = ("adamw", "mofo", "sfa", "proximal", "ewc", "replay", "mofo+replay")
"""The chains the claims read (forgetlab.train.sequence.DEFAULT_COMPARE)."""


def _point(result: SequenceResult, method: str) -> dict[str, float]:
    row = result.summary_frame().set_index(["method", "score"]).loc[(method, "exact_match")]
    return {"op": float(row["op"]), "bwt": float(row["bwt_trace"]), "retained": result.retained_gain(method)}


def _between(x: float, a: float, b: float) -> bool:
    return min(a, b) <= x <= max(a, b)


def _claim(key: str, text: str, source: str, checks: list[tuple[str, bool]], numbers: str,
           points: dict[str, dict[str, float]]) -> Claim:
    """A claim that holds when every check does; `values` keep the checks (what each says and whether it passed)
    and the chains' OP, BWT and retained gain, so that a stored claim explains itself
    (forgetlab.zoo.claim_reasons.why_not)."""
    return Claim(key, text, source, all(ok for _, ok in checks), numbers,
                 {"checks": [[what, bool(ok)] for what, ok in checks], "points": points})


def sequence_claims(result: SequenceResult) -> list[Claim]:
    """The sequence claims of the module docstring, measured on `result` (which must hold every chain of
    `SEQUENCE_METHODS_NEEDED`)."""
    missing = [m for m in SEQUENCE_METHODS_NEEDED if m not in result.methods]
    if missing:
        raise KeyError(f"the sequence claims need the chains {', '.join(missing)}")
    p = {m: _point(result, m) for m in SEQUENCE_METHODS_NEEDED}
    a, mo, sfa, prox, ewc, rep, mr = (p[m] for m in SEQUENCE_METHODS_NEEDED)
    first = result.order[0]

    def opb(m: str) -> str:
        return f"{m} OP {p[m]['op']:.2f}, BWT {p[m]['bwt']:+.3f}"

    kept = a["retained"]
    claims = [
        _claim("sequence:forgets", "training on later tasks erases much of an earlier one: sequential AdamW has a "
                                   f"negative BWT and {first} keeps less than half of its gain",
               "catastrophic forgetting",
               [(f"AdamW's BWT is {a['bwt']:+.3f}, not below 0", a["bwt"] < 0),
                (f"{first} keeps {kept:.0%} of its gain, not less than half",
                 kept == kept and kept < 0.5)],
               f"AdamW: BWT {a['bwt']:+.3f}; {first} keeps {kept:.0%} of its gain" if kept == kept else
               f"AdamW: BWT {a['bwt']:+.3f}", {"adamw": a}),
        _claim("sequence:sfa", "SFA keeps the earlier tasks about as well as data replay and better than AdamW",
               "Soup to go",
               [(f"SFA's BWT {sfa['bwt']:+.3f} is not above AdamW's {a['bwt']:+.3f}", sfa["bwt"] > a["bwt"]),
                (f"SFA's BWT {sfa['bwt']:+.3f} is more than {SFA_REPLAY_MARGIN:g} below replay's {rep['bwt']:+.3f}",
                 sfa["bwt"] >= rep["bwt"] - SFA_REPLAY_MARGIN)],
               f"BWT: SFA {sfa['bwt']:+.3f}, replay {rep['bwt']:+.3f}, AdamW {a['bwt']:+.3f}",
               {"sfa": sfa, "replay": rep, "adamw": a}),
        _claim("sequence:mofo", "MoFO has a higher OP and a higher BWT than AdamW", "MoFO",
               [(f"MoFO's OP {mo['op']:.2f} is not above AdamW's {a['op']:.2f}", mo["op"] > a["op"]),
                (f"MoFO's BWT {mo['bwt']:+.3f} is not above AdamW's {a['bwt']:+.3f}", mo["bwt"] > a["bwt"])],
               f"{opb('mofo')}; {opb('adamw')}", {"mofo": mo, "adamw": a}),
        _claim("sequence:between", "EWC and proximal GD sit between AdamW and MoFO, in OP and in BWT",
               "MoFO (rebuttal: EWC and proximal GD baselines)",
               [(f"{name}'s {what} {q[what]:.3f} is outside [{min(a[what], mo[what]):.3f}, "
                 f"{max(a[what], mo[what]):.3f}]", _between(q[what], a[what], mo[what]))
                for name, q in (("EWC", ewc), ("proximal GD", prox)) for what in ("op", "bwt")],
               f"{opb('ewc')}; {opb('proximal')}; {opb('adamw')}; {opb('mofo')}",
               {"ewc": ewc, "proximal": prox, "adamw": a, "mofo": mo}),
        _claim("sequence:mofo+replay", "MoFO with data replay beats MoFO alone and replay alone, in OP and in BWT",
               "MoFO (rebuttal: orthogonal combination)",
               [(f"MoFO + replay's {what} {mr[what]:.3f} is not above {name}'s {q[what]:.3f}", mr[what] > q[what])
                for name, q in (("MoFO", mo), ("replay", rep)) for what in ("op", "bwt")],
               f"{opb('mofo+replay')}; {opb('mofo')}; {opb('replay')}", {"mofo+replay": mr, "mofo": mo, "replay": rep}),
    ]
    return claims


def sequence_table(result: SequenceResult) -> list[dict[str, Any]]:
    """The demo's table, one row per chain: OP, BWT (TRACE, exact match), the first task's retained gain, the
    general loss after the last stage and the chain's seconds."""
    rows = []
    for c in result.chains:
        pt = _point(result, c.method)
        rows.append({"method": c.method, "op": pt["op"], "bwt": pt["bwt"],
                     "retained": None if math.isnan(pt["retained"]) else pt["retained"],
                     "general_loss": c.stages[-1].general_loss, "seconds": round(c.seconds, 1)})
    return rows
