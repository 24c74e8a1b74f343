"""PCB-merging's studies (docs/methods.md#pcb): the multi-model masking-ratio curve with the paper's validation
search of r and λ (`pcb-ratio`, its Figure 6), the balancing-activation ablation (`pcb-activation`, its Appendix
B.1) and inter-balancing with and without the j = i term (`pcb-self`, the review discussion).

Every study merges the same pool fine-tunes into the base with the registry's `pcb` method
(`forgetlab.merge.api.merge_state_dicts`, the merge `forgetlab merge` runs) and scores each merge as `forgetlab
merge --eval` does (`forgetlab.core.evaluate.evaluate` on the eval split, at the same budget), on one working copy
of the model that holds the base and the fine-tunes once (`MergeScorer`); the base's scorecard comes from the pool's
cache (`forgetlab.core.scorecards.pool_scorecard`: scored once). The validation search of `pcb-ratio` takes
`forgetlab pcb-search`'s path: PCB's components Ci at each r once (`pcb_components`), every λ a weighted sum of them
(`compose`), scored by the search's loss (`probe_loss`: mean answer loss on the probe split).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.analysis.lambda_search import PcbSearchSettings, compose, pcb_components, probe_loss
from forgetlab.analysis.study import StudyInfo, Verdict, study_analysis
from forgetlab.analysis.studies.finetunes import speciality_column
from forgetlab.core.checkpoints import load_model, open_checkpoint
from forgetlab.core.errors import ParameterError, ProbeDataError
from forgetlab.core.evaluate import Scorecard, evaluate
from forgetlab.core.memory import job_dtype
from forgetlab.core.progress import Progress, report, scaled
from forgetlab.core.scorecards import Budget, pool_scorecard
from forgetlab.core.settings import count_field, device_field, dtype_field, setting
from forgetlab.merge.api import merge_state_dicts
from forgetlab.merge.methods.common import LAM_RANGE
from forgetlab.merge.methods.pcb import ACTIVATIONS
from forgetlab.merge.workflow import default_merge_models, pool_recipe
from forgetlab.plots import annotation

PAPER = "PCB-merging"
RATIOS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)
SEARCH_RATIOS = (0.05, 0.1, 0.2)       # the paper's validation grid of r (the review discussion)
SEARCH_LAMS = (0.5, 1.0, 1.5, 2.0)
PAPER_BEST_R = (0.03, 0.3)             # "the optimal range for r is between 0.03 and 0.3" (the review discussion)
NEGLIGIBLE = 0.02
"""What `pcb-self` calls a negligible change: 0.02 of mean exact match, or 2 % of the mean answer loss."""


@dataclass
class PcbStudySettings:
    """What every PCB study shares: the fine-tunes merged, PCB's r, λ and scope, the scoring budget (as
    `forgetlab merge --eval` scores) and where the working copy runs."""

    models: Optional[tuple[str, ...]] = setting(None, help="pool fine-tunes to merge (default: the pool's full "
                                                           "fine-tunes, as the Merge page starts)")
    keep: float = setting(0.2, help="PCB's keep fraction r (the paper's default 0.2)", range=(0.0, 1.0),
                          label="keep fraction r")
    lam: float = setting(1.0, help="PCB's λ", range=LAM_RANGE, label="λ")
    scope: str = setting("global", help="PCB's scope: global (the paper's) or tensor", choices=("global", "tensor"))
    max_general: Optional[int] = count_field(32, "general-text blocks of each merge's score")
    max_task: Optional[int] = count_field(32, "eval pairs per task of each merge's score (and probe pairs per task "
                                              "of the validation search)")
    device: Optional[str] = device_field()
    dtype: Optional[str] = dtype_field("the working copy that scores each merge")


def merged_models(pool, settings: PcbStudySettings) -> list[str]:
    """The fine-tunes merged: the settings' or the pool's full fine-tunes (`default_merge_models`)."""
    return list(settings.models) if settings.models else default_merge_models(pool)


def pcb_params(settings: PcbStudySettings, **changes) -> dict:
    """PCB's parameters of one merge: the settings' r, λ and scope with `changes` (keep, lam, activation,
    self_term)."""
    return {"keep": settings.keep, "lam": settings.lam, "scope": settings.scope, **changes}


def check(settings: PcbStudySettings, pool=None) -> None:
    """With the pool: at least two fine-tunes of it and probe data."""
    if pool is None:
        return
    models = merged_models(pool, settings)
    if len(models) < 2:
        raise ParameterError(f"A PCB study merges at least two fine-tunes; got {models}. Give --models A,B[,…].")
    unknown = [m for m in models if m not in pool.model_names]
    if unknown:
        raise ParameterError(f"{', '.join(unknown)} is not in the pool; its models are {', '.join(pool.model_names)}.")
    if pool.probes is None or not pool.probes.tasks:
        raise ProbeDataError("A PCB study scores each merge on the pool's tasks: give the pool probe data "
                             "(pool.yaml probes).")


class MergeScorer:
    """The base and the fine-tunes to merge, held once, and one working copy of the model that scores each merge
    on the eval split (as `forgetlab merge --eval`); `base_card` is the pool's cached scorecard of the base."""

    def __init__(self, pool, settings: PcbStudySettings):
        self.pool, self.settings = pool, settings
        self.models = merged_models(pool, settings)
        recipe = pool_recipe(pool, "pcb", self.models, pcb_params(settings))
        base = open_checkpoint(pool.resolve_ref(recipe.base))
        self.base = base.state_dict()
        self.fts = [open_checkpoint(pool.resolve_ref(m.model), base=base).state_dict() for m in recipe.models]
        self.config = base.config
        self.budget = Budget(settings.max_general, settings.max_task)
        self.dtype = job_dtype(settings.dtype, settings.device)
        self.model = load_model(base, device=settings.device, dtype=self.dtype)
        self.dev = next(self.model.parameters()).device
        self.base_card = pool_scorecard(pool, "base", self.budget, device=settings.device, dtype=self.dtype)

    def merge(self, **params) -> dict:
        """PCB's merge of the fine-tunes with `params` over the settings' (`pcb_params`)."""
        return merge_state_dicts("pcb", self.base, self.fts, config=self.config, **pcb_params(self.settings, **params))

    def card(self, state, name: str, progress: Progress = None) -> Scorecard:
        """The scorecard of the weights `state`, written into the working copy."""
        self.model.load_state_dict({k: v.to(self.dev) for k, v in state.items()}, strict=False)
        return evaluate(self.model, self.pool.tokenizer, self.pool.probes, name=name,
                        max_general=self.budget.max_general, max_task=self.budget.max_task, progress=progress)

    def row(self, card: Scorecard, **columns) -> dict:
        """One table row: `columns`, then per task exact match and answer loss, their means (`speciality`,
        `answer_loss`), the general loss and the forgetting against the base."""
        row = dict(columns)
        for t, s in card.tasks.items():
            row[f"{t}/exact_match"], row[f"{t}/answer_loss"] = s.exact_match, s.answer_loss
        n = max(1, len(card.tasks))
        row["speciality"] = card.speciality()
        row["answer_loss"] = sum(s.answer_loss for s in card.tasks.values()) / n
        row["general_loss"] = card.general_loss
        row["forgetting"] = card.forgetting(self.base_card)
        return row

    def scored(self, name: str, progress: Progress = None, **params) -> dict:
        """Merge with `params`, score it, and return its row (with `params` and the seconds it took)."""
        start = time.perf_counter()
        card = self.card(self.merge(**params), name, progress)
        return self.row(card, **pcb_params(self.settings, **params), seconds=round(time.perf_counter() - start, 2))


