"""The memory estimate of `forgetlab.analysis.linearity.nonlinearity_scores` (registered as job "linearity").

The job holds one model in its dtype (the working copy; θ0 and θ1 are read from the checkpoints one tensor at a
time) and, per batch of probe samples, every layer's captured inputs and outputs. On top of that, one of:
- interpolating one tensor: θ1 − θ0 and the result in float32 (largest: the embedding), plus θ0 and θ1 read
  as float32 copies when the checkpoints are not stored in float32 (else the reads are memory-map views);
- one layer's re-run: the q/k/v and MLP input projections at α = 0 and 1 and interpolated, the attention
  scores, and per level the float32 tensors `_Curve` keeps (f(1), −f(1), Δ, u) — per head for the head level.
A checkpoint whose names transformers converts on load (a mixture of experts' per-expert tensors) has θ0 and θ1
of those R entries held in float32 (`forgetlab.merge.working_copy.checkpoint_params`): 2·R·4 more.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from forgetlab.core.memory import (MemoryEstimate, ModelSize, dtype_bytes, dtype_fixes, dtype_name, job_dtype,
                                   register_estimator)
from forgetlab.core.pool import stored_float_dtype
from forgetlab.core.submodules import encode_samples, select_pairs
from forgetlab.merge.working_copy import renamed_numel

F32 = 4


def linearity_parts(size: ModelSize, *, dtype, batch: int, seq: int, levels: Sequence[str],
                    stored_float32: bool = True) -> dict[str, int]:
    """The parts of the linearity job's peak in bytes for `batch` samples of `seq` tokens (module docstring).
    `stored_float32`: the checkpoints hold float32, so θ0 and θ1 are read as views of their memory maps (page
    cache, not the job's memory); otherwise each read is a float32 copy."""
    b = dtype_bytes(dtype)
    bsh = batch * seq * size.hidden
    heads = max(size.heads, 1)
    sub = [x for x in levels if x != "model"]
    captures = (6 * bsh * b * size.layers if sub else 0) + bsh * b
    largest = max(size.vocab * size.hidden, size.intermediate * size.hidden, 1)
    lerp = (2 if stored_float32 else 4) * largest * F32   # θ1 − θ0 and the result (+ the two reads)
    rerun = 0
    if sub:
        curve = 4 * bsh * F32 + bsh * b
        rerun = (9 * bsh * b + 6 * batch * seq * size.intermediate * b + batch * heads * seq * seq * F32
                 + curve * sum(x in sub for x in ("layer", "attn", "mlp")))
        if "head" in sub:
            rerun += heads * curve
        if "expert" in sub:     # every expert's output on every token, then masked to its routed ones
            rerun += max(int(getattr(size, "experts", 0) or 0), 1) * curve
    return {"weights": size.bytes(dtype), "captured inputs": captures, "one layer's work": max(lerp, rerun)}


def _longest(pool, task: str, samples: Optional[int], max_length: int, seed: Optional[int] = None) -> int:
    pairs = select_pairs(pool.probes.task(task).probe, samples, task, seed)
    enc = encode_samples(pool.tokenizer, pairs, max_length=max_length, template=getattr(pool.probes, "template",
                                                                                        None))
    return int(enc.input_ids.shape[1])


@register_estimator("linearity")
def estimate_linearity(pool, task: Optional[str] = None, *, model: Optional[str] = None,
                       levels: Optional[Sequence[str]] = None, samples: Optional[int] = 30,
                       seed: Optional[int] = None, batch_size: int = 8, max_length: int = 128,
                       device: Optional[str] = None, dtype=None, **_: Any) -> MemoryEstimate:
    """The peak of `nonlinearity_scores` on a pool at ``levels`` (None: every level; weights, captures, one
    layer's work; module docstring), with the flags that shrink it in the order they help most. Reads headers and
    the probe texts, no weights."""
    dt = job_dtype(dtype, device)
    name = pool.model_for_task(task, model)
    size = ModelSize.of(pool.checkpoint(name))
    n = len(pool.probes.task(task).probe) if samples is None else samples
    batch = max(1, min(int(batch_size), int(n)))
    seq = _longest(pool, task, samples, max_length, seed)
    levels = ("model", "layer", "attn", "mlp", "head", "expert") if levels is None else (
        (levels,) if isinstance(levels, str) else tuple(levels))
    stored = {stored_float_dtype(pool.checkpoint(x)) for x in ("base", name)}
    parts = linearity_parts(size, dtype=dt, batch=batch, seq=seq, levels=levels,
                            stored_float32=stored == {torch.float32})
    renamed = renamed_numel(pool.checkpoint("base"))
    if renamed:
        parts["θ0, θ1 of converted tensors"] = 2 * renamed * F32
    fixes = dtype_fixes(dt)
    if "head" in levels:
        fixes.append("--levels without head")
    if batch > 1:
        fixes.append("a smaller --batch-size")
    return MemoryEstimate("linearity", str(device or "cpu"), dtype_name(dt), parts, fixes=fixes)
