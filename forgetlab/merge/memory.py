"""The memory estimate of a merge (registered as job "merge"): `forgetlab merge --dry-run` and the Merge page.

The engine (`forgetlab.merge.engine`) merges one tensor at a time, so its peak is set by the largest tensor
(the embedding or the head: E entries), not by the model. While it merges that tensor it holds:

- the tensors read: the base's and the N fine-tuned ones, E·s bytes each as stored (s: the stored element size)
  in the reader's slot, plus their float32 copies when s ≠ 4 (a float32 tensor is read in place);
- the method's working tensors (task vectors, stacks, masks, the merged tensor…): (a + b·N) float32 tensors of
  E entries, a and b the method's own, measured per method by `bench/merge_memory.py` and declared with it
  (`MethodSpec.memory`: the CPU kernels' and the reference functions' (a, b)).

A recipe whose `tokenizer:` rebuilds the vocabulary (forgetlab.merge.vocab) reads the token-row tensors on the
output vocabulary: their sizes are the output's, and every input's aligned rows are held at once while they are
read ((1 + N) float32 tensors of the output's rows).

A method with a global pass on a CUDA device with room keeps every input there for its later passes
(`merge.core.resident_budget`: half the free memory at most); that part is added when it applies. A method that
prepares coefficients from the pool (regmean, regmean_pp, fisher, slwm) runs forward passes first, on the CPU:
its statistics and the models it loads (`prepare_parts`, declared with the method) form a phase of their own.

`merge --eval` and the Merge page then score the base, the parents and the merge one after another in the job's
dtype: the "eval" estimate (`forgetlab.core.eval_memory`) of the largest of them. A job's peak is the larger of its
phases, and the estimate shows that phase's parts.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from forgetlab.core.errors import ParameterError
from forgetlab.core.eval_memory import estimate_eval
from forgetlab.core.memory import (MemoryEstimate, ModelSize, dtype_bytes, dtype_name, host_shortfall, in_decoder_layer,
                                   job_dtype, register_estimator)
from forgetlab.merge.core import check_compatible, float_entries, resident_budget, resident_bytes
from forgetlab.merge.engine import align_sources, check_tokenizer_source, open_sources
from forgetlab.merge.recipe_io import load_recipe
from forgetlab.merge.recipes import recipe_parents
from forgetlab.merge.registry import METHODS, get_method
from forgetlab.merge.vocab import is_vocab_tensor

F32 = 4

# A method that declares no working memory (`MethodSpec.memory`: not measured) is assumed to hold the most any
# measured method holds: the largest a and the largest b measured (pcb's reference a, multislerp's reference b).
DEFAULT_WORKING = (9.9, 4.1)


def working_units(method: str, n_models: int, *, reference: bool = False) -> float:
    """The method's working memory in float32 tensors of the largest tensor's size: a + b·N as its declaration
    gives it (`MethodSpec.memory`, `forgetlab.merge.registry.WorkingMemory`), on the reference path (a GPU's) or
    the CPU kernels'; DEFAULT_WORKING for a method that declares none."""
    spec = METHODS.find(method)
    if spec is None or spec.memory is None:
        a, b = DEFAULT_WORKING
        return a + b * n_models
    return spec.memory.units(n_models, reference=reference)


def merge_parts(largest: int, stored_bytes: int, n_models: int, method: str, *, on_gpu: bool = False,
                resident: int = 0) -> dict[str, int]:
    """The parts of the merge phase in bytes (module docstring): `largest` entries in the largest tensor, stored in
    `stored_bytes` per entry, `n_models` fine-tuned models, the method's working memory (`working_units`; on a GPU
    the reference functions') and `resident` bytes of inputs kept on the device for a global pass. On a GPU the
    tensors are read on the host and only their float32 copies are on the device."""
    copy = F32 if (on_gpu or stored_bytes != F32) else 0
    read = copy if on_gpu else stored_bytes + copy
    parts = {"tensors read (base + fine-tunes)": (1 + n_models) * largest * read,
             f"{method}'s working tensors": int(working_units(method, n_models, reference=on_gpu) * largest * F32)}
    if resident:
        parts["inputs kept on the device (global pass)"] = resident
    return parts


def prepare_parts(method: str, size: ModelSize, n_models: int, linear_inputs: int) -> dict[str, int]:
    """The parts of a pool method's prepare phase on the CPU (float32; the hooks hold one model at a time, see
    docs/merging.md), as the method declares them (`WorkingMemory.prepare`): the statistics, which the formula needs
    whole (e.g. a Fisher of the model's size per fine-tune, a Gram of d_in² per linear layer and fine-tune:
    `linear_inputs` = Σ d_in²), and what the hook holds beside them, in model sizes measured by
    `bench/prepare_memory.py`. The forward passes' share shrinks with the model, so these are upper bounds for
    larger ones. A pool method that declares none is assumed to hold what the largest measured one does (a model,
    its gradients and their running sum, and one model-sized statistic per fine-tune)."""
    model = size.bytes("float32")
    spec = METHODS.find(method)
    parts = spec.memory.prepare if spec is not None and spec.memory is not None else None
    if parts is None:
        return {"model and forward passes (not measured)": int(3.2 * model),
                "statistics (one model size per fine-tune)": n_models * model}
    return parts(model, n_models, linear_inputs)


def gram_entries(ckpt) -> int:
    """Σ d_in² over the 2-D weights inside decoder layers (from the headers)."""
    return sum(i.shape[-1] ** 2 for n, i in ckpt.infos().items() if len(i.shape) == 2 and in_decoder_layer(n))


@register_estimator("merge")
def estimate_merge(recipe, *, pool=None, device: Optional[str] = None, dtype=None, evaluate: bool = False,
                   batch_size: int = 16, max_general: Optional[int] = None, max_task: Optional[int] = None,
                   **_: Any) -> MemoryEstimate:
    """The peak of merging `recipe` on `device` (the larger of its phases, module docstring) and, with `evaluate`,
    of scoring the base, the parents and the merge in `dtype` on `pool`'s probe data. Reads headers only (and
    tokenizes the probe texts when evaluating)."""
    dev = str(device or "cpu")
    dt = job_dtype(dtype, dev)
    recipe = load_recipe(recipe)
    spec = get_method(recipe.method)
    params = recipe.validated_params()
    sources = open_sources(recipe)
    # a recipe's `tokenizer:` may rebuild the vocabulary (fine-tunes with added tokens or padded embeddings): the
    # engine then reads every token-row tensor on the output vocabulary, and so does the check here
    _, vocab = check_tokenizer_source(recipe, sources.base_ck, [m.ckpt for m in sources.models])
    if vocab is not None:
        sources = align_sources(recipe, sources, vocab)
    entries = float_entries(check_compatible(sources.base, sources.models))
    big = max(entries, key=lambda e: e.numel)
    stored = dtype_bytes(big.dtype)
    n = len(sources.models)
    resident = 0
    if dev.startswith("cuda") and spec.needs_global_pass(params):
        need = resident_bytes(sources.models, entries)
        resident = need if need <= resident_budget(dev) else 0
    phases = {"merging": merge_parts(big.numel, stored, n, spec.name, on_gpu=dev.startswith("cuda"),
                                     resident=resident)}
    if vocab is not None:       # merge.vocab.AlignedSource: every input's aligned rows are made at once, then read
        rows = max((e.numel for e in entries if is_vocab_tensor(e.name)), default=0)
        phases["merging"]["token rows aligned to the output vocabulary"] = (1 + n) * rows * F32
    size = ModelSize.of(sources.base_ck)
    fixes = []
    if spec.needs_pool:
        prep = prepare_parts(spec.name, size, n, gram_entries(sources.base_ck))
        if dev.startswith("cpu"):
            phases["preparing"] = prep
        else:
            phases["merging"].update(host_shortfall(sum(prep.values()), f" for {spec.name}'s statistics"))
        fixes.append("fewer models, or a method that needs no forward passes")
    if evaluate:
        if pool is None:
            raise ParameterError("Estimating the merge's evaluation needs the pool that judges it (pool=…).")
        ev = estimate_eval(pool, ["base", *recipe_parents(pool, recipe)], device=dev, dtype=dt,
                           batch_size=batch_size, max_general=max_general, max_task=max_task)
        phases["evaluating"] = ev.parts
        fixes = ev.fixes + fixes
    phase, parts = max(phases.items(), key=lambda kv: sum(kv[1].values()))
    return MemoryEstimate("merge", dev, dtype_name(dt), {f"{phase}: {k}": v for k, v in parts.items()},
                          fixes=fixes or ["fewer models in the recipe"])


@register_estimator("slwm_weights")
def estimate_slwm_weights(pool, models: Optional[Sequence[str]] = None, *, device: Optional[str] = None,
                          **_: Any) -> MemoryEstimate:
    """The peak of `forgetlab slwm-weights` (`forgetlab.merge.methods.slwm.slwm_weights` on a pool): slwm's prepare
    phase (`prepare_parts`), in float32 on `device`. Reads headers only."""
    size = ModelSize.of(pool.checkpoint("base"))
    n = len(models) if models else len(pool.model_names)
    return MemoryEstimate("slwm_weights", str(device or "cpu"), "float32",
                          prepare_parts("slwm", size, n, 0))
