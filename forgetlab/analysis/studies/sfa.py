"""SFA's averaging-frequency curve (soup-to-go, its p ablation): fine-tune with SFA at several p — averaging with the
start every ⌈p·T⌉ steps and at the end; p = 1 averages once at the end, which is WiSE-FT with α = 1 − β — beside
plain AdamW, and put each run's speciality and general loss against p (docs/methods.md#sfa)."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.analysis.study import StudyInfo, Verdict, study_analysis
from forgetlab.analysis.studies.finetunes import (FinetuneStudySettings, check_task, config, dominates,
                                                  estimate_runs, finetune_singles, run_configs, runs_table,
                                                  speciality_column)
from forgetlab.core.errors import ParameterError
from forgetlab.core.settings import setting
from forgetlab.train.runs import SFA_BETA

INFO = StudyInfo(name="sfa-frequency", paper="SFA", artifact="the averaging-frequency ablation",
                 page="finetune", title="speciality and general loss against SFA's averaging frequency p",
                 claim="averaging during fine-tuning (p < 1) does better than averaging once at the end (p = 1, "
                       "WiSE-FT): some p < 1 keeps at least the speciality of p = 1 with less forgetting.")


@dataclass
class SfaFrequencySettings(FinetuneStudySettings):
    """The p grid and β of the SFA runs, over the shared fine-tune study settings."""

    ps: tuple[float, ...] = setting((0.05, 0.1, 0.25, 0.5, 1.0), help="SFA's averaging frequencies p (1: once at "
                                                                      "the end, WiSE-FT)", label="p values",
                                    metavar="P[,P…]", range=(0.0, 1.0))
    beta: float = setting(SFA_BETA, help="SFA's β: θ ← (1 − β)·θ + β·θ_start", label="SFA β", range=(0.0, 1.0))


def configs_of(pool, settings: SfaFrequencySettings):
    """AdamW, then one SFA run per p."""
    return [config(pool, settings, "adamw"),
            *[config(pool, settings, f"sfa-p{p:g}", sfa_p=float(p), sfa_beta=settings.beta) for p in settings.ps]]


def check(settings: SfaFrequencySettings, pool=None) -> None:
    """Distinct p values in (0, 1]; the task in the pool."""
    ps = list(settings.ps)
    if not ps or any(not 0 < p <= 1 for p in ps) or len(set(ps)) != len(ps):
        raise ParameterError(f"--ps takes distinct values in (0, 1]; got {ps}. E.g. --ps 0.05,0.1,0.25,0.5,1.")
    check_task(settings, pool)


def compute(pool, settings: SfaFrequencySettings, progress=None, executor=None) -> pd.DataFrame:
    """Each run's final row (`runs_table`) with its p (none for AdamW), in the order AdamW, then p ascending."""
    table = runs_table(run_configs(pool, settings, configs_of(pool, settings), progress, executor))
    p = {f"sfa-p{p:g}": float(p) for p in settings.ps}
    table.insert(1, "p", table["label"].map(p))
    return pd.concat([table[table.p.isna()], table[table.p.notna()].sort_values("p")], ignore_index=True)


def figure(table: pd.DataFrame) -> go.Figure:
    """Speciality (exact match, or answer loss where no SFA run answers exactly) and general loss against p, with
    AdamW as a dashed line in each."""
    column, higher = speciality_column(table[table.p.notna()])
    sfa, plain = table[table.p.notna()], table[table.p.isna()]
    names = {"speciality": "exact match (↑)", "answer_loss": "answer loss (↓)"}
    fig = make_subplots(rows=1, cols=2, subplot_titles=(names[column], "general loss (↓)"))
    for col, name in ((1, column), (2, "general_loss")):
        fig.add_trace(go.Scatter(x=sfa.p, y=sfa[name], mode="lines+markers", name="SFA", showlegend=col == 1,
                                 line=dict(color="#1f77b4")), row=1, col=col)
        for _, row in plain.iterrows():
            fig.add_trace(go.Scatter(x=[sfa.p.min(), sfa.p.max()], y=[row[name]] * 2, mode="lines",
                                     name="AdamW (no averaging)", showlegend=col == 1,
                                     line=dict(color="#7f7f7f", dash="dash")), row=1, col=col)
        fig.update_xaxes(title_text="p", type="log", tickvals=list(sfa.p), ticktext=[f"{p:g}" for p in sfa.p],
                         row=1, col=col)
    fig.update_layout(title="SFA: the averaging frequency p (averages every ⌈p·T⌉ steps; p = 1 is WiSE-FT)",
                      height=380)
    return fig


def verdict(table: pd.DataFrame, settings=None) -> Verdict:
    """Whether some p < 1 lies ahead of p = 1 (at least its speciality, at most its general loss, better in one)."""
    column, higher = speciality_column(table[table.p.notna()])
    end = table[table.p == 1.0]
    during = table[table.p.notna() & (table.p < 1.0)]
    if end.empty or during.empty:
        return Verdict("the grid needs p = 1 and some p < 1 to compare.", None)
    last = end.iloc[0]
    ahead = [r for _, r in during.iterrows() if dominates(r, last, column, higher)]
    word = "exact match" if higher else "answer loss"
    best = max(during.iterrows(), key=lambda kv: kv[1][column] if higher else -kv[1][column])[1]
    measured = (f"p = 1: {word} {last[column]:.3f}, general loss {last['general_loss']:.3f}; best p < 1 by {word}: "
                f"p = {best['p']:g} with {best[column]:.3f}, general loss {best['general_loss']:.3f}.")
    if ahead:
        return Verdict(measured + f" Ahead of p = 1: p = {', '.join(f'{r.p:g}' for r in ahead)}.", True)
    return Verdict(measured, False, "no p < 1 keeps p = 1's speciality at a lower general loss.")


STUDY = study_analysis(INFO, SfaFrequencySettings, compute, figure, verdict, checks=check, points=True,
                       estimate=lambda pool, s: estimate_runs(pool, s, configs_of(pool, s)),
                       singles=lambda pool, s: finetune_singles(pool, s, configs_of(pool, s)))
