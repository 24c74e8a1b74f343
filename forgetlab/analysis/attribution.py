"""Where is the forgetting? Per-submodule maps of what each part of a task vector buys and costs.

For a fine-tuned model θ1 = θ0 + τ (a full fine-tune or a LoRA adapter, τ = its ΔW) and a task, the task vector
is cut into parts τ = Σk τk at a level (docs/methods.md notation; parts from `forgetlab.core.anatomy.Anatomy`):

- ``layer``:  one part per decoder layer, plus ``embed`` (embeddings), ``norm`` (final norm), ``lm_head``;
- ``module``: per layer ``attn``, ``mlp`` and ``norm`` (its layer norms), plus ``embed``, ``norm``, ``lm_head``;
- ``head``:   as ``module`` with each layer's attention cut into heads (head h: its q rows, its kv group's k/v
  rows and its o_proj columns — `Anatomy.head_slices`); attention entries that belong to no head (an o_proj
  bias, q/k norms) are one more ``attn`` part with no head. Under grouped-query attention the k/v rows are
  shared by the heads of a group: the part being studied is written last, so only-this of head h includes its
  group's k/v rows and leave-one-out of head h removes them;
- ``expert`` (a mixture of experts only): as ``module`` with each layer's experts cut one by one (expert e: index e
  of the fused 3-D expert tensors, `Anatomy.expert_slices`, or a checkpoint's ``experts.{e}.…`` tensors); the
  router and a shared expert stay in the layer's ``mlp`` part.

Two maps, each scored by `forgetlab.core.evaluate.evaluate` (generality: general loss; speciality: exact match and
answer loss on the task):

- **only_this**:     θ0 + α·τk (α = 1 by default), d = its value − the base's;
- **leave_one_out**: θ0 + τ − (1 − α)·τk (α = 0 by default: τk removed), d = its value − the fine-tune's.

Passing ``alphas`` evaluates every part along a line of α values instead of the 0/1 point. Additivity
(`AttributionResult.additivity`) compares Σk d over the parts with the whole: fine-tune − base for only_this,
base − fine-tune for leave_one_out (a ratio of 1 means the parts add up exactly).

Memory and cost: ONE working copy (`forgetlab.merge.working_copy.WorkingCopy`) is rewritten in place, and only the
tensors whose α changes between two evaluations are rewritten (read lazily from θ0/θ1). A part whose τ is zero is not
evaluated (its model is the reference bit for bit, so both d are 0); its rows are flagged ``zero_tau``. The
result reports the seconds and the number of evaluations.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import pandas as pd
import torch

from forgetlab.analysis.attribution_inputs import check_level, resolve_attribution
from forgetlab.analysis.attribution_memory import estimate_attribution
from forgetlab.analysis.attribution_results import KIND, AttributionResult, AttributionRow, card_scores, takeaway
from forgetlab.analysis.base import ANALYSES, Analysis, pool_source
from forgetlab.analysis.linearity_results import NonlinearityResult
from forgetlab.analysis.sweeps import check_swept_model
from forgetlab.core.anatomy import Anatomy
from forgetlab.core.errors import ParameterError, check_fraction
from forgetlab.core.evaluate import Scorecard, evaluate
from forgetlab.core.memory import job_dtype
from forgetlab.core.progress import Progress, report, scaled
from forgetlab.core.settings import count_field, device_field, dtype_field, setting
from forgetlab.core.workspace import list_runs
from forgetlab.merge.methods.interpolation import wise_ft
from forgetlab.merge.methods.submodule import format_alphas, parse_alphas
from forgetlab.merge.recipes import ModelEntry, Recipe
from forgetlab.merge.working_copy import WorkingCopy
from forgetlab.plots.attribution import figures

# ------------------------------------------------------------------------------------------------ parts


@dataclass(frozen=True)
class Part:
    """One submodule of a level: its key (``"3"``, ``"3.mlp"``, ``"3.attn.h1"``, ``"3.mlp.e2"``, ``"embed"``,
    ``"norm"``, ``"lm_head"``), layer (None outside the layers), module (``layer``, ``attn``, ``mlp``, ``norm``,
    ``expert``, ``embed``, ``lm_head``), head (the head's or the expert's index), its whole tensors and its tensor
    slices (head and expert levels)."""

    key: str
    layer: Optional[int]
    module: str
    head: Optional[int]
    tensors: tuple[str, ...] = ()
    slices: tuple = ()

    def tensor_names(self) -> list[str]:
        """The names of the tensors the part writes (whole or sliced), each once."""
        return list(dict.fromkeys([*self.tensors, *(s.name for s in self.slices)]))


def _outside_part(anatomy, name: str) -> str:
    part = anatomy.role(name).part
    if name.endswith("lm_head.weight") or part in ("lm_head", "embed_out"):
        return "lm_head"
    if part in ("embed_tokens", "wte", "wpe") or "embed" in part:
        return "embed"
    return "norm"


def parts_of(anatomy, names: Sequence[str], level: str) -> list[Part]:
    """The parts of `level` over the parameter `names` (a partition of them, heads aside: see the module
    docstring), in model order: the embeddings, then layer by layer, then the final norm and lm_head."""
    level = check_level(level)
    if level in ("head", "expert"):
        anatomy.check_level(level)
    by_layer: dict[int, dict[str, list[str]]] = {}
    outside: dict[str, list[str]] = {}
    for n in names:
        r = anatomy.role(n)
        if r.layer is None:
            outside.setdefault(_outside_part(anatomy, n), []).append(n)
        else:
            by_layer.setdefault(r.layer, {}).setdefault(r.module or "norm", []).append(n)
    parts: list[Part] = []
    if "embed" in outside:
        parts.append(Part("embed", None, "embed", None, tuple(outside["embed"])))
    have = set(names)
    for i in sorted(by_layer):
        mods = by_layer[i]
        if level == "layer":
            parts.append(Part(str(i), i, "layer", None, tuple(n for m in mods.values() for n in m)))
            continue
        for module in ("attn", "mlp", "norm"):
            tensors = mods.get(module, [])
            if not tensors:
                continue
            if level == "head" and module == "attn":
                sliced: set[str] = set()
                for h in range(anatomy.num_heads):
                    sl = tuple(s for s in anatomy.head_slices(i, h) if s.name in have)
                    sliced.update(s.name for s in sl)
                    parts.append(Part(f"{i}.attn.h{h}", i, "attn", h, (), sl))
                rest = tuple(n for n in tensors if n not in sliced)
                if rest:
                    parts.append(Part(f"{i}.attn", i, "attn", None, rest))
                continue
            if level == "expert" and module == "mlp":
                taken: set[str] = set()
                for e in range(anatomy.num_experts):
                    whole = tuple(n for n in anatomy.expert_tensors(i, e) if n in have)
                    sl = tuple(s for s in anatomy.expert_slices(i, e) if s.name in have)
                    taken.update(whole, (s.name for s in sl))
                    parts.append(Part(f"{i}.mlp.e{e}", i, "expert", e, whole, sl))
                rest = tuple(n for n in tensors if n not in taken)     # the router, a shared expert
                if rest:
                    parts.append(Part(f"{i}.mlp", i, "mlp", None, rest))
                continue
            parts.append(Part(f"{i}.{module}", i, module, None, tuple(tensors)))
    for key in ("norm", "lm_head"):
        if key in outside:
            parts.append(Part(key, None, key, None, tuple(outside[key])))
    return parts


# ------------------------------------------------------------------------------------------- the checks


def check(pool, model: str, **settings) -> None:
    """Raise the ForgetlabError that `attribute(pool, model, **settings)` would raise for bad settings (level,
    model, task, probe data, empty selection, α line), without loading the model — the app's pre-check."""
    resolve_attribution(pool, model, settings.get("task"), settings.get("level", "module"), settings.get("select"),
                        settings.get("alphas"))


