"""The memory estimate of `forgetlab.analysis.attribution.attribute` (registered as job "attribution").

The job holds one working copy in its dtype (θ0 and θ1 read from the checkpoints one tensor at a time) and
evaluates it again and again (`forgetlab.core.evaluate`). On top of the weights, the largest of:
- writing one tensor: θ0 + c·τ in float32 (θ1 − θ0 and the result; the reads are copies too when the
  checkpoints are not stored in float32);
- one evaluation batch: a layer's activations (hidden states, the MLP's intermediate tensors, eager attention
  scores in float32) while the logits (batch × sequence × vocab, in the job's dtype) are made, then the
  logits and one sequence's float32 copy with its cross-entropy (`token_losses`).
A checkpoint whose names transformers converts on load (a mixture of experts' per-expert tensors) has θ0 and θ1
of those R entries held in float32 (`forgetlab.merge.working_copy.checkpoint_params`): 2·R·4 more.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from forgetlab.analysis.attribution_inputs import resolve_attribution
from forgetlab.core.eval_memory import eval_batch_bytes
from forgetlab.core.evaluate import largest_eval_batch
from forgetlab.core.memory import (MemoryEstimate, ModelSize, dtype_fixes, dtype_name, job_dtype,
                                   register_estimator)
from forgetlab.core.pool import stored_float_dtype
from forgetlab.merge.working_copy import renamed_numel

F32 = 4


def write_bytes(size: ModelSize, stored_float32: bool) -> int:
    """The float32 temporaries of writing θ0 + c·τ into the largest tensor."""
    largest = max(size.vocab * size.hidden, size.intermediate * size.hidden, 1)
    return (2 if stored_float32 else 4) * largest * F32


@register_estimator("attribution")
def estimate_attribution(pool, model: str, *, task: Optional[str] = None, level: str = "module", select=None,
                         alphas=None, device: Optional[str] = None, dtype=None, batch_size: int = 16,
                         max_general: Optional[int] = None, max_task: Optional[int] = None,
                         **_: Any) -> MemoryEstimate:
    """The peak of `attribute` (module docstring), with the flags that shrink it in the order they help most.
    Reads headers and tokenizes the evaluation texts; loads no weights."""
    dt = job_dtype(dtype, device)
    task = resolve_attribution(pool, model, task, level, select, alphas)[0]
    size = ModelSize.of(pool.checkpoint(model))
    stored = {stored_float_dtype(pool.checkpoint(x)) for x in ("base", model)}
    rows, seq = largest_eval_batch(pool.tokenizer, pool.probes, tasks=[task], batch_size=int(batch_size),
                                   max_general=max_general, max_task=max_task)
    extra = max(write_bytes(size, stored == {torch.float32}), eval_batch_bytes(size, dtype=dt, batch=rows, seq=seq))
    fixes = dtype_fixes(dt) + (
        ["a smaller --batch-size"] if batch_size > 1 else [])
    parts = {"weights": size.bytes(dt), "one write or evaluation batch": extra}
    renamed = renamed_numel(pool.checkpoint("base"))
    if renamed:
        parts["θ0, θ1 of converted tensors"] = 2 * renamed * F32
    return MemoryEstimate("attribution", str(device or "cpu"), dtype_name(dt), parts, fixes=fixes)
