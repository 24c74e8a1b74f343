"""In-memory merging: `merge_state_dicts(method, base, finetuned, **params)` (docs/methods.md names)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from forgetlab.core.errors import ParameterError
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
    base_src = DictSource(base, "the base")
    models = [DictSource(sd, f"fine-tuned model {i + 1}") for i, sd in enumerate(finetuned)]
    entries = check_compatible(base_src, models)
    glob = spec.needs_global_pass(p)
    stats = collect_stats(spec, p, base_src, models, entries, device, scaled(progress, 0.0, 0.5 if glob else 0.0))
    it = merge_tensors(spec, p, base_src, models, entries, stats=stats, prepared=prepared, config=config,
                       device=device, progress=scaled(progress, 0.5 if glob else 0.0, 1.0))
    return dict(it)