# ------------------------------------------------------------------------------------------ the writing


class _Writer:
    """Writes θ0 + c·τ into the working copy, c given per part, rewriting only tensors whose c changed."""

    def __init__(self, work, parts: Sequence[Part]):
        self.work = work
        self.parts = list(parts)
        self.whole: dict[str, str] = {}
        self.sliced: dict[str, list[tuple[str, Any]]] = {}
        for p in self.parts:
            for n in p.tensors:
                self.whole[n] = p.key
            for s in p.slices:
                self.sliced.setdefault(s.name, []).append((p.key, s))
        self.state: dict[str, Any] = {}
        self.written = 0

    @staticmethod
    def _mix(w0: torch.Tensor, w1: torch.Tensor, c: float) -> torch.Tensor:
        return wise_ft(w0, w1, c)       # θ0 + c·τ, the registry's WiSE-FT (c = 0 and 1 exact)

    def signature(self, name: str, coef: Mapping[str, float], focus: Optional[str], rest: float):
        if name in self.whole:
            return coef.get(self.whole[name], rest)
        pieces = self.sliced.get(name)
        if not pieces:
            return rest
        order = sorted(pieces, key=lambda kp: kp[0] == focus)   # the studied part is written last
        return (rest, tuple((k, coef.get(k, rest)) for k, _ in order))

    def write(self, coef: Mapping[str, float], focus: Optional[str] = None, rest: float = 0.0) -> None:
        """Set every tensor: c = coef[part] (parts not in coef: `rest`; tensors in no part: `rest`)."""
        with torch.no_grad():
            for name in self.work.names:
                sig = self.signature(name, coef, focus, rest)
                if self.state.get(name) == sig:
                    continue
                w0 = self.work.base[name]
                w1 = self.work.tuned[name]
                if isinstance(sig, tuple):
                    out = self._mix(w0, w1, sig[0]).clone()
                    pieces = {k: s for k, s in self.sliced[name]}
                    for k, c in sig[1]:
                        idx = pieces[k].index(out.ndim)
                        out[idx] = self._mix(w0, w1, c)[idx]
                else:
                    out = self._mix(w0, w1, sig)
                self.work.access.write(name, out)
                self.state[name] = sig
                self.written += 1

    def tau_norms(self) -> dict[str, float]:
        """‖τk‖ of every part (slices: the norm of τ over the slice)."""
        sq = {p.key: 0.0 for p in self.parts}
        for name in self.work.names:
            if name not in self.whole and name not in self.sliced:
                continue
            tau = self.work.tuned[name] - self.work.base[name]
            if name in self.whole:
                sq[self.whole[name]] += _sum_squares(tau)
            for k, s in self.sliced.get(name, []):
                sq[k] += _sum_squares(tau[s.index(tau.ndim)])
            del tau
        return {k: math.sqrt(v) for k, v in sq.items()}


