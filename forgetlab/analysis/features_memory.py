"""The memory estimate of `forgetlab.analysis.features.capture_features` / `feature_map` (registered as job
"features").

The job loads the pool's models one at a time in its dtype and runs each on batches of probe samples, keeping
the pooled float32 rows (samples × hidden, small). Its peak is one model's weights (the largest of those
mapped) plus one batch's forward pass through the decoder — no logits: the features are read before the head —
with, at the head level, every head's contribution to the attention output ([batch, heads, seq, hidden]) on
top. With P the parameters, b the dtype's bytes, B the batch, S its longest sequence, H the hidden width,
I the MLP's, A the attention heads:

    P·b + B·S·(4H + 3I)·b + B·A·S²·4 (eager attention scores)
    + B·S·H·(b + 4) (the feature and its float32 copy)
    + at the head level: 2·B·A·S·H·b
    + 8 MiB that loading a model costs beyond its weights (transformers' objects and buffers; measured 6–10 MiB
      at 20M and 100M parameters)

PCA and t-SNE run on the n pooled rows (n = models × tasks × samples) after the last model is released: the
rows in float64 and their centred copy (2·n·H·8), about 8 KiB per point for the neighbours and the gradient,
and — the first time in a process — the libraries themselves (openTSNE and scikit-learn: 36 MiB measured in a
process that has loaded transformers, as every job has).
The peak is the larger of the capture and the t-SNE, so the t-SNE's part is what it needs beyond the capture.

On the CPU, a model loaded in the dtype its safetensors checkpoint stores keeps its weights as the file's
memory-mapped pages (page cache, which `PeakMeter` does not count and the kernel can drop and read again); the
estimate still counts them — the job needs them in memory to run at speed — but names them apart
(`MAPPED`, `mapped_weights`), so that a check against a measured peak can leave them out.
"""
from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

from forgetlab.core.checkpoints.readers import SafetensorsCheckpoint
from forgetlab.core.memory import (MemoryEstimate, ModelSize, dtype_bytes, dtype_fixes, dtype_name, job_dtype,
                                   register_estimator)
from forgetlab.core.pool import stored_float_dtype
from forgetlab.core.submodules import encode_samples, select_pairs

F32 = 4
TSNE_LIBRARIES = 36 * 1024 ** 2      # openTSNE + scikit-learn loaded after transformers (measured: 36.3 MiB)
TSNE_PER_POINT = 8 * 1024
LOAD_OVERHEAD = 8 * 1024 ** 2        # a loaded model beyond its weights (measured 6.2 MiB at 20M, ≈ 10 at 100M)
MAPPED = " (memory-mapped checkpoint pages)"


def mapped_weights(ckpt, dtype, device) -> bool:
    """Whether a model of `ckpt` loaded in `dtype` on `device` holds its weights as memory-mapped file pages:
    on the CPU, from a safetensors checkpoint that stores them in `dtype` (transformers then loads no copy)."""
    return (str(device or "cpu").startswith("cpu") and type(ckpt) is SafetensorsCheckpoint
            and stored_float_dtype(ckpt) == dtype)


def unmapped(parts: dict[str, int]) -> int:
    """The bytes of an estimate's parts that are not memory-mapped checkpoint pages (what RSS measures)."""
    return int(sum(v for k, v in parts.items() if not k.endswith(MAPPED)))


def features_parts(size: ModelSize, *, dtype, batch: int, seq: int, level: str = "layer",
                   mapped: bool = False) -> dict[str, int]:
    """The parts of the features job's peak in bytes for `batch` samples of `seq` tokens (module docstring);
    `mapped`: the weights are memory-mapped checkpoint pages (`mapped_weights`)."""
    b = dtype_bytes(dtype)
    tokens = batch * seq
    heads = max(size.heads, 1)
    forward = (tokens * (4 * size.hidden + 3 * size.intermediate) * b + batch * heads * seq * seq * F32
               + tokens * size.hidden * (b + F32))
    if level == "head":
        forward += 2 * batch * heads * seq * size.hidden * b
    return {"weights (one model at a time)" + (MAPPED if mapped else ""): size.bytes(dtype),
            "one batch's forward pass": forward, "loading overhead": LOAD_OVERHEAD}


def tsne_bytes(points: int, hidden: int, loaded: bool = False) -> int:
    """PCA and t-SNE of `points` rows of `hidden` features (module docstring); `loaded`: the libraries are
    already imported in this process."""
    return (0 if loaded else TSNE_LIBRARIES) + 2 * points * hidden * 8 + points * TSNE_PER_POINT


def _batch_shape(pool, tasks: Sequence[str], samples: Optional[int], batch_size: int,
                 max_length: int) -> tuple[int, int, int]:
    """(rows, tokens) of the largest batch the job forms — per task its first `samples` probe pairs, encoded as
    `capture_features` encodes them, cut into batches of `batch_size` — and the samples over all tasks."""
    template = getattr(pool.probes, "template", None)
    best, total = (1, 1), 0
    for t in tasks:
        enc = encode_samples(pool.tokenizer, select_pairs(pool.probes.task(t).probe, samples, t),
                             max_length=max_length, template=template)
        rows, seq = min(int(batch_size), len(enc)), int(enc.input_ids.shape[1])
        total += len(enc)
        if rows * seq > best[0] * best[1]:
            best = (rows, seq)
    return best[0], best[1], total


@register_estimator("features")
def estimate_features(pool, tasks: Optional[Sequence[str]] = None, models: Optional[Sequence[str]] = None, *,
                      level: str = "layer", samples: Optional[int] = 30, batch_size: int = 8, max_length: int = 128,
                      device: Optional[str] = None, dtype=None, **_: Any) -> MemoryEstimate:
    """The peak of `capture_features` on a pool (module docstring), with the flags that shrink it in the order
    they help most. Reads headers and tokenizes the probe texts; loads no weights."""
    dt = job_dtype(dtype, device)
    names = list(models) if models else ["base", *pool.model_names]
    largest = max(names, key=lambda n: ModelSize.of(pool.checkpoint(n)).parameters)
    size = ModelSize.of(pool.checkpoint(largest))
    tasks = list(tasks) if tasks else list(pool.probes.tasks)
    rows, seq, points = _batch_shape(pool, tasks, samples, batch_size, max_length) if tasks else (1, 1, 0)
    parts = features_parts(size, dtype=dt, batch=rows, seq=seq, level=level,
                           mapped=mapped_weights(pool.checkpoint(largest), dt, device))
    loaded = "openTSNE" in sys.modules and "sklearn.decomposition" in sys.modules
    beyond = tsne_bytes(points * len(names), size.hidden, loaded) - unmapped(parts)
    if beyond > 0:
        parts["PCA and t-SNE, beyond the capture"] = beyond
    fixes = dtype_fixes(dt) + (
        ["--level attn (the head level holds every head's output)"] if level == "head" else [])
    return MemoryEstimate("features", str(device or "cpu"), dtype_name(dt), parts, fixes=fixes)
