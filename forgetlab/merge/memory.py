"""The memory estimate of a merge (registered as job "merge"): `forgetlab merge --dry-run` and the Merge page.

The engine (`forgetlab.merge.engine`) merges one tensor at a time, so its peak is set by the largest tensor
(the embedding or the head: E entries), not by the model. While it merges that tensor it holds:

- the tensors read: the base's and the N fine-tuned ones, E·s bytes each as stored (s: the stored element size)
  in the reader's slot, plus their float32 copies when s ≠ 4 (a float32 tensor is read in place);
- the method's working tensors (task vectors, stacks, masks, the merged tensor…): (a + b·N) float32 tensors of
  E entries, a and b the method's own, measured per method by `bench/merge_memory.py` (FAST, REFERENCE).

A recipe whose `tokenizer:` rebuilds the vocabulary (forgetlab.merge.vocab) reads the token-row tensors on the
output vocabulary: their sizes are the output's, and every input's aligned rows are held at once while they are
read ((1 + N) float32 tensors of the output's rows).

A method with a global pass on a CUDA device with room keeps every input there for its later passes
(`merge.core.resident_budget`: half the free memory at most); that part is added when it applies. A method that
prepares coefficients from the pool (regmean, regmean_pp, fisher, slwm) runs forward passes first, on the CPU:
its statistics and the models it loads (`prepare_parts`) form a phase of their own.

`merge --eval` and the Merge page then score the base, the parents and the merge one after another in the job's
dtype: the "eval" estimate (`forgetlab.core.eval_memory`) of the largest of them. A job's peak is the larger of its
phases, and the estimate shows that phase's parts.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from forgetlab.core.memory import (MemoryEstimate, ModelSize, dtype_bytes, dtype_name, host_shortfall, job_dtype,
                                   register_estimator)
from forgetlab.merge.vocab import is_vocab_tensor

F32 = 4

# Per method, its working memory beyond the tensors read, in float32 tensors of the largest tensor's size: a + b·N
# for N fine-tuned models, as (a, b). Measured on the CPU at N = 2 and 3 (python bench/merge_memory.py; its
# table is in docs/scaling.md) and rounded up by 0.1. FAST is what the CPU kernels hold (`MethodSpec.fast`, the
# path a float32 merge on the CPU takes); REFERENCE is what the reference functions hold, the path on a GPU
# (measured on the CPU with the kernels turned off: `bench/merge_memory.py --reference`; a method with no kernel
# falls back to FAST). A method not listed (a plugin) gets DEFAULT_WORKING: the largest a and the largest b measured.
FAST = {
    "linear": (2.1, 0), "wise_ft": (3.1, 0), "hma": (3.1, 0), "task_arithmetic": (0.4, 0), "ties": (0.4, 0),
    "dare_linear": (0.4, 0), "dare_ties": (0.4, 0), "breadcrumbs": (1.9, 0), "consensus": (0.4, 0),
    "pcb": (2.2, 1.1), "fapm": (2.2, 0), "submodule_alpha": (2.1, 0), "slerp": (3.1, 0), "nuslerp": (3.1, 0),
    "multislerp": (5.1, 0), "karcher": (6.1, 1.0), "model_stock": (5.1, 1.0), "nearswap": (5.1, 0),
    "arcee_fusion": (5.4, 0), "ram": (0.6, 0), "ramplus_tl": (0.6, 0), "sce": (2.2, 0), "della": (0.4, 0),
    "della_linear": (0.4, 0), "breadcrumbs_ties": (0.4, 0), "lines": (0.4, 0), "tsv": (0.7, 0), "iso_c": (0.6, 0),
    "iso_cts": (0.9, 0), "cart": (2.1, 1.0), "localize_stitch": (5.4, 0), "knots": (0.1, 0), "passthrough": (0.1, 0),
    # the pool methods' whole peak less the tensors read (their prepare phase included, so an upper bound)
    "fisher": (7.1, 3.1), "regmean": (1.0, 3.3), "regmean_pp": (4.7, 1.9), "slwm": (4.9, 0.6),
}
REFERENCE = {
    "linear": (2.1, 0), "wise_ft": (3.1, 0), "hma": (3.1, 0), "task_arithmetic": (0.4, 0), "ties": (6.6, 1.5),
    "dare_linear": (1.4, 1.0), "dare_ties": (4.4, 2.3), "breadcrumbs": (3.1, 0.9), "consensus": (5.4, 0.3),
    "pcb": (9.9, 1.1), "fapm": (5.8, 1.3), "submodule_alpha": (2.1, 0), "slerp": (3.1, 0), "nuslerp": (7.1, 0),
    "multislerp": (2.0, 4.1), "karcher": (6.1, 1.0), "model_stock": (5.1, 1.0), "nearswap": (5.1, 0),
    "arcee_fusion": (5.6, 0), "ram": (4.6, 0.3), "ramplus_tl": (3.9, 0.8), "sce": (1.4, 3.3), "della": (5.0, 2.1),
    "della_linear": (1.1, 1.0), "breadcrumbs_ties": (3.2, 2.4), "lines": (0.4, 0), "tsv": (0.7, 0),
    "iso_c": (0.6, 0), "iso_cts": (0.1, 0.4), "cart": (2.1, 1.0), "localize_stitch": (4.5, 0.4), "knots": (0.1, 0),
    "passthrough": (0.2, 0),
}
DEFAULT_WORKING = (9.9, 4.1)


def working_units(method: str, n_models: int, *, reference: bool = False) -> float:
    """The method's working memory (a + b·N, module table) in float32 tensors of the largest tensor's size."""
    a, b = ((REFERENCE if reference else FAST).get(method) or FAST.get(method)) or DEFAULT_WORKING
    return a + b * n_models


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
    docs/merging.md): the statistics, which the formula needs whole (a Fisher of the model's size per fine-tune;
    a Gram of d_in² per linear layer and fine-tune, `linear_inputs` = Σ d_in²), and what the hook holds beside
    them, in model sizes measured by `bench/prepare_memory.py` on a 42M Llama (fisher: the model, its gradients
    and their running sum, 3.1; regmean 2.2, regmean_pp 2.3, slwm 2.3: the model or working copy, the layers read
    from the checkpoints and the forward passes) and rounded up. The forward passes' share shrinks with the
    model, so these are upper bounds for larger ones."""
    model = size.bytes("float32")
    if method == "fisher":
        return {"model, gradients and their running sum": int(3.2 * model),
                "Fishers (one per fine-tune)": n_models * model}
    if method in ("regmean", "regmean_pp"):
        return {"model and forward passes": int({"regmean": 2.3, "regmean_pp": 2.4}[method] * model),
                "Gram matrices": n_models * linear_inputs * F32}
    return {"working copy, layers read and forward passes": int(2.4 * model)}