def _sum_squares(t: torch.Tensor, piece: int = 1 << 20) -> float:
    """Σ t² accumulated in float64, over pieces of `piece` entries: a float64 copy of a whole embedding's τ
    and its square were the job's largest temporaries (4× the tensor's float32 bytes)."""
    flat = t.reshape(-1)
    return float(sum(float(flat[i:i + piece].double().pow(2).sum()) for i in range(0, flat.numel(), piece)))


# ---------------------------------------------------------------------------------------------- the maps


def attribute(pool, model: str, *, task: Optional[str] = None, level: str = "module",
              select: Optional[Sequence[str]] = None, alphas: Optional[Sequence[float]] = None,
              device: Optional[str] = None, batch_size: int = 16, max_general: Optional[int] = None,
              max_task: Optional[int] = None, dtype=None, progress: Progress = None) -> AttributionResult:
    """The only-this and leave-one-out maps of `model`'s task vector at `level` (see the module docstring).

    only_this k:     θ0 + α·τk,             d = scores − base's          (α = 1 unless `alphas` is given);
    leave_one_out k: θ0 + τ − (1 − α)·τk,   d = scores − fine-tune's     (α = 0 unless `alphas` is given).
    `select` restricts the map to some part keys (``"3.mlp"``, ``"2"``, ``"embed"`` …); the others then stay
    at the reference (θ0 for only_this, θ1 for leave_one_out). Evaluation limits as in `forgetlab.analysis.sweeps`.
    Speciality is teacher-forced exact match on `task` (default: the task named in the model's name).
    `dtype` (None: bfloat16 on cuda, float32 elsewhere) is the working copy's precision; each tensor is written
    from θ0 + c·τ computed in float32 and the losses are computed from float32 logits. Peak: the estimator in
    `forgetlab.analysis.attribution_memory`.
    """
    task, sel, grid = resolve_attribution(pool, model, task, level, select, alphas)
    start = time.perf_counter()
    report(progress, 0.0, f"loading a working copy of {model}")
    work = WorkingCopy.load(pool, model, device=device, dtype=job_dtype(dtype, device))
    anatomy = Anatomy.from_model(work.model)   # from the model: an untested family's heads are checked first
    parts = parts_of(anatomy, work.names, level)
    if sel is not None:
        known = {p.key for p in parts}
        unknown = [s for s in sel if s not in known]
        if unknown:
            raise ParameterError(f"No submodule {', '.join(map(repr, unknown))} at the {level} level; its keys are: "
                                 f"{', '.join(p.key for p in parts)}.")
        chosen = [p for p in parts if p.key in set(sel)]
    else:
        chosen = parts
    writer = _Writer(work, parts)
    report(progress, 0.01, "measuring the task vector of every submodule")
    norms = writer.tau_norms()
    total = math.sqrt(sum(v * v for v in norms.values()))
    if total == 0.0:
        raise ParameterError(f"{model} has no task vector: its weights equal the base's everywhere, so there is "
                             "nothing to attribute. Pick a fine-tuned model that differs from the base.")
    zero = [p.key for p in chosen if norms[p.key] == 0.0]
    if len(zero) == len(chosen):
        raise ParameterError(f"{model}'s task vector is zero on every selected submodule ({', '.join(zero)}); "
                             "select submodules that fine-tuning changed.")
    notes = []
    if zero:
        notes.append(f"zero task vector (not evaluated, d = 0): {', '.join(zero)}")
    kw = dict(batch_size=batch_size, max_general=max_general, max_task=max_task, tasks=[task])
    only_grid = grid or [1.0]
    loo_grid = grid or [0.0]
    n_eval = 2 + sum(len(only_grid) + len(loo_grid) for p in chosen if p.key not in zero)
    state = {"done": 0, "evals": 0}

    def run_eval(label: str) -> tuple[Scorecard, float]:
        t0 = time.perf_counter()
        lo = 0.02 + 0.98 * state["done"] / n_eval
        hi = 0.02 + 0.98 * (state["done"] + 1) / n_eval
        card = evaluate(work.model, pool.tokenizer, pool.probes, name=f"{model}:{label}",
                        progress=scaled(progress, lo, hi), **kw)
        state["done"] += 1
        state["evals"] += 1
        report(progress, hi, f"{label} ({state['done']}/{n_eval})")
        return card, time.perf_counter() - t0

    writer.write({}, rest=0.0)
    base_card, _ = run_eval("base")
    base = card_scores(base_card, task)
    rows: list[AttributionRow] = []

    def add(m: str, p: Part, a: float, sc: dict[str, float], ref: dict[str, float], secs: float, z: bool):
        rows.append(AttributionRow(
            map=m, key=p.key, layer=p.layer, module=p.module, head=p.head, alpha=float(a),
            general_loss=sc["general_loss"], speciality=sc["speciality"], answer_loss=sc["answer_loss"],
            d_general_loss=sc["general_loss"] - ref["general_loss"], d_speciality=sc["speciality"] - ref["speciality"],
            d_answer_loss=sc["answer_loss"] - ref["answer_loss"], tau_norm=norms[p.key],
            tau_share=(norms[p.key] / total) ** 2, zero_tau=z, seconds=secs))

    only_rows: list[tuple[Part, float, dict, float]] = []
    for p in chosen:
        for a in only_grid:
            if p.key in zero:
                only_rows.append((p, a, None, 0.0))
                continue
            writer.write({p.key: a}, focus=p.key, rest=0.0)
            card, secs = run_eval(f"only {p.key} α={a:g}")
            only_rows.append((p, a, card_scores(card, task), secs))
    writer.write({}, rest=1.0)
    ft_card, _ = run_eval("fine-tune")
    ft = card_scores(ft_card, task)
    for p, a, sc, secs in only_rows:
        if sc is None:      # θ0 + a·0 = θ0: the base's scores
            sc = dict(base)
        add("only_this", p, a, sc, base, secs, p.key in zero)
    for p in chosen:
        for a in loo_grid:
            if p.key in zero:
                add("leave_one_out", p, a, dict(ft), ft, 0.0, True)
                continue
            writer.write({p.key: a}, focus=p.key, rest=1.0)
            card, secs = run_eval(f"without {p.key} α={a:g}")
            add("leave_one_out", p, a, card_scores(card, task), ft, secs, False)
    recipe = {"analysis": KIND, "pool": pool_source(pool),
              "pool_name": getattr(pool, "name", None), "model": model, "task": task, "level": level,
              "select": sel, "alphas": grid or None, "max_general": max_general, "max_task": max_task,
              "batch_size": batch_size}
    result = AttributionResult(model=model, task=task, level=level, base=base_card, finetuned=ft_card, rows=rows,
                               seconds=time.perf_counter() - start, evaluations=state["evals"],
                               tensors_written=writer.written, notes=notes, recipe=recipe)
    report(progress, 1.0, f"{len(chosen)} submodules, {result.evaluations} evaluations in {result.seconds:.1f} s")
    return result


