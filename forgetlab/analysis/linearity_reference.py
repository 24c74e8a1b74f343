"""The slow references of the linearity scores (docs/methods.md#distance-curve, #nls, #property-1), to test
`forgetlab.analysis.linearity.nonlinearity_scores` against and to measure what its cached inputs save
(bench/linearity_cost.py): `direct_scores` recomputes every submodule's features with one full forward pass of
the model per α, and `score_function` scores any function of its parameters.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from forgetlab.analysis.linearity import (DEFAULT_ALPHAS, DEFAULT_LEVELS, NonlinearityResult, SubmoduleScore,
                                          check_levels, DistanceCurve, make_score, check_alphas, resolve_models)
from forgetlab.core.anatomy import Anatomy
from forgetlab.core.errors import ParameterError
from forgetlab.core.progress import Progress, report
from forgetlab.core.submodules import (CAPTURES, capture_inputs, check_same_structure, encode_samples, first_tensor,
                                       last_hidden, param_dict, run_submodule, select_pairs)
from forgetlab.merge.methods.interpolation import wise_ft
from forgetlab.merge.working_copy import WorkingCopy


def score_function(fn, theta0, theta1, inputs: torch.Tensor, alphas: Sequence[float] = DEFAULT_ALPHAS,
                   level: str = "function", module: str = "fn") -> SubmoduleScore:
    """d_x(α), NLS_x and the Property 1 residual of any function ``fn(x, θ)`` on a batch of inputs
    (``inputs[i]`` is sample x_i; ``θ`` a tensor or a tuple of tensors, interpolated as θ0 + α·(θ1 − θ0)).
    The same formulas as `nonlinearity_scores`, for a submodule given as a plain function."""
    al = check_alphas(alphas)
    t0 = theta0 if isinstance(theta0, (tuple, list)) else (theta0,)
    t1 = theta1 if isinstance(theta1, (tuple, list)) else (theta1,)

    def feats(alpha):
        th = tuple(torch.lerp(a.double(), b.double(), float(alpha)) for a, b in zip(t0, t1))
        out = torch.stack([fn(x.double(), th if len(th) > 1 else th[0]) for x in inputs]).double()
        return out.reshape(out.shape[0], 1, -1)

    f1, f0 = feats(1.0), feats(0.0)
    mask = torch.ones(f1.shape[0], 1, dtype=torch.bool)
    curve = DistanceCurve(f1, f0, mask, al)
    for a in al:
        curve.add(a, f0 if a == 0.0 else feats(a))
    return make_score(level, None, None, module, curve.d.numpy(), curve.res.numpy(), 1.0 - np.asarray(al))


def _set_head_slices(work: WorkingCopy, anatomy: Anatomy, target: dict, layer: int, head: int, alpha: float):
    """Head ``head``'s slices to θ0 + α·τ, and the q/k norm weights (Qwen3) with them: they are shared by every
    head, so each head's function moves with them (as in `nonlinearity_scores`, which moves the whole layer)."""
    for sl in anatomy.head_slices(layer, head):
        dst = sl.take(work.params[sl.name].data)
        dst.copy_(wise_ft(sl.take(work.base[sl.name]), sl.take(target[sl.name]), float(alpha)))
    shared = [n for n in anatomy.params_of("attn", layer=layer) if ".q_norm." in n or ".k_norm." in n]
    work.lerp(target, alpha, shared)


def direct_scores(pool_or_models, task: Optional[str] = None, *, model: Optional[str] = None,
                  levels: Sequence[str] = DEFAULT_LEVELS, alphas: Sequence[float] = DEFAULT_ALPHAS,
                  samples: Optional[int] = 30, capture: str = "finetuned", batch_size: int = 8,
                  max_length: int = 128, progress: Progress = None) -> NonlinearityResult:
    """The same scores as `nonlinearity_scores`, by naive recomputation: for every submodule and every α, the
    whole ``capture`` model is run with only that submodule's parameters (a head: only its slices) set to
    θ0 + α·τ, and the submodule's output is read with a hook (an expert: the capture model's routing, then its
    MLP block at θ0 + α·τ and `forgetlab.core.submodules.one_expert`). Slow; the reference for tests and
    benchmarks."""
    if capture not in CAPTURES:
        raise ParameterError(f"capture must be one of {', '.join(CAPTURES)}; got {capture!r}.")
    al = check_alphas(alphas)
    inp = resolve_models(pool_or_models, task, model)
    pairs = select_pairs(inp.pairs, samples, inp.task)
    check_same_structure(inp.base, inp.finetuned)
    anatomy = Anatomy.from_model(inp.base)
    lv = check_levels(levels, anatomy, None)
    enc = encode_samples(inp.tokenizer, pairs, max_length=max_length, template=inp.template)
    target = param_dict(inp.finetuned)
    work = WorkingCopy.of(inp.base)
    cap_alpha = 1.0 if capture == "finetuned" else 0.0
    order = [1.0, 0.0] + [a for a in al if a not in (0.0, 1.0)]
    ideal = 1.0 - np.asarray(al)
    subs = []
    for level in lv:
        for layer, head in anatomy.submodules(level):
            subs.append((level, layer, head))
    scores = []
    for si, (level, layer, head) in enumerate(subs):
        d_parts, r_parts = [], []
        for a, b in [(i, min(i + batch_size, len(enc))) for i in range(0, len(enc), batch_size)]:
            chunk = enc.chunk(a, b)
            ids, mask = chunk.input_ids, chunk.mask()
            curve, f1 = None, None
            for alpha in order:
                work.lerp(target, cap_alpha)
                if level == "model":
                    work.lerp(target, alpha)
                    fa = last_hidden(work.model, anatomy, ids)
                elif level == "head":
                    _set_head_slices(work, anatomy, target, layer, head, alpha)
                    caps, _ = capture_inputs(work.model, anatomy, ids, [layer])
                    fa = run_submodule(work, anatomy, layer, "head", caps[layer])[:, head]
                elif level == "expert":   # the routing of the capture model, then the MLP block at α
                    caps, _ = capture_inputs(work.model, anatomy, ids, [layer])
                    work.lerp(target, alpha, anatomy.params_of("mlp", layer=layer))
                    fa = run_submodule(work, anatomy, layer, "expert", caps[layer])[:, head]
                else:
                    work.lerp(target, alpha, anatomy.params_of(level, layer=layer))
                    got = {}
                    path = anatomy.module_path(level, layer)
                    hk = work.module(path).register_forward_hook(
                        lambda m, i_, o: got.__setitem__("out", first_tensor(o)))
                    try:
                        last_hidden(work.model, anatomy, ids)
                    finally:
                        hk.remove()
                    fa = got["out"]
                if alpha == 1.0:
                    f1 = fa
                elif alpha == 0.0:
                    curve = DistanceCurve(f1, fa, mask, al)
                if alpha in al:
                    curve.add(alpha, fa)
            d_parts.append(curve.finish().d)
            r_parts.append(curve.res)
        d = torch.cat(d_parts).numpy()
        r = torch.cat(r_parts).numpy()
        module = (anatomy.attn_path(layer) + f".head{head}" if level == "head" else
                  f"{anatomy.experts_path(layer)}.{head}" if level == "expert" else anatomy.module_path(level, layer))
        scores.append(make_score(level, layer, head, module, d, r, ideal))
        report(progress, (si + 1) / len(subs), f"{level} {layer if layer is not None else ''}")
    return NonlinearityResult(inp.task, inp.model_name, al, len(pairs), capture, lv, scores)
