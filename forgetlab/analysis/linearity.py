"""Non-linearity scores of a fine-tuned model and of its submodules (docs/methods.md#submodule-levels).

For a submodule k with base parameters θ0,k and task vector τk, and an input x that the submodule receives:

- distance curve  d_x(α) = ‖f(x; θ0 + α·τ) − f(x; θ0 + τ)‖ / ‖f(x; θ0) − f(x; θ0 + τ)‖,  α ∈ {0, 0.1, …, 0.9};
  perfect linearity gives d(α) = 1 − α;
- non-linearity score  NLS_x = Σα |d_x(α) − (1 − α)|, reported as mean ± std (population std) over samples;
- Property 1 residual  r_x = meanα ‖f(x; θ0 + α·τ) − f(x; θ0) − α·(f(x; θ0 + τ) − f(x; θ0))‖ / ‖f(x; θ0 + τ) − f(x; θ0)‖
  (0 for a submodule whose features are affine in α).

Norms are Frobenius norms over every (non-padding) token position and feature of one sample.
Levels: ``model`` (features: last hidden state of the decoder), ``layer`` (a decoder block), ``attn``, ``mlp`` and
``head`` (head h's contribution to the attention output: softmax(q_h k_gᵀ·scale) v_g times head h's columns of
the output projection; the per-head contributions plus the output bias sum to the attention output), and for
a mixture of experts ``expert`` (expert e's output on the tokens the capture pass routed to it, without the
routing weight; `forgetlab.core.submodules.one_expert`).

How it stays cheap: the inputs of every layer, attention and MLP are captured ONCE with forward hooks (by default
from the fine-tuned model's forward pass on the task's probe samples; ``capture="base"`` uses the base) together
with the keyword arguments the module received (rotary position embeddings, attention mask). They are held fixed
while one working copy of the model is interpolated in place, layer by layer, to θ0 + α·τ, and each submodule is
re-run on its cached input. All heads of a layer come out of one computation. With the input fixed, the
attention's q/k/v projections (and rotary embeddings) and the MLP's input projections are affine in the
parameters, so they are computed at α = 0 and 1 only and interpolated: per α, the attention and MLP levels
cost only their core and output projection (`_LayerRerun`). The layer level re-runs the whole block per α —
its MLP input depends on α through the normalised attention output — so the full table costs at least about
twice the model level. `direct_scores` is the slow reference: one full forward pass per α per submodule.
"""
from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from forgetlab.analysis.base import ANALYSES, Analysis, Output
from forgetlab.analysis.linearity_memory import estimate_linearity
from forgetlab.analysis.linearity_results import NonlinearityResult, SubmoduleScore, takeaway
from forgetlab.core.anatomy import DENSE_LEVELS, LEVELS, Anatomy
from forgetlab.core.errors import ParameterError
from forgetlab.core.memory import job_dtype
from forgetlab.core.progress import Progress, report
from forgetlab.core.settings import count_field, device_field, dtype_field, seed_field, setting
from forgetlab.core.submodules import (CAPTURES, LayerInputs, attend, attention_and_heads, attention_bias,
                                       attention_from_projections, attention_is_affine, attention_projections,
                                       attention_shortcut, capture_inputs, check_head_decomposition,
                                       check_same_structure, encode_samples, last_hidden, mlp_from_projections,
                                       mlp_projections, param_dict, run_submodule, select_pairs, split_heads)
from forgetlab.merge.working_copy import WorkingCopy
from forgetlab.plots.linearity import figures

DEFAULT_ALPHAS = tuple(round(0.1 * i, 1) for i in range(10))
"""α ∈ {0, 0.1, …, 0.9} (docs/methods.md)."""
DEFAULT_LEVELS = None
"""None: every level the model has (`forgetlab.core.anatomy.Anatomy.levels`: the dense ones, plus ``expert`` for a
mixture of experts)."""