# ------------------------------------------------------------------------------------------ the recipe


def recipe_from_map(pool, model: str, keep: Sequence[str] | Mapping[str, float], *, default: float = 0.0,
                    name: Optional[str] = None):
    """A `submodule_alpha` merge recipe (`forgetlab.merge.methods.submodule`): θk = θ0,k + αk·τk.

    `keep` is a list of part keys (α = 1 for each: a mask keeping those parts of τ) or a mapping key → α; every
    other submodule gets `default` (0: the base's weights). Layer and module keys are accepted; head and expert
    keys are not (a merge applies one α per tensor): pick at the module level instead.
    """
    check_swept_model(pool, model)
    alphas = dict(keep) if isinstance(keep, Mapping) else {str(k): 1.0 for k in keep}
    if not alphas:
        raise ParameterError("No submodule chosen: pick at least one submodule to keep in the recipe.")
    heads = [k for k in alphas if re.search(r"\.(h|e)\d+$", k)]
    if heads:
        raise ParameterError(f"A merge recipe gives one α per tensor; head and expert parts ({', '.join(heads)}) "
                             "cannot be kept alone. Choose at the module or layer level.")
    alphas = parse_alphas(alphas)
    check_fraction("default", default)
    return Recipe(method="submodule_alpha", base=str(pool.checkpoint("base").path),
                  models=[ModelEntry(str(pool.checkpoint(model).path))],
                  params={"alphas": format_alphas(alphas), "default": float(default)},
                  name=name or f"{model}-submodules")