def single_merges(pool, settings: PcbStudySettings, variants: Sequence[dict], search: Sequence[dict] = ()):
    """The single runs a study stands for, as `forgetlab pcb-search` settings (no analysis merges and scores one
    recipe alone): per scored merge, a search of budget 1 (the start λ only) that then merges the recipe and
    scores it as `forgetlab merge --eval` does (`merge` into a temporary folder); per validation point, a search
    of budget 1 without the merge (its probe loss)."""
    models = merged_models(pool, settings)
    out_root = Path(tempfile.gettempdir()) / "forgetlab-study-pcb"
    kw = dict(budget=1, max_task=settings.max_task, max_general=settings.max_general, device=settings.device,
              dtype=settings.dtype)
    runs = []
    for i, params in enumerate(variants):
        recipe = pool_recipe(pool, "pcb", models, pcb_params(settings, **params)).to_yaml()
        runs.append(("pcb-search", PcbSearchSettings(recipe=recipe, merge=str(out_root / f"merge-{i}"), overwrite=True,
                                                     **kw)))
    for params in search:
        recipe = pool_recipe(pool, "pcb", models, pcb_params(settings, **params)).to_yaml()
        runs.append(("pcb-search", PcbSearchSettings(recipe=recipe, **kw)))
    return runs


def speciality_text(table: pd.DataFrame) -> tuple[str, bool, str]:
    """The column a verdict reads (mean exact match, or mean answer loss where no merge answers exactly), whether
    higher is better, and its words."""
    column, higher = speciality_column(table)
    return column, higher, "mean exact match" if higher else "mean answer loss"


