"""The memory estimate of `forgetlab.analysis.features.capture_features` / `feature_map` (registered as job
"features").

The job loads the pool's models one at a time in its dtype and runs each on batches of probe samples, keeping
the pooled float32 rows (samples × hidden, small). Its peak is one model's weights (the largest of those
mapped) plus one batch's forward pass through the decoder — no logits: the features are read before the head —
with, at the head level, every head's contribution to the attention output ([batch, heads, seq, hidden]) on
top. With P the parameters, b the dtype's bytes, B the batch, S its longest sequence, H the hidden width,
I the MLP's, A the attention heads:

    P·b + B·S·(4H + 3I)·b + B·A·S²·4 (eager attention scores) + B·S·H·(b + 4) (the feature and its float32 copy)
    + at the head level: 2·B·A·S·H·b

PCA and t-SNE run on the pooled rows afterwards (samples × min(50, hidden) floats).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from forgetlab.core.memory import MemoryEstimate, ModelSize, dtype_bytes, dtype_name, job_dtype, register_estimator

F32 = 4


def features_parts(size: ModelSize, *, dtype, batch: int, seq: int, level: str = "layer") -> dict[str, int]:
    """The parts of the features job's peak in bytes for `batch` samples of `seq` tokens (module docstring)."""
    b = dtype_bytes(dtype)
    tokens = batch * seq
    heads = max(size.heads, 1)
    forward = (tokens * (4 * size.hidden + 3 * size.intermediate) * b + batch * heads * seq * seq * F32
               + tokens * size.hidden * (b + F32))
    if level == "head":
        forward += 2 * batch * heads * seq * size.hidden * b
    return {"weights (one model at a time)": size.bytes(dtype), "one batch's forward pass": forward}


def _batch_shape(pool, tasks: Sequence[str], samples: Optional[int], batch_size: int,
                 max_length: int) -> tuple[int, int]:
    """(rows, tokens) of the largest batch the job forms: per task its first `samples` probe pairs, encoded as
    `capture_features` encodes them, cut into batches of `batch_size`."""
    from forgetlab.core.submodules import encode_samples, select_pairs

    template = getattr(pool.probes, "template", None)
    best = (1, 1)
    for t in tasks:
        enc = encode_samples(pool.tokenizer, select_pairs(pool.probes.task(t).probe, samples, t),
                             max_length=max_length, template=template)
        rows, seq = min(int(batch_size), len(enc)), int(enc.input_ids.shape[1])
        if rows * seq > best[0] * best[1]:
            best = (rows, seq)
    return best


@register_estimator("features")
def estimate_features(pool, tasks: Optional[Sequence[str]] = None, models: Optional[Sequence[str]] = None, *,
                      level: str = "layer", samples: Optional[int] = 30, batch_size: int = 8, max_length: int = 128,
                      device: Optional[str] = None, dtype=None, **_: Any) -> MemoryEstimate:
    """The peak of `capture_features` on a pool (module docstring), with the flags that shrink it in the order
    they help most. Reads headers and tokenizes the probe texts; loads no weights."""
    dt = job_dtype(dtype, device)
    names = list(models) if models else ["base", *pool.model_names]
    size = max((ModelSize.of(pool.checkpoint(n)) for n in names), key=lambda s: s.parameters)
    tasks = list(tasks) if tasks else list(pool.probes.tasks)
    rows, seq = _batch_shape(pool, tasks, samples, batch_size, max_length) if tasks else (1, 1)
    fixes = (["--dtype bfloat16 (sidebar: Dtype)"] if dtype_bytes(dt) == 4 else []) + (
        ["--level attn (the head level holds every head's output)"] if level == "head" else [])
    return MemoryEstimate("features", str(device or "cpu"), dtype_name(dt),
                          features_parts(size, dtype=dt, batch=rows, seq=seq, level=level), fixes=fixes)