class DistanceCurve:
    """Accumulates d(α) and the Property 1 residual for one submodule (or all heads of a layer) on a chunk.

    With u = f(α) − f(1) and Δ = f(1) − f(0) (padding zeroed): d = ‖u‖ / ‖Δ‖ and the residual is
    ‖u + (1 − α)·Δ‖ / ‖Δ‖ = ‖f(α) − f(0) − α·(f(1) − f(0))‖ / ‖f(1) − f(0)‖ — four tensor passes per α."""

    def __init__(self, f1: torch.Tensor, f0: torch.Tensor, mask: torch.Tensor, alphas: Sequence[float]):
        self.alphas = list(alphas)
        dt = f1.dtype if f1.dtype == torch.float64 else torch.float32
        self.m = (mask[:, None, :, None] if f1.dim() == 4 else mask[:, :, None]).to(dt)
        self.f1m = f1.to(dt) * self.m
        self.neg_f1m = -self.f1m
        self.delta = (f1.to(dt) - f0.to(dt)) * self.m
        self.den = torch.linalg.vector_norm(self.delta, dim=(-1, -2)).double()
        ref = torch.linalg.vector_norm(self.f1m, dim=(-1, -2)).double()
        dead = self.den <= 1e-7 * (ref + 1e-30)
        self.den = torch.where(dead, torch.full_like(self.den, float("nan")), self.den)
        shape = tuple(self.den.shape) + (len(self.alphas),)
        self.d = torch.full(shape, float("nan"), dtype=torch.float64)
        self.res = torch.full(shape, float("nan"), dtype=torch.float64)

    def add(self, alpha: float, fa: torch.Tensor) -> None:
        j = self.alphas.index(alpha)
        u = torch.addcmul(self.neg_f1m, fa.to(self.f1m.dtype), self.m)
        self.d[..., j] = torch.linalg.vector_norm(u, dim=(-1, -2)).double() / self.den
        u.add_(self.delta, alpha=1.0 - float(alpha))
        self.res[..., j] = torch.linalg.vector_norm(u, dim=(-1, -2)).double() / self.den

    def finish(self) -> "DistanceCurve":
        """Drop the feature tensors once every α is in (keeps only the per-sample numbers)."""
        self.m = self.f1m = self.neg_f1m = self.delta = None
        return self


def _lerp_all(a: tuple, b: tuple, alpha: float) -> tuple:
    return tuple(torch.lerp(x, y, float(alpha)) for x, y in zip(a, b))


def _same(fast: torch.Tensor, ref: torch.Tensor, tol: float = 1e-4) -> bool:
    return bool((fast - ref).abs().max() <= tol * max(1.0, float(ref.abs().max())))