def best_row(rows: pd.DataFrame, column: str, higher: bool) -> pd.Series:
    """The row best in `column` (the first of equals)."""
    return rows.loc[rows[column].idxmax() if higher else rows[column].idxmin()]


def two_panels(title: str, x_title: str) -> go.Figure:
    """Speciality and general loss side by side."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("speciality", "general loss (↓)"))
    fig.update_layout(title=title, height=380)
    fig.update_xaxes(title_text=x_title)
    return fig


# -------------------------------------------------------------------------------------------- pcb-ratio

RATIO = StudyInfo(name="pcb-ratio", paper=PAPER, artifact="Figure 6 and its validation search", page="merge",
                  title="merging every fine-tune with PCB over the masking ratio r, and the search of r with λ",
                  claim="a small keep ratio r is best (the optimal range is 0.03–0.3; the validation search runs "
                        "over r ∈ {0.05, 0.1, 0.2}) and performance is robust over a range of r.")


@dataclass
class PcbRatioSettings(PcbStudySettings):
    """The r curve's grid, and the validation search's grids of r and λ."""

    ratios: tuple[float, ...] = setting(RATIOS, help="keep ratios r of the curve (each merge scored on every task "
                                                     "and the general text)", metavar="R[,R…]", range=(0.0, 1.0),
                                        label="r values")
    search_ratios: tuple[float, ...] = setting(SEARCH_RATIOS, help="r values of the validation search (the "
                                                                   "paper's {0.05, 0.1, 0.2})", metavar="R[,R…]",
                                               range=(0.0, 1.0), label="searched r values")
    search_lams: tuple[float, ...] = setting(SEARCH_LAMS, help="λ values of the validation search", metavar="L[,L…]",
                                             range=LAM_RANGE, label="searched λ values")


def check_grid(values: Sequence[float], flag: str, low_open: bool = True) -> None:
    """Distinct values, in (0, 1] for ratios."""
    values = list(values)
    if not values or len(set(values)) != len(values) or (low_open and any(not 0 < v <= 1 for v in values)):
        raise ParameterError(f"{flag} takes distinct values" + (" in (0, 1]" if low_open else "")
                             + f"; got {values}.")


def check_ratio(settings: PcbRatioSettings, pool=None) -> None:
    """The grids, then the shared checks."""
    check_grid(settings.ratios, "--ratios")
    check_grid(settings.search_ratios, "--search-ratios")
    check_grid(settings.search_lams, "--search-lams", low_open=False)
    check(settings, pool)


def compute_ratio(pool, settings: PcbRatioSettings, progress: Progress = None, executor=None) -> pd.DataFrame:
    """Rows `kind` = "base" (the base's scores), "curve" (one merge per r at the settings' λ), "search" (each
    (r, λ) of the validation search with its probe loss and the seconds it took) and "searched" (the best of the
    search, scored like the curve; `evaluations` and `seconds`: the whole search's count and cost)."""
    scorer = MergeScorer(pool, settings)
    rows = [scorer.row(scorer.base_card, kind="base", keep=0.0, lam=settings.lam)]
    ratios = sorted(settings.ratios)
    steps = len(ratios) + len(settings.search_ratios) + 1
    for k, r in enumerate(ratios):
        rows.append({"kind": "curve", **scorer.scored(f"pcb-r{r:g}", scaled(progress, k / steps, (k + 1) / steps),
                                                      keep=float(r))})
    start = time.perf_counter()
    loss = probe_loss(pool, max_task=settings.max_task, device=settings.device, dtype=settings.dtype)
    search = []
    for k, r in enumerate(sorted(settings.search_ratios)):
        t0 = time.perf_counter()
        comps = pcb_components(scorer.base, scorer.fts, float(r), settings.scope)
        built = time.perf_counter() - t0     # the components' cost, shared by the λ of this r
        for lam in settings.search_lams:
            t1 = time.perf_counter()
            value = loss(compose(scorer.base, comps, [float(lam)] * len(scorer.fts)))
            search.append({"kind": "search", "keep": float(r), "lam": float(lam), "probe_loss": value,
                           "seconds": round(time.perf_counter() - t1 + built / len(settings.search_lams), 3)})
        report(progress, (len(ratios) + k + 1) / steps, f"validation search r = {r:g}")
    seconds = time.perf_counter() - start
    best = min(search, key=lambda s: s["probe_loss"] if s["probe_loss"] == s["probe_loss"] else float("inf"))
    found = scorer.scored("pcb-searched", scaled(progress, (steps - 1) / steps, 1.0), keep=best["keep"],
                          lam=best["lam"])
    rows += search
    rows.append({"kind": "searched", **found, "probe_loss": best["probe_loss"], "evaluations": len(search),
                 "seconds": round(seconds, 2)})
    return pd.DataFrame(rows)


def figure_ratio(table: pd.DataFrame) -> go.Figure:
    """Speciality and general loss against r (the curve, the base dashed, the searched (r, λ) as a star), and the
    validation search's probe loss against λ, one line per r."""
    column, _, word = speciality_text(table[table.kind == "curve"])
    curve, base, found = table[table.kind == "curve"], table[table.kind == "base"], table[table.kind == "searched"]
    search = table[table.kind == "search"]
    fig = make_subplots(rows=1, cols=3, subplot_titles=(word, "general loss (↓)", "search: probe loss (↓)"))
    for col, name in ((1, column), (2, "general_loss")):
        fig.add_trace(go.Scatter(x=curve.keep, y=curve[name], mode="lines+markers", name="PCB, λ fixed",
                                 showlegend=col == 1, line=dict(color="#1f77b4")), row=1, col=col)
        fig.add_trace(go.Scatter(x=found.keep, y=found[name], mode="markers", name="searched (r, λ)",
                                 showlegend=col == 1, marker=dict(symbol="star", size=14, color="#d62728")),
                      row=1, col=col)
        for _, b in base.iterrows():
            fig.add_hline(y=b[name], line_dash="dash", line_color="#7f7f7f", row=1, col=col,
                          **annotation("base" if col == 1 else None))
        fig.update_xaxes(title_text="keep ratio r", row=1, col=col)
    for r, part in search.groupby("keep"):
        fig.add_trace(go.Scatter(x=part.lam, y=part.probe_loss, mode="lines+markers", name=f"search r = {r:g}"),
                      row=1, col=3)
    fig.update_xaxes(title_text="λ", row=1, col=3)
    fig.update_layout(title="PCB-merging: the masking ratio r (Figure 6) and the validation search", height=400)
    return fig


def verdict_ratio(table: pd.DataFrame, settings=None) -> Verdict:
    """Whether the curve's best r (the smallest of those reaching the best value, the others named) lies in the
    paper's optimal range 0.03–0.3; with the spread over the curve's r in that range, and the search's choice, its
    count and its cost."""
    curve = table[table.kind == "curve"]
    if curve.empty:
        return Verdict("the curve has no r to compare.", None)
    column, higher, word = speciality_text(curve)
    best = best_row(curve, column, higher)
    low, high = PAPER_BEST_R
    inside = curve[(curve.keep >= low) & (curve.keep <= high)]
    ties = curve[curve[column] == best[column]].keep.tolist()      # every r reaching the best value
    tied = f" (tied with r = {', '.join(f'{r:g}' for r in ties[1:])})" if len(ties) > 1 else ""
    measured = (f"best r on the curve by {word}: {best.keep:g}{tied} ({best[column]:.3f}, general loss "
                f"{best.general_loss:.3f}); over r in [{low:g}, {high:g}] {word} spans "
                f"{inside[column].min():.3f}–{inside[column].max():.3f}" if not inside.empty else
                f"best r on the curve by {word}: {best.keep:g}{tied} ({best[column]:.3f})")
    found = table[table.kind == "searched"]
    if not found.empty:
        f = found.iloc[0]
        measured += (f"; the search picks r = {f.keep:g}, λ = {f.lam:g} ({word} {f[column]:.3f}) after "
                     f"{int(f.evaluations)} evaluations in {f.seconds:.1f} s")
    measured += "."
    if low <= best.keep <= high:
        return Verdict(measured, True)
    return Verdict(measured, False, f"the best r, {best.keep:g}, lies outside the paper's optimal range "
                                    f"{low:g}–{high:g}")


def singles_ratio(pool, settings: PcbRatioSettings):
    """One merge-and-score per r of the curve and one for the search's choice (its r and λ are unknown beforehand:
    the start is taken), and one probe-loss evaluation per (r, λ) of the search (`single_merges`)."""
    variants = [{"keep": float(r)} for r in settings.ratios] + [{}]
    search = [{"keep": float(r), "lam": float(lam)} for r in settings.search_ratios for lam in settings.search_lams]
    return single_merges(pool, settings, variants, search)


RATIO_STUDY = study_analysis(RATIO, PcbRatioSettings, compute_ratio, figure_ratio, verdict_ratio,
                             checks=check_ratio, singles=singles_ratio)


# ---------------------------------------------------------------------------------------- pcb-activation

ACTIVATION = StudyInfo(name="pcb-activation", paper=PAPER, artifact="Appendix B.1 (activation ablation)",
                       page="merge", title="PCB's balancing activation: softmax against sigmoid, ReLU and tanh",
                       claim="softmax balances best; sigmoid, ReLU and tanh in its place lose a little.")


@dataclass
class PcbActivationSettings(PcbStudySettings):
    """The activations compared."""

    activations: tuple[str, ...] = setting(ACTIVATIONS, help="balancing activations (softmax is the paper's)",
                                           choices=ACTIVATIONS)


def check_activation(settings: PcbActivationSettings, pool=None) -> None:
    """Distinct activations, softmax among them; then the shared checks."""
    acts = list(settings.activations)
    if len(set(acts)) != len(acts) or "softmax" not in acts:
        raise ParameterError(f"--activations takes distinct activations including softmax; got {acts}.")
    check(settings, pool)


def compute_activation(pool, settings: PcbActivationSettings, progress: Progress = None,
                       executor=None) -> pd.DataFrame:
    """The base's row, then one merge per activation at the settings' r and λ."""
    scorer = MergeScorer(pool, settings)
    rows = [scorer.row(scorer.base_card, activation="base", keep=0.0, lam=settings.lam)]
    n = len(settings.activations)
    for k, act in enumerate(settings.activations):
        rows.append(scorer.scored(f"pcb-{act}", scaled(progress, k / n, (k + 1) / n), activation=act))
    return pd.DataFrame(rows)


def figure_activation(table: pd.DataFrame) -> go.Figure:
    """Speciality and general loss per activation, the base dashed."""
    merges, base = table[table.activation != "base"], table[table.activation == "base"]
    column, _, word = speciality_text(merges)
    fig = two_panels("PCB-merging: the balancing activation (Appendix B.1)", "activation")
    for col, name in ((1, column), (2, "general_loss")):
        fig.add_trace(go.Bar(x=merges.activation, y=merges[name], name=word if col == 1 else "general loss",
                             marker_color=["#d62728" if a == "softmax" else "#1f77b4" for a in merges.activation]),
                      row=1, col=col)
        for _, b in base.iterrows():
            fig.add_hline(y=b[name], line_dash="dash", line_color="#7f7f7f", row=1, col=col,
                          **annotation("base" if col == 1 else None))
    fig.layout.annotations[0].text = word
    return fig


def verdict_activation(table: pd.DataFrame, settings=None) -> Verdict:
    """Whether softmax is at least as good as every other activation on the speciality measure."""
    merges = table[table.activation != "base"]
    if "softmax" not in set(merges.activation) or len(merges) < 2:
        return Verdict("the table needs softmax and another activation.", None)
    column, higher, word = speciality_text(merges)
    soft = merges[merges.activation == "softmax"].iloc[0]
    others = merges[merges.activation != "softmax"]
    best = best_row(others, column, higher)
    measured = (f"{word}: " + ", ".join(f"{r.activation} {r[column]:.3f}" for _, r in merges.iterrows())
                + f"; general loss: " + ", ".join(f"{r.activation} {r.general_loss:.3f}" for _, r in merges.iterrows())
                + ".")
    beaten = best[column] > soft[column] if higher else best[column] < soft[column]
    if not beaten:
        return Verdict(measured, True)
    return Verdict(measured, False, f"{best.activation} beats softmax on {word} ({best[column]:.3f} against "
                                    f"{soft[column]:.3f})")


ACTIVATION_STUDY = study_analysis(
    ACTIVATION, PcbActivationSettings, compute_activation, figure_activation, verdict_activation,
    checks=check_activation,
    singles=lambda pool, s: single_merges(pool, s, [{"activation": a} for a in s.activations]))


# ---------------------------------------------------------------------------------------------- pcb-self

SELF = StudyInfo(name="pcb-self", paper=PAPER, artifact="review discussion (inter-balancing, j = i)", page="merge",
                 title="inter-balancing with and without the j = i term",
                 claim="leaving out j = i from inter-balancing changes little (35.14 against 35.12 on three LLM "
                       "tasks; negligible when merging eight models).")


def compute_self(pool, settings: PcbStudySettings, progress: Progress = None, executor=None) -> pd.DataFrame:
    """The base's row, then PCB with j = i (`self_term` True, the paper's) and without it, at the settings' r and
    λ."""
    scorer = MergeScorer(pool, settings)
    rows = [scorer.row(scorer.base_card, variant="base", keep=0.0, lam=settings.lam)]
    for k, (variant, on) in enumerate((("j = i included", True), ("j ≠ i", False))):
        rows.append({"variant": variant, **scorer.scored(f"pcb-self-{on}", scaled(progress, k / 2, (k + 1) / 2),
                                                         self_term=on)})
    return pd.DataFrame(rows)


def figure_self(table: pd.DataFrame) -> go.Figure:
    """Speciality per task and general loss of both forms, the base dashed."""
    merges, base = table[table.variant != "base"], table[table.variant == "base"]
    column, _, word = speciality_text(merges)
    suffix = "/exact_match" if column == "speciality" else "/answer_loss"
    tasks = [c[: -len(suffix)] for c in table.columns if c.endswith(suffix)]
    fig = two_panels("PCB-merging: inter-balancing with and without j = i", "")
    for _, r in merges.iterrows():
        fig.add_trace(go.Bar(x=[*tasks, "mean"], y=[*(r[t + suffix] for t in tasks), r[column]], name=r.variant),
                      row=1, col=1)
    fig.add_trace(go.Bar(x=merges.variant, y=merges.general_loss, name="general loss", showlegend=False,
                         marker_color="#7f7f7f"), row=1, col=2)
    for _, b in base.iterrows():
        fig.add_hline(y=b.general_loss, line_dash="dash", line_color="#7f7f7f", row=1, col=2, annotation_text="base")
    fig.layout.annotations[0].text = word
    return fig


def verdict_self(table: pd.DataFrame, settings=None) -> Verdict:
    """Whether the two forms differ by at most NEGLIGIBLE on the speciality measure (absolute for exact match,
    relative for the answer loss)."""
    merges = table[table.variant != "base"]
    with_i, without = merges[merges.variant == "j = i included"], merges[merges.variant == "j ≠ i"]
    if with_i.empty or without.empty:
        return Verdict("the table needs both forms.", None)
    column, higher, word = speciality_text(merges)
    a, b = with_i.iloc[0], without.iloc[0]
    diff = b[column] - a[column]
    size = abs(diff) if higher else abs(diff) / max(abs(a[column]), 1e-12)
    measured = (f"{word}: j = i included {a[column]:.3f}, j ≠ i {b[column]:.3f} ({diff:+.3f}); general loss "
                f"{a.general_loss:.3f} against {b.general_loss:.3f}.")
    limit = f"{NEGLIGIBLE:g}" if higher else f"{NEGLIGIBLE:.0%}"
    if size <= NEGLIGIBLE:
        return Verdict(measured, True)
    better = (diff > 0) == higher
    return Verdict(measured, False, f"leaving out j = i changes {word} by more than {limit} (j ≠ i "
                                    f"{'better' if better else 'worse'})")


SELF_STUDY = study_analysis(SELF, PcbStudySettings, compute_self, figure_self, verdict_self, checks=check,
                            singles=lambda pool, s: single_merges(pool, s, [{"self_term": True},
                                                                            {"self_term": False}]))