def nls_keys(frame: pd.DataFrame) -> dict[str, float]:
    """Part keys → mean NLS from a linearity table (`forgetlab.analysis.linearity_results.NonlinearityResult
    .to_frame`): level ``layer`` → ``"3"``, ``attn``/``mlp`` → ``"3.attn"``/``"3.mlp"``, ``head`` →
    ``"3.attn.h1"``, ``expert`` (its index in the head column) → ``"3.mlp.e2"``."""
    out: dict[str, float] = {}
    for _, r in frame.iterrows():
        if pd.isna(r.get("layer")):
            continue
        i, level = int(r["layer"]), r["level"]
        key = {"layer": f"{i}", "attn": f"{i}.attn", "mlp": f"{i}.mlp"}.get(level)
        if level == "head" and not pd.isna(r.get("head")):
            key = f"{i}.attn.h{int(r['head'])}"
        if level == "expert" and not pd.isna(r.get("head")):
            key = f"{i}.mlp.e{int(r['head'])}"
        if key is not None and not pd.isna(r["nls_mean"]):
            out[key] = float(r["nls_mean"])
    return out


def linearity_nls(model: str, task: Optional[str] = None, home_path: str | Path | None = None) -> dict[str, float]:
    """NLS per part key from the newest saved linearity run of `model` (and `task`), {} when there is none."""
    for run in list_runs(home_path, kind="linearity"):
        if run.recipe.get("model") != model or (task is not None and run.recipe.get("task") != task):
            continue
        try:
            return nls_keys(NonlinearityResult.from_dict(run.results).to_frame())
        except (KeyError, TypeError, ValueError):
            continue
    return {}