class _LayerRerun:
    """The outputs of one layer's submodules (``layer``, ``attn``, ``mlp``, ``head``, ``expert``) of the working
    copy on their cached inputs, for the α its parameters are currently set to.

    Why it is cheap: with the input held fixed, the attention's q/k/v projections and the MLP's input
    projections are affine in the parameters, so they are computed at α = 0 and α = 1 only and interpolated
    for every other α; per α only the attention core, the output projections and the whole layer are re-run.
    Call `outputs` for the capture α first, then for the other end (0 or 1), then any other α. The attention
    shortcut is used only where `attention_shortcut` says it can be exact (Llama-style separate q/k/v, GPT-2);
    whether a shortcut reproduces its module is checked once per layer against the capture pass's own outputs
    (``fast`` holds the verdict per (module kind, layer)); where it does not, the module is re-run whole by
    transformers and the heads read from its output projection's input (`attention_and_heads`)."""

    def __init__(self, work: WorkingCopy, anatomy: Anatomy, layer: int, cap: LayerInputs, levels: Sequence[str],
                 cap_alpha: float, fast: dict[str, bool]):
        self.work, self.anatomy, self.layer, self.cap = work, anatomy, layer, cap
        self.levels, self.cap_alpha, self.fast = tuple(levels), cap_alpha, fast
        self.attn = work.module(anatomy.attn_path(layer))
        self.mlp = work.module(anatomy.mlp_path(layer))
        self.ends: dict[tuple[str, float], Optional[tuple]] = {}
        self.affine_heads = attention_is_affine(self.attn)
        self.shortcut = attention_shortcut(anatomy, self.attn, cap.attn_kwargs)

    def _attention(self, qkv: tuple, per_head: bool) -> torch.Tensor:
        if self.affine_heads:
            return attend(self.anatomy, self.attn, *qkv, self.cap.attn_kwargs, per_head=per_head)
        return attention_from_projections(self.anatomy, self.attn, *qkv, self.cap.attn_kwargs, per_head=per_head)

    def _projections(self, kind: str, alpha: float) -> Optional[tuple]:
        if alpha in (0.0, 1.0):
            if kind == "attn":
                got = attention_projections(self.anatomy, self.attn, self.cap.attn_input())
                if self.affine_heads:  # rotary embeddings are linear too: apply them to the two ends only
                    got = split_heads(self.anatomy, self.attn, *got, self.cap.attn_kwargs)
            else:
                got = mlp_projections(self.anatomy, self.mlp, self.cap.mlp_input())
            self.ends[(kind, alpha)] = got
            return got
        lo, hi = self.ends[(kind, 0.0)], self.ends[(kind, 1.0)]
        return None if lo is None else _lerp_all(lo, hi, alpha)

    def _verified(self, kind: str, fast_out: Optional[torch.Tensor]) -> bool:
        key = (kind, self.layer)
        if key not in self.fast:
            self.fast[key] = fast_out is not None and _same(fast_out, self.cap.outputs[kind])
        return self.fast[key]

    def _fast(self, kind: str) -> bool:
        return bool(self.fast.get((kind, self.layer)))

    def _attention_levels(self, alpha: float, at_capture: bool) -> dict[str, torch.Tensor]:
        a, want_heads, outs = self.anatomy, "head" in self.levels, {}
        if self.shortcut:
            qkv = self._projections("attn", alpha)
            if at_capture or self._fast("attn"):
                heads = self._attention(qkv, per_head=True) if want_heads else None
                if heads is not None:
                    bias = attention_bias(a, self.attn)
                    total = heads.sum(1) + (bias if bias is not None else 0)
                else:
                    total = self._attention(qkv, per_head=False)
                if at_capture:
                    self._verified("attn", total)
                if self._fast("attn"):
                    return {"attn": total, **({"head": heads} if want_heads else {})}
        elif at_capture:
            self._verified("attn", None)
        # one computation path for every α, so that an unchanged module gives bitwise-equal ends
        if want_heads:
            outs["attn"], outs["head"] = attention_and_heads(a, self.attn, self.cap.attn_args, self.cap.attn_kwargs)
        else:
            outs["attn"] = run_submodule(self.work, a, self.layer, "attn", self.cap)
        return outs

    def outputs(self, alpha: float) -> dict[str, torch.Tensor]:
        """``{level: features}`` at the working copy's current parameters (θ0 + α·τ on this layer)."""
        a, cap, outs = self.anatomy, self.cap, {}
        at_capture = alpha == self.cap_alpha  # the capture pass ran these very inputs at these parameters
        if "head" in self.levels or "attn" in self.levels:
            got = self._attention_levels(alpha, at_capture)
            outs.update({k: v for k, v in got.items() if k in self.levels})
        if "mlp" in self.levels:
            pre = self._projections("mlp", alpha)
            fast_out = None
            if pre is not None and (at_capture or self._fast("mlp")):
                fast_out = mlp_from_projections(a, self.mlp, pre)
            if at_capture:
                self._verified("mlp", fast_out)
            outs["mlp"] = fast_out if self._fast("mlp") and fast_out is not None else run_submodule(
                self.work, a, self.layer, "mlp", cap)
        if "expert" in self.levels:
            outs["expert"] = run_submodule(self.work, a, self.layer, "expert", cap)
        if "layer" in self.levels:
            outs["layer"] = cap.outputs["layer"] if at_capture else run_submodule(self.work, a, self.layer, "layer",
                                                                                  cap)
        return outs


