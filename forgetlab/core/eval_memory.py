"""Memory of evaluating a model (`forgetlab.core.evaluate.evaluate`): one batch's share, and the estimator of
`forgetlab eval` (job "eval"): the largest model's weights in the job's dtype plus its largest batch."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from forgetlab.core.evaluate import largest_eval_batch
from forgetlab.core.memory import (MemoryEstimate, ModelSize, dtype_bytes, dtype_fixes, dtype_name, job_dtype,
                                   register_estimator)

F32 = 4


def eval_batch_bytes(size: ModelSize, *, dtype, batch: int, seq: int) -> int:
    """The peak of one `token_losses` batch above the weights: the larger of a layer's activations (hidden
    states, the MLP's intermediate tensors, eager attention scores in float32) and the logits (batch × tokens ×
    vocab in the job's dtype) with one row's float32 scores and losses; plus the residual stream."""
    b = dtype_bytes(dtype)
    tokens = batch * seq
    layer = tokens * (4 * size.hidden + 3 * size.intermediate) * b + batch * max(size.heads, 1) * seq * seq * F32
    logits = tokens * size.vocab * b + 3 * seq * size.vocab * F32
    return max(layer, logits) + tokens * size.hidden * b


@register_estimator("eval")
def estimate_eval(pool, models: Optional[Sequence[str]] = None, *, device: Optional[str] = None, dtype=None,
                  batch_size: int = 16, max_general: Optional[int] = None, max_task: Optional[int] = None,
                  general_mode: str = "blocks", **_: Any) -> MemoryEstimate:
    """The peak of evaluating `models` (default: base and every fine-tune) one after another: the largest one's
    weights in `dtype` plus its largest batch (`largest_eval_batch`). Reads headers and tokenizes the texts."""
    dt = job_dtype(dtype, device)
    names = list(models) if models else ["base", *pool.model_names]
    size = max((ModelSize.of(pool.checkpoint(n)) for n in names), key=lambda s: s.parameters)
    rows, seq = largest_eval_batch(pool.tokenizer, pool.probes, batch_size=int(batch_size), max_general=max_general,
                                   max_task=max_task, general_mode=general_mode)
    fixes = dtype_fixes(dt) + (
        ["--device-map auto (spread the model over devices and CPU)", "smaller --max-general/--max-task"])
    return MemoryEstimate("eval", str(device or "cpu"), dtype_name(dt),
                          {"weights": size.bytes(dt), "largest batch": eval_batch_bytes(size, dtype=dt, batch=rows,
                                                                                          seq=seq)}, fixes=fixes)


@register_estimator("benchmarks")
def estimate_benchmarks(pool, models: Optional[Sequence[str]] = None, *, device: Optional[str] = None, dtype=None,
                        batch_size: int = 1, **_: Any) -> MemoryEstimate:
    """The peak of running lm-eval's tasks (`forgetlab.core.benchmarks.benchmark_pool`) on `models` one after
    another: the largest one's weights in `dtype` plus one request batch at the longest sequence lm-eval may feed
    it (the model's context, `max_position_embeddings`, else lm-eval's default 2048), scored as `eval_batch_bytes`
    scores a batch. Requests are as long as the task's prompt, so this is an upper bound. Reads headers only."""
    dt = job_dtype(dtype, device)
    names = list(models) if models else ["base", *pool.model_names]
    ckpt = max((pool.checkpoint(n) for n in names), key=lambda c: ModelSize.of(c).parameters)
    size = ModelSize.of(ckpt)
    seq = int(getattr(ckpt.config, "max_position_embeddings", 0) or 2048)
    fixes = dtype_fixes(dt) + ["fewer models"]
    return MemoryEstimate("benchmarks", str(device or "cpu"), dtype_name(dt),
                          {"weights": size.bytes(dt),
                           "longest request": eval_batch_bytes(size, dtype=dt, batch=int(batch_size), seq=seq)},
                          fixes=fixes)
