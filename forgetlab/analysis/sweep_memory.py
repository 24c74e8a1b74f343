"""The memory a forgetting sweep needs, from the model's sizes, the dtype and the evaluation batch (no weights read).

A sweep holds ONE working copy of the model (`forgetlab.merge.working_copy.WorkingCopy.load`) and rewrites it in
place per point; θ0 and θ1 are read tensor by tensor from the checkpoints' memory maps (file pages the kernel can
drop, not the job's own memory). With P the parameters, b the working copy's bytes per element, E the largest
tensor's entries (the embedding, V·H, on most LMs), B the evaluation batch (--batch-size, at most the larger of
--max-general and --max-task, since a batch never holds more than the items evaluated), V the vocabulary
(docs/scaling.md):

    working copy P·b
    + one tensor's merge E·4·c  (θ0 and θ1 copied in float32 and the merged tensor: c = 3 for WiSE-FT/SLERP
                                 (`alpha`); c = 5 for the others, whose methods hold two temporaries more:
                                 scores or a mask, a top-k or sort buffer)
    + evaluation B·128·V·b + 2·128·V·4  (a batch of logits over 128-token blocks, one row's log-softmax in float32)

The merge and the evaluation run one after another, so the peak is the copy plus the larger of the two. A
checkpoint whose names transformers converts on load (a mixture of experts' per-expert tensors, fused into 3-D
ones) cannot be read tensor by tensor under the model's names: θ0 and θ1 of those R entries are held in float32
(`forgetlab.merge.working_copy.checkpoint_params`), one more part of 2·R·4 (host memory).
"""
from __future__ import annotations

from typing import Any, Optional

from forgetlab.core.memory import (MemoryEstimate, ModelSize, dtype_bytes, dtype_fixes, dtype_name, job_dtype,
                                   register_estimator)
from forgetlab.merge.working_copy import renamed_numel

EVAL_BLOCK = 128        # tokens per general-text block (core.evaluate.general_loss)
MERGE_COPIES = {"alpha": 3}   # float32 tensors of the largest shape alive while one tensor is merged (docstring)
OTHER_COPIES = 5


def sweep_parts(size: ModelSize, *, dtype, batch_size: int = 16, kind: str = "pruning",
                renamed: int = 0) -> dict[str, int]:
    """The parts of a sweep's peak (module docstring), in bytes; `renamed` = R, the entries held in memory."""
    b = dtype_bytes(dtype)
    vocab, hidden = max(1, size.vocab), max(1, size.hidden)
    largest = max(vocab * hidden if size.vocab and size.hidden else 0, size.layer_parameters // 3)
    merge = MERGE_COPIES.get(kind, OTHER_COPIES) * largest * 4
    evaluation = int(batch_size) * EVAL_BLOCK * vocab * b + 2 * EVAL_BLOCK * vocab * 4
    parts = {"working copy": size.bytes(dtype)}
    if renamed:
        parts["θ0, θ1 of converted tensors"] = 2 * int(renamed) * 4
    if merge >= evaluation:
        parts["merge of the largest tensor"] = merge
    else:
        parts["evaluation"] = evaluation
    return parts


@register_estimator("sweep")
def estimate_sweep(pool, model: str, *, kind: str = "pruning", device: Optional[Any] = None, dtype=None, batch_size: int = 16,
                   max_general: Optional[int] = None, max_task: Optional[int] = None, **_: Any) -> MemoryEstimate:
    """The peak of a sweep of `kind` (the Analysis `sweep-<kind>`) on `pool`'s model `model` (module docstring),
    with the flags that shrink it in the order they help most. A device map (`Placement`) is estimated as its first
    device would hold the whole copy (an upper bound: accelerate spreads it), and spreads the copy over devices and
    disk by design: its estimate is shown, never enforced."""
    one_device = isinstance(device, str) or device is None
    dev = device if one_device else "cpu"
    dev = str(dev or "cpu")
    dt = job_dtype(dtype, dev)
    size = ModelSize.of(pool.checkpoint(model if model in pool.model_names else "base"))
    if max_general is not None and max_task is not None:
        batch_size = min(int(batch_size), max(int(max_general), int(max_task)))
    parts = sweep_parts(size, dtype=dt, batch_size=batch_size, kind=kind,
                        renamed=renamed_numel(pool.checkpoint("base")))
    fixes = dtype_fixes(dt)
    if "evaluation" in parts and batch_size > 1:
        fixes.append("a smaller --batch-size")
    fixes.append("--device-map auto (spread the working copy over GPUs, CPU and disk)")
    return MemoryEstimate("sweep", dev, dtype_name(dt), parts, fixes=fixes, enforced=one_device)
