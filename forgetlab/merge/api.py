"""In-memory merging: `merge_state_dicts(method, base, finetuned, **params)` (docs/methods.md names)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from forgetlab.core.errors import IncompatibleModelsError, ParameterError
from forgetlab.core.progress import Progress, scaled
from forgetlab.merge.core import DictSource, check_compatible, collect_stats, merge_tensors
from forgetlab.merge.registry import get_method, validate_params


def merge_state_dicts(method: str, base: Mapping[str, torch.Tensor],
                      finetuned: Sequence[Mapping[str, torch.Tensor]], *, prepared: Mapping[str, Any] | None = None,
                      config=None, device: str = "cpu", progress: Progress = None, **params) -> dict[str, torch.Tensor]:
    """Merge fine-tuned state dicts into the base with a registered method and return the merged state dict.

    `params` use docs/methods.md's names (alpha, alphas, weights, lam, keep, drop, ratio, gamma, k, scope, seed,
    score); they are validated against `forgetlab.merge.METHODS` (unknown names or methods, values out of
    range, wrong number of models and mismatched shapes raise ForgetlabError subclasses). Global-scope
    methods compute their statistics over all tensors first, exactly as the streaming engine does.
    `prepared` holds per-tensor coefficients for methods with a `prepare` hook; `config` (a transformers
    config) gives HMA the number of layers. Outputs keep each base tensor's dtype.
    """
    spec = get_method(method)
    if isinstance(finetuned, Mapping):
        raise ParameterError("finetuned must be a list of state dicts (one per fine-tuned model), not one dict.")
    finetuned = list(finetuned or [])
    p = validate_params(spec, params, n_models=len(finetuned))
    if spec.needs_pool and prepared is None:
        raise ParameterError(f"{spec.name} needs coefficients prepared from a model pool with probe data: pass "
                             "prepared=… (or use forgetlab.merge.run with pool=…).")
    aliases = tied_aliases(base)
    base, finetuned = _without_aliases(base, finetuned, aliases)
    finetuned = without_tied_copies(base, finetuned)
    base_src = DictSource(base, "the base")
    models = [DictSource(sd, f"fine-tuned model {i + 1}") for i, sd in enumerate(finetuned)]
    entries = check_compatible(base_src, models)
    glob = spec.needs_global_pass(p)
    stats = collect_stats(spec, p, base_src, models, entries, device, scaled(progress, 0.0, 0.5 if glob else 0.0))
    it = merge_tensors(spec, p, base_src, models, entries, stats=stats, prepared=prepared, config=config,
                       device=device, progress=scaled(progress, 0.5 if glob else 0.0, 1.0))
    merged = dict(it)
    for alias, name in aliases.items():     # tied tensors are one tensor: merged once, shared again
        merged[alias] = merged[name]
    return merged


def tied_aliases(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Names of a state dict that are another name's tensor (tied weights, e.g. lm_head and the embedding of a
    model with tie_word_embeddings): alias → the first name holding that tensor."""
    first: dict[tuple, str] = {}
    aliases = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
    return aliases


def without_tied_copies(base: Mapping[str, torch.Tensor],
                        finetuned: Sequence[Mapping[str, torch.Tensor]]) -> list[Mapping[str, torch.Tensor]]:
    """The fine-tuned state dicts without the tied copies they store and the base does not: a tensor the base
    lacks that equals another tensor of the same fine-tune which the base has (a `.bin` fine-tune of a tied model
    stores lm_head, a copy of its embedding, where the base's safetensors file stores the embedding once). Any
    other tensor the base lacks stays, and the compatibility check names it."""
    out = []
    for sd in finetuned:
        extra = [n for n in sd if n not in base]
        drop = {n for n in extra if any(m in base and sd[m].shape == sd[n].shape and torch.equal(sd[m], sd[n])
                                        for m in sd if m != n)}
        out.append({n: t for n, t in sd.items() if n not in drop} if drop else sd)
    return out


def _without_aliases(base, finetuned, aliases):
    """The state dicts without the base's tied aliases; a fine-tune whose alias is not its tied tensor (it untied
    the head) is refused by name: merging it would silently drop its head."""
    if not aliases:
        return base, finetuned
    for i, sd in enumerate(finetuned):
        for alias, name in aliases.items():
            if alias in sd and name in sd and not torch.equal(sd[alias], sd[name]):
                raise IncompatibleModelsError(
                    f"In the base, {alias} is tied to {name} (one tensor), but fine-tuned model {i + 1} has its own "
                    f"{alias}: the merge would keep one of the two and drop the other. Merge fine-tunes that kept "
                    "the weights tied, or untie the base first (give it its own copy of the tensor).")
    base = {n: t for n, t in base.items() if n not in aliases}
    finetuned = [{n: t for n, t in sd.items() if n not in aliases} for sd in finetuned]
    return base, finetuned