def check_alphas(alphas) -> tuple:
    """The α grid as a tuple of floats: distinct, in [0, 1) (α = 1 is the reference); ParameterError otherwise."""
    try:
        al = tuple(float(a) for a in alphas)
    except (TypeError, ValueError):
        raise ParameterError(f"alphas must be numbers in [0, 1); got {alphas!r}.") from None
    if not al:
        raise ParameterError("alphas is empty; pass e.g. 0,0.1,...,0.9.")
    if any(not (0.0 <= a < 1.0) for a in al) or len(set(al)) != len(al):
        raise ParameterError(f"alphas must be distinct numbers in [0, 1) (α = 1 is the reference); got {al}.")
    return al


def check_levels(levels, anatomy: Optional[Anatomy], anatomy_error: Optional[Exception]) -> tuple:
    """The asked levels, each once, in order (None: every level the model has, `Anatomy.levels`);
    ParameterError for none, an unknown one, one the model lacks (``expert`` on a dense model), or a submodule
    level on an architecture whose anatomy forgetlab cannot read (`anatomy_error` says why)."""
    if levels is None:
        levels = anatomy.levels if anatomy is not None else DENSE_LEVELS
    lv = tuple(dict.fromkeys([levels] if isinstance(levels, str) else levels))
    if not lv:
        raise ParameterError(f"No level asked; choose from {', '.join(LEVELS)}.")
    for level in lv:
        if level not in LEVELS:
            raise ParameterError(f"Unknown level {level!r}; choose from {', '.join(LEVELS)}.")
        if level != "model" and anatomy is None:
            raise ParameterError(f"The {level!r} level is unavailable for this architecture: {anatomy_error}")
        if anatomy is not None:
            anatomy.check_level(level)
    return lv


@dataclass
class _Inputs:
    base: Any
    finetuned: Any
    tokenizer: Any
    pairs: list
    task: str
    model_name: str
    template: Optional[str]


def resolve_models(pool_or_models, task: Optional[str], model: Optional[str] = None,
                   device: Optional[str] = None) -> _Inputs:
    """(base, fine-tuned, tokenizer, probe pairs) from a ModelPool (the fine-tuned model is ``model``, else the
    one named like the task, else the pool's only model) or from a ``(base, finetuned, tokenizer, pairs)``
    tuple."""
    if isinstance(pool_or_models, (tuple, list)):
        if len(pool_or_models) != 4:
            raise ParameterError("Pass a ModelPool or a (base_model, finetuned_model, tokenizer, pairs) tuple.")
        base, ft, tok, pairs = pool_or_models
        return _Inputs(base, ft, tok, list(pairs or []), task or "task", model or "finetuned", None)
    pool = pool_or_models
    model = pool.model_for_task(task, model)
    data = pool.probes.task(task)
    base = pool.load("base", device=device)
    ft = pool.load(model, device=device)
    return _Inputs(base, ft, pool.tokenizer, list(data.probe), task, model, getattr(pool.probes, "template", None))


