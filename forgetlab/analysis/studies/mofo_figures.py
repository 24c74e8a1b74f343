"""MoFO's two figures of forgetting against closeness to the base (docs/methods.md#mofo):

- `forgetting-vs-distance` (the paper's Figure 2): fine-tune with AdamW, Lion (docs/methods.md#lion) and MoFO,
  recording along the way, and put each record's forgetting (general loss gained over the base) against its
  distance D(θ, θ0) (docs/methods.md#distance-from-the-base) — one curve per optimizer. The claim: forgetting
  grows with D, and MoFO ends closer to the base than Adam with less forgetting.
- `mofo-pareto` (the paper's Section 4.2, "Comparison from a Pareto perspective"): several settings per method on
  one chart — MoFO at several update fractions, L1- and L2-to-init at several strengths
  (docs/methods.md#l1-to-init), HMA α triples (docs/methods.md#hma, through the `sweep hma` analysis' own grid)
  on the pool's fine-tune of the task, that fine-tune itself, and AdamW — with the Pareto front across all of them
  (docs/methods.md#pareto-front). The claim: MoFO's points lie on (or near) the front.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.analysis.measures import pareto_mask
from forgetlab.analysis.study import StudyInfo, Verdict, study_analysis
from forgetlab.analysis.studies.finetunes import (FinetuneStudySettings, budget_of, check_fraction_in,
                                                  check_lion_scale, check_task, config, estimate_runs,
                                                  finetune_singles, fraction_field, lion_lr_scale_field, run_configs,
                                                  speciality_column, with_task)
from forgetlab.analysis.sweeps import HmaSettings, hma_grid
from forgetlab.core.errors import ParameterError, check_fraction
from forgetlab.core.progress import scaled
from forgetlab.core.settings import setting
from forgetlab.train.runs import L1_DEFAULT, config_label, default_record_every

RHO_MIN = 0.5
"""The Spearman ρ of forgetting against D from which `forgetting-vs-distance` calls forgetting "growing with D"
(a clear monotone tendency over the records of one run)."""
COLORS = {"adamw": "#1f77b4", "lion": "#ff7f0e", "mofo": "#2ca02c", "l1": "#9467bd", "l2": "#8c564b",
          "hma": "#e377c2", "fine-tune": "#7f7f7f"}


# ------------------------------------------------------------------------------------ forgetting against D


@dataclass
class DistanceSettings(FinetuneStudySettings):
    """MoFO's update fraction and Lion's learning rate, over the shared fine-tune study settings (records every
    ⌈T/10⌉ steps unless `eval_every` is given)."""

    fraction: float = fraction_field("the MoFO run")
    lion_lr_scale: float = lion_lr_scale_field()


def distance_configs(pool, settings: DistanceSettings):
    """AdamW, Lion (at `lion_lr_scale` times AdamW's learning rate) and MoFO (at `fraction`) on the same budget and
    batches."""
    lr = budget_of(pool, settings)["lr"]
    return [config(pool, settings, "adamw"),
            config(pool, settings, "lion", optimizer="lion", lr=lr * settings.lion_lr_scale),
            config(pool, settings, config_label("mofo", fraction=settings.fraction), optimizer="mofo",
                   fraction=float(settings.fraction))]


def recorded(pool, settings: DistanceSettings) -> DistanceSettings:
    """The settings with the task and the record interval filled in: ten records (`default_record_every`) where
    none is given, since the figure is drawn from the records along each run."""
    settings = with_task(pool, settings)
    if settings.eval_every is None:
        settings = replace(settings, eval_every=default_record_every(budget_of(pool, settings)["steps"]))
    return settings


def check_distance(settings: DistanceSettings, pool=None) -> None:
    """A fraction in (0, 1], a Lion learning-rate multiple > 0; the task in the pool."""
    check_lion_scale(settings)
    check_fraction_in(settings, pool)


def compute_distance(pool, settings: DistanceSettings, progress=None, executor=None) -> pd.DataFrame:
    """One row per (optimizer, record): its step, D(θ, θ0), general loss, forgetting (general loss − the base's,
    step 0 being the base) and speciality (exact match, with the answer loss beside it)."""
    settings = recorded(pool, settings)
    comp = run_configs(pool, settings, distance_configs(pool, settings), progress, executor)
    rows = []
    for run in comp.runs:
        records = [r for r in run.train.history if "general_loss" in r]
        start = run.start_card.general_loss
        for r in records:
            rows.append({"optimizer": run.label, "step": int(r["step"]), "distance": float(r.get("distance", 0.0)),
                         "general_loss": float(r["general_loss"]), "forgetting": float(r["general_loss"]) - start,
                         "speciality": float(r["exact_match"]), "answer_loss": float(r["answer_loss"])})
    return pd.DataFrame(rows, columns=["optimizer", "step", "distance", "general_loss", "forgetting", "speciality",
                                       "answer_loss"])


def family(label: str) -> str:
    """A run's method from its label: "mofo-0.2" → "mofo", "l2-1" → "l2", "adamw" → "adamw"."""
    return str(label).split("-")[0] if not str(label).startswith("fine-tune") else "fine-tune"


def distance_figure(table: pd.DataFrame) -> go.Figure:
    """Forgetting (general loss gained over the base) against D(θ, θ0), one line per optimizer through its
    records in step order."""
    fig = go.Figure()
    for name, runs in table.groupby("optimizer", sort=False):
        runs = runs.sort_values("step")
        fig.add_trace(go.Scatter(x=runs.distance, y=runs.forgetting, mode="lines+markers", name=str(name),
                                 line=dict(color=COLORS.get(family(name))), customdata=runs[["step"]],
                                 hovertemplate="step %{customdata[0]}<br>D %{x:.4f}<br>forgetting %{y:.4f}"))
    fig.add_hline(y=0, line_dash="dot", line_color="#bbbbbb")
    fig.update_layout(title="Forgetting against the distance from the base, by optimizer (MoFO)", height=420,
                      xaxis_title="D(θ, θ0): mean relative change per tensor",
                      yaxis_title="forgetting: general loss − base's (nats, ↓)")
    return fig


def spearman(table: pd.DataFrame, x: str = "distance", y: str = "forgetting") -> float:
    """The Spearman rank correlation of `y` against `x` over the rows (NaN with fewer than three rows or a
    constant column)."""
    if len(table) < 3:
        return float("nan")
    return float(table[[x, y]].corr(method="spearman").iloc[0, 1])


def distance_verdict(table: pd.DataFrame, settings=None) -> Verdict:
    """Forgetting grows with D within every run (Spearman ρ ≥ RHO_MIN) and MoFO ends closer to the base than AdamW
    (smaller final D) with less forgetting."""
    if table.empty:
        return Verdict("no records to measure.", None)
    rho = {str(k): spearman(g) for k, g in table.groupby("optimizer", sort=False)}
    last = table.sort_values("step").groupby("optimizer", sort=False).tail(1).set_index("optimizer")
    adam = next((k for k in last.index if family(k) == "adamw"), None)
    mofo = next((k for k in last.index if family(k) == "mofo"), None)
    rhos = ", ".join(f"{k} {v:+.2f}" for k, v in rho.items())
    measured = f"Spearman ρ(forgetting, D) per run: {rhos}."
    if adam is None or mofo is None:
        return Verdict(measured + " The table needs an AdamW and a MoFO run to compare.", None)
    a, m = last.loc[adam], last.loc[mofo]
    measured += (f" Final D: {mofo} {m.distance:.4f} vs {adam} {a.distance:.4f}; final forgetting: {mofo} "
                 f"{m.forgetting:+.4f} vs {adam} {a.forgetting:+.4f} nats.")
    weak = [k for k, v in rho.items() if not v >= RHO_MIN]
    reasons = []
    if weak:
        reasons.append(f"forgetting does not grow with D (ρ < {RHO_MIN}) in {', '.join(weak)}")
    if not m.distance < a.distance:
        reasons.append("MoFO does not end closer to the base than AdamW")
    if not m.forgetting < a.forgetting:
        reasons.append("MoFO does not forget less than AdamW")
    return Verdict(measured, not reasons, "; ".join(reasons))


def distance_singles(pool, settings: DistanceSettings):
    """The three `forgetlab finetune` runs, with the study's records."""
    settings = recorded(pool, settings)
    return finetune_singles(pool, settings, distance_configs(pool, settings))


DISTANCE_INFO = StudyInfo(
    name="forgetting-vs-distance", paper="MoFO", artifact="Figure 2", page="finetune",
    title="forgetting against the distance D(θ, θ0) from the base, for AdamW, Lion and MoFO",
    claim="forgetting grows with the distance from the base, and MoFO stays closer to the base (smaller D at the "
          "end) with less forgetting than AdamW.")

DISTANCE = study_analysis(DISTANCE_INFO, DistanceSettings, compute_distance, distance_figure, distance_verdict,
                          checks=check_distance, points=True, singles=distance_singles,
                          estimate=lambda pool, s: estimate_runs(pool, s, distance_configs(pool, s)))


# --------------------------------------------------------------------------------------- the Pareto chart


@dataclass
class ParetoSettings(FinetuneStudySettings):
    """The settings of each method on the chart, over the shared fine-tune study settings: MoFO's fractions,
    L1's and L2's strengths, HMA's α tuples and the pool's fine-tune HMA merges with the base."""

    fractions: tuple[float, ...] = setting((0.05, 0.1, 0.2, 0.5), help="MoFO's update fractions α",
                                           range=(0.0, 1.0), label="MoFO fractions", metavar="A[,A…]")
    l1s: tuple[float, ...] = setting((L1_DEFAULT / 10, L1_DEFAULT, L1_DEFAULT * 10),
                                     help="L1-to-init strengths λ1 (loss + λ1‖θ − θo‖₁)", range=(0.0, None),
                                     label="L1 strengths", may_be_empty=True)
    l2s: tuple[float, ...] = setting((0.1, 1.0, 10.0), help="L2-to-init strengths λ2 (loss + (λ2/2)‖θ − θo‖²)",
                                     range=(0.0, None), label="L2 strengths", may_be_empty=True)
    hma: tuple[tuple[float, ...], ...] = setting(
        ((0.05, 0.2, 0.35), (0.35, 0.2, 0.05), (0.3, 0.5, 0.7), (0.7, 0.5, 0.3), (0.65, 0.8, 0.95),
         (0.95, 0.8, 0.65)), help="HMA α tuples, one α per block of layers (default: six of the MoFO rebuttal's "
                                  "triples, each direction at each level)", range=(0.0, 1.0),
        label="HMA α tuples (one per line)", may_be_empty=True)
    model: Optional[str] = setting(None, help="the pool's fine-tune that HMA merges with the base (default: the "
                                              "pool's model named like the task)", label="fine-tuned model")


def pareto_configs(pool, settings: ParetoSettings):
    """AdamW, MoFO at each fraction, L1-to-init and L2-to-init at each strength, on the same budget and batches."""
    return [config(pool, settings, "adamw"),
            *[config(pool, settings, config_label("mofo", fraction=f), optimizer="mofo", fraction=float(f))
              for f in settings.fractions],
            *[config(pool, settings, f"l1-{v:g}", l1=float(v)) for v in settings.l1s],
            *[config(pool, settings, f"l2-{v:g}", l2=float(v)) for v in settings.l2s]]


def swept_model(pool, settings: ParetoSettings) -> str:
    """The fine-tune HMA merges: `model`, else the pool's model named like the task (`ModelPool.model_for_task`)."""
    return pool.model_for_task(with_task(pool, settings).task, settings.model)


def hma_tuples(settings: ParetoSettings) -> list[tuple[float, ...]]:
    """The HMA tuples evaluated: the given ones, then all ones (the fine-tune itself) unless given."""
    tuples = [tuple(float(a) for a in t) for t in settings.hma]
    blocks = len(tuples[0]) if tuples else len(HmaSettings.grid[0])
    ones = (1.0,) * blocks
    return tuples + ([ones] if ones not in tuples else [])


def check_pareto(settings: ParetoSettings, pool=None) -> None:
    """Distinct fractions in (0, 1], distinct strengths > 0, HMA tuples of one length with each α in [0, 1]; the
    task and the swept model in the pool."""
    fr = list(settings.fractions)
    if any(not 0 < f <= 1 for f in fr) or len(set(fr)) != len(fr):
        raise ParameterError(f"--fractions takes distinct values in (0, 1]; got {fr}. E.g. --fractions 0.05,0.2,0.5.")
    for name, values in (("--l1s", settings.l1s), ("--l2s", settings.l2s)):
        if any(not v > 0 for v in values) or len(set(values)) != len(values):
            raise ParameterError(f"{name} takes distinct strengths > 0; got {list(values)}. E.g. {name} 0.1,1,10.")
    sizes = {len(t) for t in settings.hma}
    if len(sizes) > 1 or 0 in sizes:
        raise ParameterError(f"Every HMA tuple needs the same number of blocks (≥ 1); got sizes {sorted(sizes)}. "
                             "E.g. --hma 0.1,0.2,0.3 0.3,0.2,0.1.")
    for t in settings.hma:
        for a in t:
            check_fraction("every HMA alpha", a)
    check_task(settings, pool)
    if pool is not None:
        model = swept_model(pool, settings)
        if model == "base":
            raise ParameterError("HMA needs a fine-tuned model, not the base; pass --model one of "
                                 f"{', '.join(pool.model_names)}.")
        pool.check_models([model])
        layers = pool.anatomy.num_layers
        if settings.hma and 0 < layers < len(settings.hma[0]):
            raise ParameterError(f"The HMA tuples have {len(settings.hma[0])} α values but the pool's models have "
                                 f"{layers} decoder layers: give at most {layers} values per tuple (one per block "
                                 "of layers), e.g. --hma " + ",".join(["0.5"] * layers) + ".")


def setting_text(label: str) -> str:
    """A fine-tune's setting in words from its label: "fraction 0.2", "λ1 0.001", "λ2 1", "—" for AdamW."""
    kind, _, value = str(label).partition("-")
    return {"mofo": f"fraction {value}", "l1": f"λ1 {value}", "l2": f"λ2 {value}"}.get(kind, "—")


def compute_pareto(pool, settings: ParetoSettings, progress=None, executor=None) -> pd.DataFrame:
    """One row per setting: the fine-tunes' final scores (AdamW, MoFO, L1, L2), then HMA's tuples and the pool's
    fine-tune (HMA at α = 1 everywhere) evaluated by `hma_grid`; the Pareto fronts across all rows (`mark_front`:
    speciality against general loss)."""
    settings = with_task(pool, settings)
    configs = pareto_configs(pool, settings)
    share = len(configs) / (len(configs) + 0.2 * len(hma_tuples(settings)))    # an evaluation ≈ a fifth of a run
    comp = run_configs(pool, settings, configs, scaled(progress, 0.0, share), executor)
    rows = [{"method": family(r.label), "setting": setting_text(r.label), "speciality": r.speciality,
             "answer_loss": r.value("answer_loss"), "general_loss": r.general_loss, "distance": r.distance}
            for r in comp.runs]
    model = swept_model(pool, settings)
    sweep = hma_grid(pool, model, grid=hma_tuples(settings), task=settings.task, tasks=[settings.task],
                     max_general=settings.max_general, max_task=settings.max_task, device=settings.device,
                     dtype=settings.dtype, executor=executor, progress=scaled(progress, share, 1.0))
    for p in sweep.points:
        alphas = tuple(p.settings["alphas"])
        whole = all(a == 1.0 for a in alphas)
        rows.append({"method": "fine-tune" if whole else "hma",
                     "setting": model if whole else "α " + "/".join(f"{a:g}" for a in alphas),
                     "speciality": p.speciality(settings.task), "answer_loss": p.speciality(settings.task,
                                                                                            "answer_loss"),
                     "general_loss": p.general_loss, "distance": p.distance})
    table = pd.DataFrame(rows, columns=["method", "setting", "speciality", "answer_loss", "general_loss",
                                        "distance"])
    return mark_front(table)


def front_column(table: pd.DataFrame) -> tuple[str, bool]:
    """The speciality the front is taken on and whether higher is better: exact match where it tells the
    fine-tunes apart, else the answer loss (lower better) — where no row answers exactly (`speciality_column`) or
    where every fine-tune (AdamW, MoFO, L1, L2) reaches the same exact match, so that it ranks none of them."""
    column, higher = speciality_column(table)
    tuned = table[~table.method.isin(["hma", "fine-tune"])]
    if column == "speciality" and tuned.speciality.nunique() <= 1:
        return "answer_loss", False
    return column, higher


def front(table: pd.DataFrame, column: str, higher: bool) -> list[bool]:
    """The rows no other row beats on both `column` (`higher` better) and general loss
    (`forgetlab.analysis.measures.pareto_mask`)."""
    sign = 1.0 if higher else -1.0
    return pareto_mask([sign * v for v in table[column]], list(table["general_loss"]))


def mark_front(table: pd.DataFrame) -> pd.DataFrame:
    """The table with its front columns: `pareto` on `front_column`'s speciality, `pareto_exact_match` on exact
    match (the paper's measure) and `pareto_answer_loss` on the answer loss."""
    out = table.copy()
    out["pareto"] = front(table, *front_column(table))
    out["pareto_exact_match"] = front(table, "speciality", True)
    out["pareto_answer_loss"] = front(table, "answer_loss", False)
    return out


def pareto_figure(table: pd.DataFrame) -> go.Figure:
    """Exact match (left) and answer loss (right) against general loss, one marker series per method (hover: its
    setting), each panel's Pareto front as a dashed line through its points."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("exact match (↑)", "answer loss (↓)"))
    for col, (column, flags) in enumerate((("speciality", "pareto_exact_match"),
                                           ("answer_loss", "pareto_answer_loss")), start=1):
        for method, rows in table.groupby("method", sort=False):
            fig.add_trace(go.Scatter(x=rows.general_loss, y=rows[column], mode="markers", name=str(method),
                                     legendgroup=str(method), showlegend=col == 1, text=rows.setting,
                                     marker=dict(size=10, color=COLORS.get(str(method))),
                                     hovertemplate="%{text}<br>general loss %{x:.4f}<br>%{y:.4f}"), row=1, col=col)
        on = table[table[flags].astype(bool)].sort_values("general_loss")
        fig.add_trace(go.Scatter(x=on.general_loss, y=on[column], mode="lines", name="Pareto front",
                                 legendgroup="front", showlegend=col == 1, line=dict(color="#222222", dash="dash")),
                      row=1, col=col)
        fig.update_xaxes(title_text="general loss (nats, ↓)", row=1, col=col)
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_layout(title="MoFO, L1, L2, HMA and AdamW: speciality against general loss (MoFO)", height=460)
    return fig


def pareto_verdict(table: pd.DataFrame, settings=None) -> Verdict:
    """How many of MoFO's settings lie on the Pareto front across every method (on `front_column`'s speciality);
    the claim holds when at least half do."""
    mofo = table[table.method == "mofo"]
    if mofo.empty:
        return Verdict("no MoFO setting on the chart.", None)
    column, _ = front_column(table)
    on = mofo[mofo.pareto.astype(bool)]
    on_front = table[table.pareto.astype(bool)]
    owners = ", ".join(f"{m} {n}" for m, n in on_front.method.value_counts().items())
    word = "exact match" if column == "speciality" else "answer loss"
    measured = (f"On {word}: {len(on)} of {len(mofo)} MoFO settings on the front ({', '.join(on.setting) or 'none'}); "
                f"the front's {len(on_front)} points by method: {owners}.")
    if column != "speciality" and "pareto_exact_match" in table:
        em = mofo[mofo.pareto_exact_match.astype(bool)]
        tuned = table[~table.method.isin(["hma", "fine-tune"])].speciality
        measured += (f" On exact match (every fine-tune at {tuned.max():.3f}, so the front there is the lowest "
                     f"general loss among them): {len(em)} of {len(mofo)}.")
    if 2 * len(on) >= len(mofo):
        return Verdict(measured, True)
    return Verdict(measured, False, "most of MoFO's settings are dominated by another method's")


def pareto_singles(pool, settings: ParetoSettings):
    """The `forgetlab finetune` runs of the chart and the one `forgetlab sweep hma` over its tuples."""
    settings = with_task(pool, settings)
    return [*finetune_singles(pool, settings, pareto_configs(pool, settings)),
            ("sweep-hma", HmaSettings(model=swept_model(pool, settings), task=settings.task, tasks=(settings.task,),
                                      grid=tuple(hma_tuples(settings)), max_general=settings.max_general,
                                      max_task=settings.max_task, device=settings.device, dtype=settings.dtype))]


PARETO_INFO = StudyInfo(
    name="mofo-pareto", paper="MoFO", artifact="Section 4.2 (Pareto comparison)", page="finetune",
    title="MoFO's fractions, L1/L2 strengths, HMA triples and AdamW: speciality, general loss and the Pareto front",
    claim="MoFO's settings lie on (or near) the Pareto front of speciality against general loss across MoFO, "
          "L1- and L2-to-init, HMA and plain fine-tuning.")

PARETO = study_analysis(PARETO_INFO, ParetoSettings, compute_pareto, pareto_figure, pareto_verdict,
                        checks=check_pareto, points=True, singles=pareto_singles,
                        estimate=lambda pool, s: estimate_runs(pool, s, pareto_configs(pool, s)))
