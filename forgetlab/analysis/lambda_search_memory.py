"""The memory estimate of PCB's λ search (`forgetlab.analysis.lambda_search.pcb_lambda_search`, job "pcb_search").

The search holds, for its whole run and on the CPU, the base's and the N fine-tuned state dicts read in float32
and the N PCB components Ci (float32, each the size of the model); every evaluation composes θ0 + Σ λi·Ci into a
new float32 state dict, copies it into one working copy of the base in the job's dtype on the job's device and
scores the probe split with it (`core.eval_memory.eval_batch_bytes`). With P parameters and b bytes per entry in
the job's dtype:

    on the CPU:  (2N + 2)·P·4  +  P·b  +  the largest evaluation batch
    on a GPU:    P·b + the largest evaluation batch, and (2N + 2)·P·4 of host memory beside it

Every executor worker holds all of it again.
"""
from __future__ import annotations

from typing import Any, Optional

from forgetlab.core.checkpoints import open_checkpoint
from forgetlab.core.eval_memory import eval_batch_bytes
from forgetlab.core.evaluate import largest_eval_batch
from forgetlab.core.memory import (MemoryEstimate, ModelSize, dtype_fixes, dtype_name, host_shortfall, job_dtype,
                                   register_estimator)
from forgetlab.merge.recipe_io import load_recipe

F32 = 4


def host_parts(size: ModelSize, n_models: int) -> dict[str, int]:
    """What the search keeps on the CPU (module docstring): the state dicts read, the components, one composed
    state dict."""
    model = size.parameters * F32
    return {"base + fine-tuned state dicts": (n_models + 1) * model, "PCB components": n_models * model,
            "composed candidate": model}


@register_estimator("pcb_search")
def estimate_pcb_search(pool, recipe, *, device: Optional[str] = None, dtype=None, max_task: Optional[int] = 32,
                        batch_size: int = 16, **_: Any) -> MemoryEstimate:
    """The peak of one λ-search worker (module docstring) on its device. On a GPU, a host too small for the
    state dicts and components is reported as a part of its own, so the estimate does not fit. Reads headers and
    tokenizes the probe texts."""
    dev = str(device or "cpu")
    dt = job_dtype(dtype, dev)
    recipe = load_recipe(recipe)
    size = ModelSize.of(open_checkpoint(pool.resolve_ref(recipe.base)))
    n = len(recipe.models)
    rows, seq = largest_eval_batch(pool.tokenizer, pool.probes, split="probe", batch_size=int(batch_size),
                                   max_general=0, max_task=max_task)
    parts = {"working copy": size.bytes(dt), "largest evaluation batch": eval_batch_bytes(size, dtype=dt, batch=rows,
                                                                                          seq=seq)}
    host = host_parts(size, n)
    parts.update(host if dev.startswith("cpu") else host_shortfall(sum(host.values())))
    fixes = dtype_fixes(dt) + ["fewer models in the recipe", "PCB's λ given by hand (no search)"]
    return MemoryEstimate("pcb_search", dev, dtype_name(dt), parts, fixes=fixes)