def _lean_inputs(pool_or_models, task, model, device, dtype) -> tuple[_Inputs, WorkingCopy, Any]:
    """The inputs and the one model the job holds. From a pool: the base loaded afresh in `dtype` as the working
    copy, θ0 and θ1 read from the checkpoints one tensor at a time when a layer is interpolated (the pool's
    cached models are not loaded), so the peak is about one model in `dtype` plus one layer's extra. From a
    tuple: a copy of the given base (cast to `dtype` when one is given), θ1 the fine-tuned model's parameters."""
    if isinstance(pool_or_models, (tuple, list)):
        inp = resolve_models(pool_or_models, task, model)
        check_same_structure(inp.base, inp.finetuned)
        work = WorkingCopy.of(inp.base)
        if dtype is not None:
            work.model.to(dtype)
        return inp, work, param_dict(inp.finetuned)

    pool = pool_or_models
    name = pool.model_for_task(task, model)
    data = pool.probes.task(task)
    work = WorkingCopy.load(pool, name, device=device, dtype=job_dtype(dtype, device))
    inp = _Inputs(None, None, pool.tokenizer, list(data.probe), task, name, getattr(pool.probes, "template", None))
    return inp, work, work.tuned


def nonlinearity_scores(pool_or_models, task: Optional[str] = None, *, model: Optional[str] = None,
                        levels: Optional[Sequence[str]] = DEFAULT_LEVELS,
                        alphas: Sequence[float] = DEFAULT_ALPHAS, samples: Optional[int] = 30,
                        seed: Optional[int] = None, capture: str = "finetuned",
                        batch_size: int = 8, max_length: int = 128, device: Optional[str] = None, dtype=None,
                        progress: Progress = None) -> NonlinearityResult:
    """Distance curves d_x(α), non-linearity scores NLS_x and Property 1 residuals (docs/methods.md#distance-curve,
    #nls, #property-1) at every requested level (None: every level the model has), layer, head and expert, on
    ``samples`` probe pairs of ``task``: the first ones, or — with a ``seed`` — drawn at random with that seed
    (`select_pairs`, docs/methods.md#probe-draws).

    ``pool_or_models`` is a `forgetlab.core.pool.ModelPool` or a ``(base, finetuned, tokenizer, pairs)`` tuple.
    Submodule inputs are captured once per batch from the ``capture`` model ("finetuned" or "base") and held
    fixed; each submodule is re-run on them with parameters θ0 + α·τ (see the module docstring).
    ``dtype`` (None: bfloat16 on cuda, float32 elsewhere; a tuple's models keep theirs) is the precision of the
    forward passes; distances and norms are reduced in float32 (`DistanceCurve`). Its peak: `estimate_linearity`.
    """
    if capture not in CAPTURES:
        raise ParameterError(f"capture must be one of {', '.join(CAPTURES)}; got {capture!r}.")
    al = check_alphas(alphas)
    inp, work, target = _lean_inputs(pool_or_models, task, model, device, dtype)
    pairs = select_pairs(inp.pairs, samples, inp.task, seed)
    try:
        anatomy, an_err = Anatomy.from_model(work.model), None
    except ParameterError as exc:
        anatomy, an_err = None, exc
    lv = check_levels(levels, anatomy, an_err)
    if batch_size < 1:
        raise ParameterError(f"batch_size must be ≥ 1; got {batch_size}.")

    enc = encode_samples(inp.tokenizer, pairs, max_length=max_length, template=inp.template)
    device_ = next(work.model.parameters()).device
    cap_alpha = 1.0 if capture == "finetuned" else 0.0
    # α = 1 first (reference), then 0 (denominator), then the grid
    order = [1.0, 0.0] + [a for a in al if a not in (0.0, 1.0)]
    sub = [x for x in lv if x != "model"]
    layers = list(range(anatomy.num_layers)) if sub else []
    chunks = [(i, min(i + batch_size, len(enc))) for i in range(0, len(enc), batch_size)]
    steps_per_chunk = (len(order) if "model" in lv else 0) + len(layers) * len(order) + 1
    total_steps = max(1, steps_per_chunk * len(chunks))
    step = 0
    acc: dict[tuple, list] = {}
    head_checked = False
    fast: dict[str, bool] = {}  # per module kind: does the projection shortcut reproduce the module? (checked once)

    def tick(msg):
        nonlocal step
        step += 1
        report(progress, step / total_steps, msg)

    with torch.no_grad():
        for ci, (a, b) in enumerate(chunks):
            chunk = enc.chunk(a, b)
            ids = chunk.input_ids.to(device_)
            mask = chunk.mask().to(device_)
            work.lerp(target, cap_alpha)
            caps, h_cap = (capture_inputs(work.model, anatomy, ids, layers, want_last_hidden="model" in lv,
                                          want_outputs=True)
                           if anatomy is not None else ({}, last_hidden(work.model, None, ids)))
            tick(f"captured inputs of samples {a + 1}-{b}")
            if "model" in lv:
                curve = None
                f_first = None
                for alpha in order:
                    if alpha == cap_alpha:
                        fa = h_cap
                    else:
                        work.lerp(target, alpha)
                        fa = last_hidden(work.model, anatomy, ids)
                    if alpha == 1.0:
                        f_first = fa
                    elif alpha == 0.0:
                        curve = DistanceCurve(f_first, fa, mask, al)
                    if alpha in al:
                        curve.add(alpha, fa)
                    tick(f"model level, α = {alpha:g}")
                acc.setdefault(("model", None), []).append(curve.finish())
            for i in layers:
                names = anatomy.params_of("layer", layer=i)
                ends: dict[str, dict[float, torch.Tensor]] = {}
                curves: dict[str, DistanceCurve] = {}
                rerun = _LayerRerun(work, anatomy, i, caps[i], sub, cap_alpha, fast)
                # the capture α first (it checks the shortcuts), then the other end, then the grid
                for alpha in [cap_alpha, 1.0 - cap_alpha] + order[2:]:
                    work.lerp(target, alpha, names)
                    outs = rerun.outputs(alpha)
                    if "head" in outs and not head_checked:
                        check_head_decomposition(work, anatomy, i, caps[i], outs["head"])
                        head_checked = True
                    for level, fa in outs.items():
                        if alpha in (0.0, 1.0):
                            ends.setdefault(level, {})[alpha] = fa
                            if len(ends[level]) == 2:
                                curves[level] = DistanceCurve(ends[level][1.0], ends[level][0.0], mask, al)
                                if 0.0 in al:
                                    curves[level].add(0.0, ends[level][0.0])
                        elif alpha in al:
                            curves[level].add(alpha, fa)
                    tick(f"layer {i}, α = {alpha:g}")
                for level, c in curves.items():
                    acc.setdefault((level, i), []).append(c.finish())
                ends.clear()
                caps[i] = None  # this layer's inputs are no longer needed
            del caps

    scores = []
    for level in lv:
        keys = [k for k in acc if k[0] == level]
        for key in keys:
            parts = acc[key]
            d = torch.cat([p.d for p in parts], dim=0).numpy()
            res = torch.cat([p.res for p in parts], dim=0).numpy()
            ideal = 1.0 - np.asarray(al)
            if level in ("head", "expert"):
                for h in range(d.shape[1]):
                    where = (anatomy.attn_path(key[1]) + f".head{h}" if level == "head"
                             else f"{anatomy.experts_path(key[1])}.{h}")
                    scores.append(make_score(level, key[1], h, where, d[:, h, :], res[:, h, :], ideal))
            else:
                path = anatomy.module_path(level, key[1]) if anatomy is not None else "model"
                scores.append(make_score(level, key[1], None, path, d, res, ideal))
    report(progress, 1.0, "done")
    return NonlinearityResult(inp.task, inp.model_name, al, len(pairs), capture, lv, scores, seed)


