"""What a zoo shows: the papers' headline claims, measured on the zoo's own models.

`zoo_claims(pool)` evaluates the base, every fine-tuned model (full and LoRA), WiSE-FT α = 0.5 and FAPM at
ratio 0.9 of every full fine-tune, the non-linearity scores of the model and its submodules, and four merges of
the full fine-tunes (task arithmetic, TIES, PCB, submodule-linearity merging "slwm") beside their plain
weight average; and returns a `ZooClaims` — one `Claim` per headline, each with its numbers and whether it
holds *on this zoo*. Nothing is copied from constants: change a model and the table changes.

The claims (speciality = exact match on the model's own task unless `measure="answer_loss"`; generality =
held-out general loss; "gain" = improvement over the base; "forgetting" = general loss − the base's):

- `finetune` (one row per model): fine-tuning gains the task and costs general ability — holds when the
  speciality gain is > 0 and the forgetting is > 0.
- `distinct`: the full fine-tunes learned different things, as real tasks do — every pairwise cosine of their
  task vectors (over all tensors) is ≤ 0.3 and no off-task fine-tune gains more than a third of the own-task
  fine-tune's speciality gain on a task (what makes sign conflicts and interference, hence TIES & co., matter).
- `wise_ft` (WiSE-FT paper): θ(0.5) = (θ0 + θ1)/2 recovers part of the general loss while keeping part of the
  speciality — holds for a model when 0 < recovered share of the forgetting and 0 < kept share of the gain.
- `fapm` (FAPM paper): FAPM at pruning ratio 0.9 keeps more speciality per unit of forgetting than WiSE-FT
  α = 0.5 — speciality gain / forgetting, a model with gain > 0 and no forgetting ranking above any ratio.
- `linearity` (submodule-linearity paper): each submodule level (layer/attn/mlp/head) has a lower mean
  non-linearity score (NLS) than the whole model, measured as the Linearity page measures it at its defaults.
- `merge:<method>` (each method's own paper, from its registry declaration): the merge of the full fine-tunes
  keeps a share of each model's own-task gain over the base; it holds when the mean share beats that of the
  plain weight average of the fine-tunes (`linear`, the "mean of the fine-tunes").

A claim over several models holds when it holds for every one of them; its numbers say for how many it did.
`ZooClaims.to_frame` words them for the page (`forgetlab.zoo.claim_reasons`: groups, display names, papers, and
why a claim fails).
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pandas as pd

from forgetlab.analysis.linearity import LinearitySettings, nonlinearity_scores
from forgetlab.analysis.retention import gain_share, oriented_speciality, recovered_share
from forgetlab.analysis.sweeps import alpha_curve, pruning_curve
from forgetlab.core.taskvectors import cosine_matrix
from forgetlab.core.errors import ParameterError
from forgetlab.core.evaluate import check_limits, evaluate, forgetting_text
from forgetlab.core.progress import Progress, report, scaled
from forgetlab.core.submodules import SUBMODULE_LEVELS
from forgetlab.merge.api import merge_state_dicts
from forgetlab.merge.methods.slwm import slwm_weights
from forgetlab.merge.registry import PrepareContext, get_method, validate_params
from forgetlab.zoo.claim_reasons import (MAX_COSINE, MAX_OFF_TASK_SHARE, REFERENCE_MERGE, claim_group, claim_source,
                                         claim_text, efficiency, merge_claim_text, nls_text, why_not)
from forgetlab.zoo.manifest import manifest_beside

MERGE_METHODS = ("task_arithmetic", "ties", "pcb", "slwm")
# every merge of several full fine-tunes that the claims can measure: the seeds' methods, mergekit's that merge many
# models (multislerp is SLERP generalised to many models; slerp itself takes one), and the 2024–25 closed forms
CLAIMABLE_MERGES = (*MERGE_METHODS, "multislerp", "model_stock", "della", "lines", "tsv", "iso_c", "iso_cts", "cart",
                    "localize_stitch", "regmean", "regmean_pp", "fisher")
# parameters that differ from the registry's defaults, where the default does nothing (DELLA at density 1 drops
# nothing): recorded in each row's values
CLAIM_PARAMS: dict[str, dict[str, Any]] = {"della": {"density": 0.5}}
MEASURES = ("exact_match", "answer_loss")
NLS_SAMPLES = LinearitySettings().samples
"""The claims' NLS is the Linearity page's at its defaults: this many probe samples (and its α grid)."""


@dataclass
class Claim:
    """One headline claim as measured: key, the claim in words, the paper, whether it holds, a short text of
    the numbers, and the raw values (per model / task)."""

    key: str
    claim: str
    source: str
    holds: Optional[bool]
    numbers: str
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def mark(self) -> str:
        """✓ when the claim holds, ✗ when it does not, – when it could not be measured."""
        return "–" if self.holds is None else ("✓" if self.holds else "✗")


@dataclass
class ZooClaims:
    """The measured claims of one pool, with the settings and the seconds it took to measure them."""

    claims: list[Claim]
    settings: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_frame(self) -> pd.DataFrame:
        """One row per claim, in the words of the app (`forgetlab.zoo.claim_reasons`, so that claims stored by an
        older build read the same): its group, ✓/✗/– (`holds`), the claim (a merge named as the app names its
        method), why it does not hold (its numbers against the claim's threshold; "" where it holds), the
        measured numbers, the paper it comes from, and its key."""
        measure = self.settings.get("measure", "exact_match")
        rows = [{"group": claim_group(c.key), "holds": c.mark, "claim": claim_text(c.key, c.claim),
                 "why not": why_not(c, measure), "measured": c.numbers + self._note(c),
                 "source": claim_source(c.key, c.source), "key": c.key} for c in self.claims]
        return pd.DataFrame(rows, columns=["group", "holds", "claim", "why not", "measured", "source", "key"])

    def _note(self, claim: Claim) -> str:
        """What differs from the Linearity page for an NLS measured on other settings (claims of older builds)."""
        samples = self.settings.get("nls_samples")
        if claim.key != "linearity" or samples in (None, NLS_SAMPLES):
            return ""
        return (f" — measured on {samples} probe samples; the Linearity page's default, {NLS_SAMPLES}, gives other "
                "NLS values")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (round-trips through `from_dict`; non-finite numbers become None)."""
        return _finite({"claims": [asdict(c) for c in self.claims], "settings": dict(self.settings),
                        "seconds": self.seconds})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ZooClaims":
        """Rebuild a result saved with `to_dict`."""
        return cls(claims=[Claim(**c) for c in d.get("claims", [])], settings=dict(d.get("settings") or {}),
                   seconds=float(d.get("seconds", 0.0)))

    def get(self, key: str) -> Claim:
        """The claim with `key` (e.g. `wise_ft`, `finetune:math`, `merge:ties`)."""
        for c in self.claims:
            if c.key == key:
                return c
        raise ParameterError(f"No claim {key!r}; the claims are: {', '.join(c.key for c in self.claims)}.")


# ------------------------------------------------------------------------------------------------ helpers

def _finite(x: Any) -> Any:
    """`x` with every NaN/±inf float replaced by None (strict JSON has no such numbers)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _pct(x: float) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.0f}%"


def _all(flags: Sequence[Optional[bool]]) -> Optional[bool]:
    known = [f for f in flags if f is not None]
    return None if not known else all(known)


def _count(flags: Sequence[Optional[bool]]) -> str:
    known = [f for f in flags if f is not None]
    return f"holds for {sum(known)}/{len(known)}" if known else "not measurable"


def model_tasks(pool, models: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """Model → own task: given, or every pool model whose name is a task (`math`) or `lora-<task>`."""
    if models is not None:
        out = dict(models)
    else:
        tasks = set(pool.task_names)
        out = {}
        for name in pool.model_names:
            t = name[5:] if name.startswith("lora-") else name
            if t in tasks:
                out[name] = t
    for name, task in out.items():
        pool.check_models([name])
        pool.check_tasks([task], where=f" (for model {name!r})")
    if not out:
        raise ParameterError("No model of the pool is named after one of its tasks (`<task>` or `lora-<task>`); "
                             "pass models={model: task}.")
    return out


def _state_dict(model) -> dict:
    return {k: v.detach() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------------------------------ claims

def zoo_claims(pool, *, models: Optional[Mapping[str, str]] = None, measure: str = "exact_match",
               max_general: Optional[int] = 32, max_task: Optional[int] = 50, nls_samples: int = NLS_SAMPLES,
               slwm_samples: int = 12, merges: Sequence[str] = MERGE_METHODS, batch_size: int = 16,
               progress: Progress = None) -> ZooClaims:
    """Measure the papers' headline claims on `pool` (see the module docstring) and return a `ZooClaims`.

    `models` maps model → own task (default: models named `<task>` are full fine-tunes, `lora-<task>`
    adapters). Every evaluation uses the first `max_general` held-out blocks and `max_task` eval pairs per
    task; linearity uses `nls_samples` probe pairs per model (default: the Linearity page's, so that both show one
    number for a model's NLS) on the Linearity analysis' α grid, slwm `slwm_samples` per task. Full fine-tunes
    (not adapters) are interpolated, pruned and merged.
    """
    if measure not in MEASURES:
        raise ParameterError(f"measure must be one of {', '.join(MEASURES)}; got {measure!r}.")
    check_limits(max_general=max_general, max_task=max_task, batch_size=batch_size)
    for label, n in (("nls_samples", nls_samples), ("slwm_samples", slwm_samples)):
        if int(n) < 1:
            raise ParameterError(f"{label} must be a positive integer; got {n}.")
    unknown = [m for m in merges if m not in CLAIMABLE_MERGES]
    if unknown:
        raise ParameterError(f"Unknown claim merge(s) {', '.join(unknown)}; choose from "
                             f"{', '.join(CLAIMABLE_MERGES)}.")
    if not pool.probes.general:
        raise ParameterError("The claims need held-out general text: add `probes: general:` to the pool file.")
    own = model_tasks(pool, models)
    full = {m: t for m, t in own.items() if not pool.entries[m].adapter}
    start = time.perf_counter()
    kw = dict(max_general=max_general, max_task=max_task, batch_size=batch_size)
    claims: list[Claim] = []

    # (a) fine-tuning gains the task and costs general ability
    report(progress, 0.0, "scoring the base and the fine-tuned models")
    tok = pool.tokenizer
    cards = {"base": evaluate(pool.load("base"), tok, pool.probes, name="base", **kw)}
    for i, name in enumerate(own):
        cards[name] = evaluate(pool.load(name), tok, pool.probes, name=name, **kw)
        report(progress, 0.25 * (i + 1) / len(own), f"scored {name}")
    base = cards["base"]
    for name, task in own.items():
        gain = oriented_speciality(cards[name], task, measure) - oriented_speciality(base, task, measure)
        cost = cards[name].forgetting(base)
        holds = gain > 0 and cost > 0
        em0, em1 = base.tasks[task].exact_match, cards[name].tasks[task].exact_match
        al0, al1 = base.tasks[task].answer_loss, cards[name].tasks[task].answer_loss
        claims.append(Claim(
            key=f"finetune:{name}", claim=f"fine-tuning {name} gains {task} and costs general ability",
            source=claim_source("finetune"), holds=holds,
            numbers=(f"{task} EM {em0:.2f} → {em1:.2f}, answer loss {al0:.2f} → {al1:.2f}; held-out loss "
                     f"{base.general_loss:.3f} → {cards[name].general_loss:.3f} ({forgetting_text(cost)})"),
            values={"task": task, "exact_match": [em0, em1], "answer_loss": [al0, al1],
                    "general_loss": [base.general_loss, cards[name].general_loss], "gain": gain,
                    "forgetting": cost}))

    # (a′) the tasks are distinct, as real ones are: near-orthogonal task vectors, little off-task gain
    if len(full) >= 2:
        claims.append(_distinct_claim(pool, full, cards, measure))

    # (b) WiSE-FT α = 0.5 and (c) FAPM ratio 0.9, per full fine-tune
    wise_vals, fapm_vals, wise_flags, fapm_flags = {}, {}, [], []
    n_full = max(1, len(full))
    for i, (name, task) in enumerate(full.items()):
        lo = 0.25 + 0.3 * i / n_full
        w = alpha_curve(pool, name, alphas=[0.5], task=task, tasks=[task], progress=scaled(progress, lo, lo + 0.1 / n_full), **kw)
        f = pruning_curve(pool, name, ratios=[0.9], scores=["fapm"], task=task, tasks=[task],
                          progress=scaled(progress, lo + 0.1 / n_full, lo + 0.3 / n_full), **kw)
        wc, fc = w.points[0].scorecard, f.points[0].scorecard
        ft, b = cards[name], base
        gain = oriented_speciality(ft, task, measure) - oriented_speciality(b, task, measure)
        forget = ft.forgetting(b)
        wgain = oriented_speciality(wc, task, measure) - oriented_speciality(b, task, measure)
        wforget = wc.forgetting(b)
        fgain = oriented_speciality(fc, task, measure) - oriented_speciality(b, task, measure)
        fforget = fc.forgetting(b)
        recovered = recovered_share(b, ft, wc)          # the general loss WiSE-FT won back
        kept = gain_share(b, ft, wc, task, measure)
        wflag = None if not (math.isfinite(recovered) and math.isfinite(kept)) else (recovered > 0 and kept > 0)
        wise_flags.append(wflag)
        wise_vals[name] = {"task": task, "recovered": recovered, "kept": kept, "general_loss": wc.general_loss,
                           "speciality": oriented_speciality(wc, task, measure), "distance": w.points[0].distance}
        weff, feff = efficiency(wgain, wforget), efficiency(fgain, fforget)
        fflag = None if gain <= 0 else feff > weff
        fapm_flags.append(fflag)
        fapm_vals[name] = {"task": task, "fapm_gain": fgain, "fapm_forgetting": fforget, "fapm_efficiency": feff,
                           "wise_gain": wgain, "wise_forgetting": wforget, "wise_efficiency": weff,
                           "fapm_distance": f.points[0].distance}
    unit = "EM gain" if measure == "exact_match" else "answer-loss drop"
    claims.append(Claim(
        key="wise_ft", claim="WiSE-FT α = 0.5 recovers part of the general loss and keeps part of the speciality",
        source=claim_source("wise_ft"), holds=_all(wise_flags),
        numbers="; ".join(f"{n}: recovers {_pct(v['recovered'])} of the forgetting, keeps {_pct(v['kept'])} of "
                          f"the {unit}" for n, v in wise_vals.items()) + f" ({_count(wise_flags)})",
        values=wise_vals))
    claims.append(Claim(
        key="fapm", claim="FAPM ratio 0.9 keeps more speciality per unit of forgetting than WiSE-FT α = 0.5",
        source=claim_source("fapm"), holds=_all(fapm_flags),
        numbers="; ".join(f"{n}: FAPM {_ratio_text(v['fapm_gain'], v['fapm_forgetting'])} vs WiSE-FT "
                          f"{_ratio_text(v['wise_gain'], v['wise_forgetting'])}" for n, v in fapm_vals.items())
        + f" ({unit} / nats of forgetting; {_count(fapm_flags)})",
        values=fapm_vals))

    # (d) submodules are more linear than the model
    lin_vals, lin_flags = {}, []
    for i, (name, task) in enumerate(full.items()):
        lo = 0.55 + 0.2 * i / n_full
        res = nonlinearity_scores(pool, task, model=name, levels=("model", *SUBMODULE_LEVELS),
                                  samples=nls_samples, alphas=LinearitySettings().alphas, progress=scaled(progress, lo, lo + 0.2 / n_full))
        by = {r["level"]: r["nls_mean"] for r in res.by_level().to_dict(orient="records")}
        subs = [by[lv] for lv in SUBMODULE_LEVELS if lv in by and math.isfinite(by[lv])]
        flag = None if not subs or not math.isfinite(by.get("model", float("nan"))) else all(
            s < by["model"] for s in subs)
        lin_flags.append(flag)
        lin_vals[name] = by
    claims.append(Claim(
        key="linearity", claim="submodules (layer/attn/mlp/head) score lower NLS than the whole model",
        source=claim_source("linearity"), holds=_all(lin_flags),
        numbers="; ".join(f"{n}: model {nls_text(v.get('model'))} vs " + "/".join(
            nls_text(v.get(lv)) for lv in SUBMODULE_LEVELS) for n, v in lin_vals.items())
        + f" (layer/attn/mlp/head; {nls_samples} probe samples; {_count(lin_flags)})",
        values=lin_vals))

    # (e) merges of the full fine-tunes against their weight average
    if len(full) >= 2 and merges:
        claims.extend(_merge_claims(pool, full, cards, measure, merges, slwm_samples, kw,
                                    scaled(progress, 0.75, 1.0)))
    seconds = round(time.perf_counter() - start, 3)
    report(progress, 1.0, f"claims measured in {seconds:.1f} s")
    settings = {"measure": measure, "max_general": max_general, "max_task": max_task, "nls_samples": nls_samples,
                "slwm_samples": slwm_samples, "merges": list(merges), "models": own, "batch_size": batch_size}
    return ZooClaims(claims=claims, settings=settings, seconds=seconds)


def _distinct_claim(pool, full: Mapping[str, str], cards: Mapping[str, Any], measure: str) -> Claim:
    """The full fine-tunes learned different things: every pairwise cosine of their task vectors (all tensors)
    is ≤ 0.3, and on every task an off-task fine-tune gains at most a third of the own-task fine-tune's gain."""
    names = list(full)
    cos = cosine_matrix(pool, names)
    pairs = {f"{full[a]}–{full[b]}": cos.values[i][j] for i, a in enumerate(names)
             for j, b in enumerate(names) if i < j}
    base = cards["base"]
    off: dict[str, dict[str, float]] = {}
    for owner, task in full.items():
        off[task] = {full[o]: gain_share(base, cards[owner], cards[o], task, measure)
                     for o in names if o != owner}
    worst_cos = max(pairs.values())
    worst_off = max((v for d in off.values() for v in d.values()), default=float("nan"))
    holds = (None if not (math.isfinite(worst_cos) and math.isfinite(worst_off))
             else worst_cos <= MAX_COSINE and worst_off <= MAX_OFF_TASK_SHARE)
    return Claim(
        key="distinct", claim="the tasks are distinct: task vectors near-orthogonal (cos ≤ 0.3), an off-task "
                              "fine-tune gains at most a third of the own-task gain",
        source=claim_source("distinct"), holds=holds,
        numbers=("cos " + ", ".join(f"{k} {v:.2f}" for k, v in pairs.items()) + "; off-task gain as a share of "
                 "the own-task gain: " + "; ".join(f"on {t}: " + ", ".join(f"{o} {_pct(v)}" for o, v in d.items())
                                                   for t, d in off.items())),
        values={"cosines": pairs, "off_task_share": off, "max_cosine": worst_cos, "max_off_task_share": worst_off})


def _ratio_text(gain: float, forgetting: float) -> str:
    if forgetting <= 0:
        return f"{gain:+.2f} with no forgetting"
    return f"{gain:+.2f}/{forgetting:.3f} = {gain / forgetting:.2f}"


def _merge_claims(pool, full: Mapping[str, str], cards: Mapping[str, Any], measure: str, merges: Sequence[str],
                  slwm_samples: int, kw: Mapping[str, Any], progress: Progress) -> list[Claim]:
    names = list(full)
    tasks = [full[n] for n in names]
    base_model = pool.load("base")
    base_sd = _state_dict(base_model)
    ft_sds = [_state_dict(pool.load(n)) for n in names]
    work = copy.deepcopy(base_model)
    base = cards["base"]
    methods = [REFERENCE_MERGE, *merges]
    shares: dict[str, dict[str, float]] = {}
    scored: dict[str, Any] = {}
    for i, method in enumerate(methods):
        report(progress, i / len(methods), f"merging with {method}")
        params = dict(CLAIM_PARAMS.get(method, {}))
        if method == "slwm":
            weights = slwm_weights(pool, tasks, models=names, samples=slwm_samples)
            merged = merge_state_dicts("slwm", base_sd, ft_sds, prepared=weights.coefficients(),
                                       config=base_model.config, samples=slwm_samples)
        elif method != REFERENCE_MERGE and get_method(method).needs_pool:
            # statistics from each fine-tune's own task probe split (RegMean's Gram matrices, Fisher's diagonal)
            spec = get_method(method)
            checked = validate_params(spec, {"samples": slwm_samples, "tasks": ",".join(tasks), **params},
                                      len(names))
            prepared = spec.prepare(PrepareContext(pool, None, [], names, checked))
            merged = merge_state_dicts(method, base_sd, ft_sds, prepared=prepared, config=base_model.config,
                                       samples=slwm_samples, tasks=",".join(tasks), **params)
        else:
            merged = merge_state_dicts(method, base_sd, ft_sds, config=base_model.config, **params)
        work.load_state_dict(merged, strict=False)
        card = evaluate(work, pool.tokenizer, pool.probes, name=f"merge:{method}", tasks=tasks, **kw)
        scored[method] = card
        shares[method] = {n: gain_share(base, cards[n], card, full[n], measure) for n in names}
    report(progress, 1.0, "merges scored")
    ref = shares[REFERENCE_MERGE]
    ref_mean = _mean(ref.values())
    out = []
    for method in merges:
        s = shares[method]
        mean = _mean(s.values())
        holds = None if not (math.isfinite(mean) and math.isfinite(ref_mean)) else mean > ref_mean
        card = scored[method]
        out.append(Claim(
            key=f"merge:{method}", claim=merge_claim_text(method), source=claim_source(f"merge:{method}"), holds=holds,
            numbers=(", ".join(f"{full[n]} {_pct(s[n])}" for n in names) + f" of the gain (mean {_pct(mean)}; "
                     f"weight average {_pct(ref_mean)}); held-out loss {card.general_loss:.3f} "
                     f"(base {base.general_loss:.3f}; {forgetting_text(card.forgetting(base))})"),
            values={"params": CLAIM_PARAMS.get(method, {}),
                    "shares": s, "mean_share": mean, "average_shares": ref, "average_mean_share": ref_mean,
                    "general_loss": card.general_loss,
                    "speciality": {full[n]: oriented_speciality(card, full[n], measure) for n in names}}))
    return out


def _mean(values) -> float:
    vals = [v for v in values if math.isfinite(v)]
    return sum(vals) / len(vals) if vals else float("nan")


def stored_claims(pool_or_path) -> Optional[ZooClaims]:
    """The claims a zoo build stored in the manifest beside a pool file (a `ModelPool` read from YAML, or the
    path of its pool.yaml or zoo folder); None for a pool that is not a zoo, or a zoo without claims."""
    data = (manifest_beside(pool_or_path) or {}).get("claims")
    try:
        return ZooClaims.from_dict(data) if isinstance(data, dict) and data.get("claims") else None
    except (ValueError, AttributeError, TypeError, KeyError):
        return None
