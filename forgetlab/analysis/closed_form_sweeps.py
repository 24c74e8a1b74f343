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
                 α may exceed 1 (the paper tunes it up to ≈ 2); α = 0 is θ0. Its range is the registry's
                 `iso_c` α range (one home: the method's ParamSpec).

Each is an Analysis ("sweep-lines", "sweep-rank", "sweep-iso"; `forgetlab sweep lines|rank|iso`) with its
settings declared here. This module builds on the public pieces of forgetlab.analysis.sweeps; nothing imports it
back (the registry finds it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from forgetlab.analysis.sweep_analysis import SweepSettings, sweep_analysis
from forgetlab.analysis.sweep_results import SweepResult
from forgetlab.analysis.sweeps import SweepSpec, check_grid, check_swept_model, run_specs, sweep_recipe, wise_ft_at
from forgetlab.core.errors import ParameterError
from forgetlab.core.settings import FieldInfo, checked_value, setting, settings_fields
from forgetlab.merge.registry import get_method
from forgetlab.merge.working_copy import TensorMerger

ISO_RANGE = next(p.range for p in get_method("iso_c").params if p.name == "alpha")
"""The Iso-C α an iso curve takes: the registry's range of `iso_c`'s α."""


@dataclass
class LinesSettings(SweepSettings):
    """A LiNeS β curve (`lines_curve`)."""

    betas: tuple[float, ...] = setting(tuple(round(0.1 * i, 1) for i in range(11)),
                                       help="LiNeS β values in [0, 1], comma separated", range=(0.0, 1.0),
                                       label="LiNeS β values in [0, 1]")


@dataclass
class RankSettings(SweepSettings):
    """A TSV rank curve (`rank_curve`)."""

    ranks: tuple[float, ...] = setting((1.0, 0.5, 0.25, 0.1, 0.05, 0.02, 0.01),
                                       help="TSV keep fractions of the rank, in (0, 1], comma separated",
                                       range=(0.0, 1.0), label="TSV keep fractions of the rank, in (0, 1]")


@dataclass
class IsoSettings(SweepSettings):
    """An Iso-C α curve (`iso_curve`)."""

    iso_alphas: tuple[float, ...] = setting(
        (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0), range=ISO_RANGE,
        help=f"Iso-C α values in [{ISO_RANGE[0]:g}, {ISO_RANGE[1]:g}], comma separated",
        label=f"Iso-C α values in [{ISO_RANGE[0]:g}, {ISO_RANGE[1]:g}]")


def _lines(beta: float, config, names) -> TensorMerger:
    """LiNeS with α = 1 − β (the registry's `lines`)."""
    return TensorMerger("lines", {"alpha": 1.0 - beta, "beta": beta}, config=config, names=names)


def lines_curve(pool, model: str, *, betas: Sequence[float] = LinesSettings.betas, **kw) -> SweepResult:
    """LiNeS β curve (module docstring); other keywords as `forgetlab.analysis.sweeps.alpha_curve`."""
    grid = check_grid("beta", betas)
    check_swept_model(pool, model)
    names = list(pool.base.names())
    specs = [SweepSpec("lines", b, {"beta": b, "alpha": round(1.0 - b, 12)},
                       wise_ft_at(1.0) if b <= 0 else _lines(b, pool.config, names)) for b in grid]
    return _run(pool, model, "lines", specs, dict(betas=grid), kw)


def _rank(keep: float) -> TensorMerger:
    """TSV at `keep` with one task (the registry's `tsv`, α = 1); keep 1 is θ1 exactly."""
    return wise_ft_at(1.0) if keep >= 1 else TensorMerger("tsv", {"alpha": 1.0, "keep": keep})


def rank_curve(pool, model: str, *, ranks: Sequence[float] = RankSettings.ranks, **kw) -> SweepResult:
    """TSV rank curve (module docstring); other keywords as `forgetlab.analysis.sweeps.alpha_curve`."""
    grid = check_grid("rank", ranks)
    if any(k <= 0 for k in grid):
        raise ParameterError("Every rank fraction must be > 0 (TSV keeps at least one singular triplet); "
                             "the base is the alpha sweep's α = 0.")
    specs = [SweepSpec("tsv", k, {"keep": k}, _rank(k)) for k in grid]
    return _run(pool, model, "rank", specs, dict(ranks=grid), kw)


_ISO_ALPHAS: FieldInfo = next(f for f in settings_fields(IsoSettings) if f.name == "iso_alphas")


def iso_curve(pool, model: str, *, iso_alphas: Sequence[float] = IsoSettings.iso_alphas, **kw) -> SweepResult:
    """Iso-C α curve (module docstring); other keywords as `forgetlab.analysis.sweeps.alpha_curve`."""
    grid = list(checked_value(_ISO_ALPHAS, list(iso_alphas) if iso_alphas is not None else []))
    specs = [SweepSpec("iso_c", a, {"alpha": a}, wise_ft_at(0.0) if a == 0 else TensorMerger("iso_c", {"alpha": a}))
             for a in grid]
    return _run(pool, model, "iso", specs, dict(iso_alphas=grid), kw)


def _run(pool, model: str, kind: str, specs: list, grid: dict, kw: dict[str, Any]) -> SweepResult:
    opts = dict(task=None, device=None, batch_size=SweepSettings.batch_size, max_general=None, max_task=None,
                tasks=None, on_point=None, progress=None, benchmarks=None, executor=None, dtype=None)
    unknown = set(kw) - set(opts)
    if unknown:
        raise ParameterError(f"{', '.join(sorted(unknown))} {'is not a setting' if len(unknown) == 1 else 'are not settings'} "
                             f"of a {kind} sweep.")
    opts.update(kw)
    tasks = opts["tasks"]
    recipe = sweep_recipe(pool, model, kind, **grid, task=opts["task"], max_general=opts["max_general"],
                          max_task=opts["max_task"], tasks=list(tasks) if tasks is not None else None)
    return run_specs(pool, model, kind, specs, recipe=recipe, **opts)


CURVES = {"lines": lines_curve, "rank": rank_curve, "iso": iso_curve}
"""The curve of each closed-form kind, looked up when its sweep runs."""

LINES = sweep_analysis("lines", LinesSettings, CURVES, title="LiNeS β curve (α = 1 − β)",
                       help="LiNeS β curve (α = 1 − β)",
                       description="LiNeS in its single-task editing form: β = 0 is the fine-tuned model, β = 1 keeps "
                                   "the embeddings at θ0 and grows linearly to the full τ at the last layer.")
RANK = sweep_analysis("rank", RankSettings, CURVES, title="TSV rank curve", help="TSV rank curve",
                      description="TSV with one task: θ0 + the rank-k truncation of τ per 2-D weight, k the kept share "
                                  "of the rank (keep = 1 is the fine-tuned model).")
ISO = sweep_analysis("iso", IsoSettings, CURVES, title="Iso-C α curve", help="Iso-C α curve",
                     description="Iso-C: θ0 + α·σ̄·U·Vᵀ of τ per 2-D weight (a flattened spectrum), θ0 + α·τ "
                                 "elsewhere; α = 0 is the base.")