# ------------------------------------------------------------------------------------------ the analysis

SHOWN = ["map", "key", "alpha", "d_general_loss", "d_speciality", "d_answer_loss", "tau_share", "zero_tau"]


@dataclass
class AttributionSettings:
    """What an attribution map measures: `model`'s task vector cut at `level` (optionally only the parts in
    `select`), each part switched on alone and left out, at the α values `alphas`, judged on `task`."""

    model: Optional[str] = setting(None, help="the fine-tuned model (or LoRA adapter) of the pool", required=True)
    task: Optional[str] = setting(None, help="task whose exact match is the speciality (default: the task named in "
                                             "the model's name)")
    level: str = setting("module", help="layer, module (attn/mlp/norm per layer), head, or expert (a mixture of "
                                        "experts: each expert of each layer)")
    select: Optional[tuple[str, ...]] = setting(None, help="only these submodule keys (e.g. 3.mlp 2 embed)")
    alphas: Optional[tuple[float, ...]] = setting(None, help="an α line per submodule instead of 0/1, e.g. 0,0.5,1",
                                                  range=(0.0, 1.0), label="α line per part (optional)")
    max_general: Optional[int] = count_field(None, "at most this many general-text blocks")
    max_task: Optional[int] = count_field(None, "at most this many eval pairs per task")
    batch_size: int = count_field(16, "evaluation batch size")
    device: Optional[str] = device_field(default_cuda=True)
    dtype: Optional[str] = dtype_field("the working copy and its forward passes")


def _arguments(settings: AttributionSettings) -> dict:
    """`attribute`'s keyword arguments (besides the model) from the settings."""
    values = asdict(settings)
    del values["model"]
    for name in ("select", "alphas"):
        values[name] = list(values[name]) if values[name] is not None else None
    return values


def check_settings(settings: AttributionSettings, pool=None) -> None:
    """Refuse an unknown level (and, with the pool, a bad model, task, selection or α line) without loading
    the model."""
    check_level(settings.level)
    if pool is not None:
        check(pool, settings.model, **_arguments(settings))


def compute(pool, settings: AttributionSettings, progress: Progress = None, executor=None) -> AttributionResult:
    """`attribute` with these settings."""
    return attribute(pool, settings.model, progress=progress, **_arguments(settings))


def estimate(pool, settings: AttributionSettings):
    """The map's peak (`estimate_attribution`)."""
    return estimate_attribution(pool, settings.model, **_arguments(settings))


def recipe(result: AttributionResult) -> dict:
    """What a saved map records: the settings it ran with (its pool, model, task, level, selection, α line and
    evaluation limits)."""
    out = dict(result.recipe)
    out.setdefault("model", result.model)
    out.setdefault("task", result.task)
    return out


def cli_report(result: AttributionResult) -> list:
    """The CLI's lines: what was mapped and what it cost, both reference scores, the notes, the map and the
    additivity table."""
    b, f = result.scores("base"), result.scores("finetuned")
    return [f"attribution of {result.model} on {result.task} at the {result.level} level: {result.evaluations} "
            f"evaluations, {result.tensors_written} tensor writes in {result.seconds:.1f} s",
            f"base: general loss {b['general_loss']:.4f}, exact match {b['speciality']:.4f}; fine-tune: general "
            f"loss {f['general_loss']:.4f}, exact match {f['speciality']:.4f}",
            *[f"note: {note}" for note in result.notes],
            result.to_frame()[SHOWN], "additivity (sum of the parts against the whole):", result.additivity()]


ANALYSIS = ANALYSES.add(KIND, Analysis(
    KIND, "attribution map", AttributionSettings, compute, AttributionResult,
    help="per-submodule map: what each part of the task vector buys and costs",
    description="For each submodule k: only-this (θ0 + τk, d against the base) and leave-one-out (θ0 + τ − τk, d "
                "against the fine-tune) of general loss, exact match and answer loss, with the additivity of the "
                "parts. One working copy of the model is rewritten in place.",
    checks=check_settings, estimate_fn=estimate, figures_fn=figures, measured=True, recipe=recipe,
    report=cli_report, takeaway_fn=takeaway))