def make_score(level, layer, head, module, d, res, ideal) -> SubmoduleScore:
    """A submodule's scores from its d(α) per sample `d` and Property 1 residuals `res` [samples, alphas]:
    NLS_x = Σα |d_x(α) − ideal(α)| and the mean residual per sample."""
    nls = np.abs(d - ideal[None, :]).sum(axis=1)  # NaN where the submodule did not change
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        r = np.nanmean(res, axis=1)
    return SubmoduleScore(level, layer, head, module, d, nls, r)


# ------------------------------------------------------------------------------------------ the analysis


@dataclass
class LinearitySettings:
    """What a linearity run computes: `model`'s non-linearity on `task`'s probe samples at `levels`, over the
    α grid, with submodule inputs captured from the `capture` model."""

    task: Optional[str] = setting(None, help="task whose probe samples are used", required=True)
    model: Optional[str] = setting(None, help="fine-tuned model (default: the one named like the task)")
    levels: Optional[tuple[str, ...]] = setting(DEFAULT_LEVELS, help="levels to score (default: every level the "
                                                "model has; expert for a mixture of experts)", choices=LEVELS)
    alphas: tuple[float, ...] = setting(DEFAULT_ALPHAS, help="α grid, comma-separated; α = 1 is the reference",
                                        range=(0.0, 1.0), label="α grid")
    samples: Optional[int] = count_field(30, "probe samples per task")
    seed: Optional[int] = seed_field("seed of the random draw of the probe samples (default: the first ones, no "
                                     "draw)", default=None)
    capture: str = setting("finetuned", help="model whose forward pass gives the submodule inputs",
                           choices=CAPTURES)
    batch_size: int = count_field(8, "probe samples per forward pass")
    max_length: int = count_field(128, "tokens per sample at most", cli=False)
    device: Optional[str] = device_field()
    dtype: Optional[str] = dtype_field("the forward passes")


