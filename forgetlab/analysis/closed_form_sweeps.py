"""Forgetting curves of the closed-form merges (issue 26), on one fine-tuned model θ1 (τ = θ1 − θ0), evaluated as
every sweep of `forgetlab.analysis.sweeps` (speciality, generality, D(θ, θ0), Pareto front):

- `lines_curve`  LiNeS's β (docs/methods.md#lines) in the paper's single-task editing form, α = 1 − β:
                 λ(ℓ) = (1 − β) + β·(ℓ − 1)/(L − 1), so β = 0 is θ1 and β = 1 keeps the embeddings at θ0 and
                 grows linearly to the full τ at the last layer. x = β.
- `rank_curve`   TSV's `keep` as a rank curve (docs/methods.md#tsv): θ0 + trunc_k(τ) per 2-D weight, k =
                 max(1, ⌊keep·min(m, n)⌋) (with one task the polar factors leave the truncated SVD as it is),
                 other tensors θ1; x = keep, the share of the rank kept, beside the density curves' share of
                 entries. keep = 1 is θ1.
- `iso_curve`    Iso-C's α (docs/methods.md#iso_c): θ0 + α·σ̄·U·Vᵀ of τ per 2-D weight, θ0 + α·τ elsewhere.
                 α may exceed 1 (the paper tunes it up to ≈ 2); α = 0 is θ0.
"""
from __future__ import annotations

from typing import Sequence

from forgetlab.core.errors import ParameterError
from forgetlab.merge.working_copy import TensorMerger

DEFAULT_BETAS = tuple(round(0.1 * i, 1) for i in range(11))
DEFAULT_RANKS = (1.0, 0.5, 0.25, 0.1, 0.05, 0.02, 0.01)
DEFAULT_ISO_ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)


def _lines(beta: float, config, names) -> TensorMerger:
    """LiNeS with α = 1 − β (the registry's `lines`)."""
    return TensorMerger("lines", {"alpha": 1.0 - beta, "beta": beta}, config=config, names=names)


def lines_curve(pool, model: str, *, betas: Sequence[float] = DEFAULT_BETAS, **kw):
    """LiNeS β curve (module docstring); other keywords as `forgetlab.analysis.sweeps.alpha_curve`."""
    from forgetlab.analysis import sweeps as sw

    grid = sw._check_grid("beta", betas)
    sw.check_swept_model(pool, model)
    names = list(pool.base.names())
    specs = [sw._Spec("lines", b, {"beta": b, "alpha": round(1.0 - b, 12)},
                      sw.wise_ft_at(1.0) if b <= 0 else _lines(b, pool.config, names)) for b in grid]
    return _run(pool, model, "lines", specs, dict(betas=grid), kw)


def _rank(keep: float) -> TensorMerger:
    """TSV at `keep` with one task (the registry's `tsv`, α = 1); keep 1 is θ1 exactly."""
    from forgetlab.analysis.sweeps import wise_ft_at

    return wise_ft_at(1.0) if keep >= 1 else TensorMerger("tsv", {"alpha": 1.0, "keep": keep})


def rank_curve(pool, model: str, *, ranks: Sequence[float] = DEFAULT_RANKS, **kw):
    """TSV rank curve (module docstring); other keywords as `forgetlab.analysis.sweeps.alpha_curve`."""
    from forgetlab.analysis import sweeps as sw

    grid = sw._check_grid("rank", ranks)
    if any(k <= 0 for k in grid):
        raise ParameterError("Every rank fraction must be > 0 (TSV keeps at least one singular triplet); "
                             "the base is the alpha sweep's α = 0.")
    specs = [sw._Spec("tsv", k, {"keep": k}, _rank(k)) for k in grid]
    return _run(pool, model, "rank", specs, dict(ranks=grid), kw)


def iso_curve(pool, model: str, *, iso_alphas: Sequence[float] = DEFAULT_ISO_ALPHAS, **kw):
    """Iso-C α curve (module docstring); other keywords as `forgetlab.analysis.sweeps.alpha_curve`."""
    from forgetlab.analysis import sweeps as sw

    vals = list(iso_alphas) if iso_alphas is not None else []
    if not vals:
        raise ParameterError("The Iso-C α grid is empty; give values ≥ 0 such as 0 0.5 1 1.5.")
    grid = []
    for a in vals:
        try:
            a = float(a)
        except (TypeError, ValueError):
            raise ParameterError(f"Every Iso-C α must be a number; got {a!r}.") from None
        if not 0.0 <= a <= 10.0:
            raise ParameterError(f"Every Iso-C α must lie in [0, 10]; got {a}.")
        grid.append(a)
    specs = [sw._Spec("iso_c", a, {"alpha": a}, sw.wise_ft_at(0.0) if a == 0 else TensorMerger("iso_c", {"alpha": a}))
             for a in grid]
    return _run(pool, model, "iso", specs, dict(iso_alphas=grid), kw)


def _run(pool, model, kind, specs, grid: dict, kw: dict):
    from forgetlab.analysis import sweeps as sw

    opts = dict(task=None, device=None, batch_size=16, max_general=None, max_task=None, tasks=None, on_point=None,
                progress=None, benchmarks=None, executor=None, dtype=None)
    unknown = set(kw) - set(opts)
    if unknown:
        raise ParameterError(f"{', '.join(sorted(unknown))} {'is not a setting' if len(unknown) == 1 else 'are not settings'} "
                             f"of a {kind} sweep.")
    opts.update(kw)
    tasks = opts["tasks"]
    recipe = sw._recipe(pool, model, kind, **grid, task=opts["task"], max_general=opts["max_general"],
                        max_task=opts["max_task"], tasks=list(tasks) if tasks is not None else None)
    return sw._run(pool, model, kind, specs, recipe=recipe, **opts)



# kind → (its grid setting, default grid, label, help): what the CLI and the Forgetting curves page offer
GRIDS = {
    "lines": ("betas", DEFAULT_BETAS, "LiNeS β curve (α = 1 − β)", "LiNeS β values in [0, 1]"),
    "rank": ("ranks", DEFAULT_RANKS, "TSV rank curve", "TSV keep fractions of the rank, in (0, 1]"),
    "iso": ("iso_alphas", DEFAULT_ISO_ALPHAS, "Iso-C α curve", "Iso-C α values in [0, 10]"),
}
