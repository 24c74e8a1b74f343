"""The memory estimate of a merge search worker (`forgetlab.analysis.search.search`, registered as job "search"),
and the dtype such a worker holds its weights in (`resident_dtype`).

Each worker (`_SearchState`) holds, for the whole search, the base and the N fine-tuned state dicts on the CPU
in `resident_dtype` (r bytes: the job's 16-bit dtype when every checkpoint is stored in it, else 4) and one
working copy of the model on the job's device in its dtype (b bytes). Per candidate it merges the whole model
into a new state dict on the CPU (`merge_state_dicts`: P·r, built tensor by tensor), writes it into the copy,
frees it, then evaluates the copy on the probe split (`core.eval_memory.eval_batch_bytes`; its forward passes
build no KV cache). The merge of one
tensor reads float32 copies of the base's and the N fine-tunes' tensors and works in place, so one of them
becomes the merged tensor. With P the parameters and E the largest tensor's entries:

    on the CPU:  (N + 1)·P·r  +  P·b  +  max(P·r + (N + 1)·E·4,  the largest evaluation batch)
    on a GPU:    P·b + the largest evaluation batch, and (N + 2)·P·r + (N + 1)·E·4 of host memory beside it

Every Ray worker holds all of it again (one worker per GPU). A resident state dict read in the dtype its
safetensors checkpoint stores is a view of the file's memory-mapped pages (`features_memory.mapped_weights`):
counted, under its own name; the working copy is rewritten per candidate, so its pages are always the job's.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from forgetlab.analysis.features_memory import MAPPED, mapped_weights
from forgetlab.core.checkpoints import open_checkpoint
from forgetlab.core.eval_memory import eval_batch_bytes
from forgetlab.core.evaluate import largest_eval_batch
from forgetlab.core.memory import (MemoryEstimate, ModelSize, dtype_bytes, dtype_fixes, dtype_name, host_shortfall,
                                   job_dtype, register_estimator)
from forgetlab.core.pool import stored_float_dtype
from forgetlab.merge.recipe_io import load_recipe

F32 = 4


def resident_dtype(dtype: torch.dtype, checkpoints: Sequence[Any]) -> torch.dtype:
    """The dtype a search worker holds the base and fine-tuned weights in: the job's 16-bit dtype when every
    checkpoint is stored in it (nothing is lost, and a merged tensor — computed in float32 per tensor — is
    rounded to it once, as the working copy would round it; a search of HMA block α then scales that rounded
    merge, one rounding more), else float32 (a float32 checkpoint rounded to 16 bits would lose most of a small
    task vector)."""
    if dtype != torch.float32 and all(stored_float_dtype(c) == dtype for c in checkpoints):
        return dtype
    return torch.float32


def search_parts(size: ModelSize, *, n_models: int, dtype, resident_bytes: int, batch_bytes: int,
                 on_gpu: bool = False, mapped: int = 0) -> dict[str, int]:
    """The parts of one search worker's peak in bytes on its device (module docstring): `n_models` fine-tunes,
    resident copies of `resident_bytes` per entry (`mapped` of the N + 1 are memory-mapped file pages), the
    largest evaluation batch's `batch_bytes`."""
    largest = max(size.vocab * size.hidden, size.layer_parameters // 3, 1)
    parts = {"working copy": size.bytes(dtype)}
    if on_gpu:
        parts["largest evaluation batch"] = batch_bytes
        return parts
    merge = size.parameters * resident_bytes + (n_models + 1) * largest * F32
    if mapped < n_models + 1:
        parts["resident base + fine-tunes"] = (n_models + 1 - mapped) * size.parameters * resident_bytes
    if mapped:
        parts["resident base + fine-tunes" + MAPPED] = mapped * size.parameters * resident_bytes
    parts["merged candidate" if merge >= batch_bytes else "largest evaluation batch"] = max(merge, batch_bytes)
    return parts


def host_bytes(size: ModelSize, *, n_models: int, resident_bytes: int) -> int:
    """The CPU memory a worker whose copy is on a GPU needs: the resident state dicts and one merged candidate."""
    largest = max(size.vocab * size.hidden, size.layer_parameters // 3, 1)
    return (n_models + 2) * size.parameters * resident_bytes + (n_models + 1) * largest * F32


@register_estimator("search")
def estimate_search(recipe, pool, *, device: Optional[str] = None, dtype=None, batch_size: int = 16,
                    max_general: Optional[int] = None, max_task: Optional[int] = None, **_: Any) -> MemoryEstimate:
    """The peak of one search worker (module docstring) on its device, with the flags that shrink it in the order
    they help most. On a GPU, a worker whose host memory would not hold its resident copies is refused too (the
    host's part is then added, so the estimate does not fit). Reads headers and tokenizes the probe texts."""
    dev = str(device or "cpu")
    dt = job_dtype(dtype, dev)
    recipe = load_recipe(recipe)
    base = open_checkpoint(pool.resolve_ref(recipe.base))
    tuned = [open_checkpoint(pool.resolve_ref(m.model), base=base) for m in recipe.models]
    size = ModelSize.of(base)
    held = resident_dtype(dt, [base, *tuned])
    r = dtype_bytes(held)
    mapped = sum(mapped_weights(c, held, "cpu") for c in [base, *tuned])
    rows, seq = largest_eval_batch(pool.tokenizer, pool.probes, split="probe", batch_size=int(batch_size),
                                   max_general=max_general, max_task=max_task)
    batch = eval_batch_bytes(size, dtype=dt, batch=rows, seq=seq)
    on_gpu = dev.startswith("cuda")
    parts = search_parts(size, n_models=len(tuned), dtype=dt, resident_bytes=r, batch_bytes=batch, on_gpu=on_gpu,
                         mapped=mapped)
    if on_gpu:
        parts.update(host_shortfall(host_bytes(size, n_models=len(tuned), resident_bytes=r)))
    fixes = dtype_fixes(dt) + (["a smaller --batch-size"] if rows > 1 else []) + ["fewer models in the recipe"]
    return MemoryEstimate("search", dev, dtype_name(dt), parts, fixes=fixes)