def check_settings(settings: LinearitySettings, pool=None) -> None:
    """What the declarations cannot say: a distinct α grid below 1, levels named once; with the pool, the task
    and the model exist."""
    check_alphas(settings.alphas)
    if pool is not None:
        pool.check_tasks([settings.task])
        pool.check_models([settings.model] if settings.model is not None else [])


def compute(pool, settings: LinearitySettings, progress: Progress = None, executor=None) -> NonlinearityResult:
    """`nonlinearity_scores` with these settings."""
    values = asdict(settings)
    return nonlinearity_scores(pool, values.pop("task"), progress=progress, **values)


def estimate(pool, settings: LinearitySettings):
    """The run's peak (`estimate_linearity`)."""
    values = asdict(settings)
    return estimate_linearity(pool, values.pop("task"), **values)


def recipe(result: NonlinearityResult) -> dict:
    """What a saved linearity run records (besides its pool)."""
    return {"task": result.task, "model": result.model, "levels": list(result.levels),
            "alphas": list(result.alphas), "samples": result.samples, "capture": result.capture,
            **({"seed": result.seed} if result.seed is not None else {})}


def cli_report(result: NonlinearityResult) -> list:
    """The CLI's lines: what was scored, the scores by level, a note on unchanged submodules, the table."""
    lines: list = [f"{result.model} on {result.task}: {result.samples} samples, inputs from the {result.capture} "
                   "model", result.by_level()]
    note = result.unchanged_note()
    if note:
        lines.append(note)
    return lines + [result.flat_frame().drop(columns=["curve", "curve_std"])]


ANALYSIS = ANALYSES.add("linearity", Analysis(
    "linearity", "non-linearity scores", LinearitySettings, compute, NonlinearityResult,
    help="non-linearity scores (NLS) and d(α) curves per model/layer/attn/mlp/head/expert",
    description="Distance curves d(α) and non-linearity scores NLS = Σα |d(α) − (1 − α)| of a fine-tuned model "
                "and of each submodule, re-run on inputs captured once (docs/methods.md#submodule-levels).",
    checks=check_settings, estimate_fn=estimate, figures_fn=figures, recipe=recipe,
    table=NonlinearityResult.flat_frame, report=cli_report, takeaway_fn=takeaway,
    outputs=(Output("--curves", "CSV file for the long d(α) table", NonlinearityResult.curves_frame),)))