def gram_entries(ckpt) -> int:
    """Σ d_in² over the 2-D weights inside decoder layers (from the headers)."""
    from forgetlab.core.memory import in_decoder_layer

    return sum(i.shape[-1] ** 2 for n, i in ckpt.infos().items() if len(i.shape) == 2 and in_decoder_layer(n))


@register_estimator("merge")
def estimate_merge(recipe, *, pool=None, device: Optional[str] = None, dtype=None, evaluate: bool = False,
                   batch_size: int = 16, max_general: Optional[int] = None, max_task: Optional[int] = None,
                   **_: Any) -> MemoryEstimate:
    """The peak of merging `recipe` on `device` (the larger of its phases, module docstring) and, with `evaluate`,
    of scoring the base, the parents and the merge in `dtype` on `pool`'s probe data. Reads headers only (and
    tokenizes the probe texts when evaluating)."""
    from forgetlab.merge.core import float_entries, check_compatible, resident_budget, resident_bytes
    from forgetlab.merge.engine import align_sources, check_tokenizer_source, open_sources
    from forgetlab.merge.recipes import load_recipe
    from forgetlab.merge.registry import get_method

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
            from forgetlab.core.errors import ParameterError
            raise ParameterError("Estimating the merge's evaluation needs the pool that judges it (pool=…).")
        from forgetlab.core.eval_memory import estimate_eval
        from forgetlab.merge.workflow import recipe_parents

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
