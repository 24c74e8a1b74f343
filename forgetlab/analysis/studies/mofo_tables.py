"""MoFO's comparison tables as studies, each a set of fine-tunes on equal footing (same task, data, batches, seed
and budget; `forgetlab.analysis.studies.finetunes`):

- `mofo-hft` (its Table 1's HFT baseline): AdamW, MoFO and HFT — AdamW with a share of every layer's attention
  and MLP matrices frozen (docs/methods.md#hft);
- `mofo-filters` (its Table 5): MoFO's momentum filter against FLT(g), FLT(m/√v), FLT(g/√v) and random BCD at the
  same update fraction, with the share of weights moved more than 2e-6 (docs/methods.md#mofo-filters,
  #moved-share);
- `mofo-lion` (the authors' reply on other optimizers): Adam, Lion, MoFO on Adam and MoFO on Lion
  (docs/methods.md#lion);
- `mofo-partitions` (the authors' reply on partitioning): MoFO over PyTorch's tensor partitions against
  per-attention-head partitions (docs/methods.md#head-partitions).

Each table has one row per method: its name, the run's label, speciality (exact match), answer loss, general
loss, forgetting (general loss gained over the base), D(θ, θ0), the moved share and seconds. The verdicts read
the speciality with `speciality_column` (exact match, or the answer loss where no run answers exactly) and
share one rule for "forgets less at comparable speciality" (`forgets_less`, documented in docs/studies.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.analysis.study import StudyInfo, Verdict, study_analysis
from forgetlab.analysis.studies.finetunes import (FinetuneStudySettings, check_fraction_in, check_lion_scale,
                                                  config, estimate_runs, finetune_singles, fraction_field,
                                                  lion_lr_scale_field, run_configs, runs_table, speciality_column)
from forgetlab.core.errors import ParameterError
from forgetlab.core.settings import setting
from forgetlab.train.mofo import FILTERS
from forgetlab.train.runs import config_label
from forgetlab.train.results import FinetuneConfig

COMPARABLE = 0.05
"""How far a run's speciality may fall below another's and still count as comparable: 5 % of the other's value
(exact match at least 0.95× the other's; answer loss at most 1.05× the other's)."""
FILTER_NAMES = {"momentum": "MoFO", "gradient": "FLT(g)", "mv": "FLT(m/√v)", "gv": "FLT(g/√v)",
                "random": "random BCD"}
"""The paper's name of each MoFO filter (its Table 5)."""


# ------------------------------------------------------------------------------------------- shared pieces


def comparable(a: pd.Series, b: pd.Series, column: str, higher: bool) -> bool:
    """Whether run `a`'s speciality (`column`, `higher` better) is at least run `b`'s less COMPARABLE (5 %) of
    `b`'s value."""
    if higher:
        return bool(a[column] >= b[column] * (1 - COMPARABLE))
    return bool(a[column] <= b[column] * (1 + COMPARABLE))


def forgets_less(a: pd.Series, b: pd.Series, column: str, higher: bool) -> bool:
    """Whether run `a` forgets less than run `b` at comparable speciality: a strictly lower general loss (the
    same base, so strictly less forgetting) and a speciality `comparable` to `b`'s."""
    return bool(a["general_loss"] < b["general_loss"] and comparable(a, b, column, higher))


def why_not(a: pd.Series, b: pd.Series, column: str, higher: bool) -> str:
    """Why `forgets_less(a, b)` fails, in words with the numbers."""
    if a["general_loss"] >= b["general_loss"]:
        return (f"{a['method']}'s general loss {a['general_loss']:.4f} is not below {b['method']}'s "
                f"{b['general_loss']:.4f}")
    return (f"{a['method']}'s {column.replace('_', ' ')} {a[column]:.3f} is more than {COMPARABLE:.0%} worse than "
            f"{b['method']}'s {b[column]:.3f}")


def point(row: pd.Series, column: str) -> str:
    """One run in a verdict's words: its speciality and general loss."""
    return f"{row['method']} {column.replace('_', ' ')} {row[column]:.3f}, general loss {row['general_loss']:.4f}"


def method_table(pool, settings: FinetuneStudySettings, runs: Sequence[tuple[str, FinetuneConfig]], progress=None,
                 executor=None) -> pd.DataFrame:
    """The runs (method name, config) on equal footing, one row each in the given order, the method first."""
    names = {c.label: name for name, c in runs}
    table = runs_table(run_configs(pool, settings, [c for _, c in runs], progress, executor))
    table.insert(0, "method", table["label"].map(names))
    order = {name: i for i, (name, _) in enumerate(runs)}
    return table.sort_values("method", key=lambda s: s.map(order)).reset_index(drop=True)


def row_of(table: pd.DataFrame, method: str):
    """The row of `method`, or None where the table has none."""
    rows = table[table["method"] == method]
    return None if rows.empty else rows.iloc[0]


def tradeoff_figure(table: pd.DataFrame, title: str, bars: str = "distance",
                    bars_title: str = "D(θ, θ0)") -> go.Figure:
    """Left: each method's speciality (exact match, or answer loss where no run answers exactly) against its
    general loss, the speciality–generality plane; right: one bar per method of `bars`."""
    column, higher = speciality_column(table)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4],
                        subplot_titles=(f"{column.replace('_', ' ')} ({'↑' if higher else '↓'}) against general "
                                        "loss (↓)", bars_title))
    for _, row in table.iterrows():
        fig.add_trace(go.Scatter(x=[row["general_loss"]], y=[row[column]], mode="markers", name=row["method"],
                                 marker=dict(size=12)), row=1, col=1)    # named by the legend: no clipped labels
    fig.add_trace(go.Bar(x=table["method"], y=table[bars], showlegend=False, marker_color="#7f7f7f"), row=1, col=2)
    fig.update_xaxes(title_text="general loss", row=1, col=1)
    fig.update_yaxes(title_text=column.replace("_", " "), row=1, col=1)
    fig.update_layout(title=title, height=420)
    return fig


def declare(info: StudyInfo, settings: type, runs: Callable, figure: Callable, verdict: Callable,
            check: Callable = check_fraction_in):
    """One study made of the fine-tunes `runs(pool, settings)` lists as (method, config) pairs."""

    def compute(pool, s, progress=None, executor=None) -> pd.DataFrame:
        return method_table(pool, s, runs(pool, s), progress, executor)

    compute.__doc__ = f"The table of {info.name}: one row per method (`method_table`)."
    return study_analysis(info, settings, compute, figure, verdict, checks=check, points=True,
                          estimate=lambda pool, s: estimate_runs(pool, s, [c for _, c in runs(pool, s)]),
                          singles=lambda pool, s: finetune_singles(pool, s, [c for _, c in runs(pool, s)]))


# ------------------------------------------------------------------------------------------------ mofo-hft


HFT_INFO = StudyInfo(name="mofo-hft", paper="MoFO", artifact="Table 1 (HFT baseline)", page="finetune",
                     title="AdamW, MoFO and HFT (half of each layer's matrices frozen) side by side",
                     claim="MoFO forgets less than HFT and than AdamW at comparable speciality.")


@dataclass
class MofoHftSettings(FinetuneStudySettings):
    """MoFO's fraction and HFT's frozen share, over the shared fine-tune study settings."""

    fraction: float = fraction_field("the MoFO run")
    hft: float = setting(0.5, help="HFT's frozen share of each layer's attention and MLP matrices (0.5: the "
                                   "paper's half)", label="HFT frozen share", range=(0.0, 1.0))


def hft_runs(pool, s: MofoHftSettings) -> list[tuple[str, FinetuneConfig]]:
    """AdamW, MoFO (fraction) and HFT (AdamW with `hft` of the matrices frozen)."""
    return [("AdamW", config(pool, s, "adamw")),
            ("MoFO", config(pool, s, config_label("mofo", fraction=s.fraction), optimizer="mofo",
                            fraction=s.fraction)),
            ("HFT", config(pool, s, config_label("adamw", hft=s.hft), hft=s.hft))]


def check_hft(s: MofoHftSettings, pool=None) -> None:
    """A frozen share in (0, 1]; MoFO's fraction in (0, 1]; the task in the pool."""
    if not 0 < s.hft <= 1:
        raise ParameterError(f"--hft takes a share in (0, 1]; got {s.hft}. The paper's is 0.5.")
    check_fraction_in(s, pool)


def hft_verdict(table: pd.DataFrame, settings=None) -> Verdict:
    """Holds where MoFO `forgets_less` than both AdamW and HFT (strictly lower general loss, speciality within 5 %
    of each's)."""
    mofo, others = row_of(table, "MoFO"), [row_of(table, m) for m in ("AdamW", "HFT")]
    if mofo is None or any(o is None for o in others):
        return Verdict("the table needs AdamW, MoFO and HFT to compare.", None)
    column, higher = speciality_column(table)
    measured = "; ".join(point(r, column) for r in (mofo, *others)) + "."
    failed = [why_not(mofo, o, column, higher) for o in others if not forgets_less(mofo, o, column, higher)]
    return Verdict(measured, not failed, "; ".join(failed))


HFT_STUDY = declare(HFT_INFO, MofoHftSettings, hft_runs,
                    lambda t: tradeoff_figure(t, "MoFO's Table 1: AdamW, MoFO and HFT"), hft_verdict, check_hft)


# -------------------------------------------------------------------------------------------- mofo-filters


FILTERS_INFO = StudyInfo(name="mofo-filters", paper="MoFO", artifact="Table 5 (filter ablation)", page="finetune",
                         title="MoFO's momentum filter against FLT(g), FLT(m/√v), FLT(g/√v) and random BCD",
                         claim="filtering by momentum gives the best speciality–forgetting trade-off among the "
                               "filters at the same update fraction (and moves the fewest weights by > 2e-6).")


@dataclass
class MofoFiltersSettings(FinetuneStudySettings):
    """The filters compared and their shared update fraction, over the shared fine-tune study settings."""

    fraction: float = fraction_field("every filter's run (the same for all)")
    filters: tuple[str, ...] = setting(FILTERS, help="the filters compared (momentum is MoFO's own and is "
                                                     "required)", choices=FILTERS, label="filters",
                                       metavar="F[,F…]")


def filter_runs(pool, s: MofoFiltersSettings) -> list[tuple[str, FinetuneConfig]]:
    """One MoFO run per filter, all at the same fraction."""
    return [(FILTER_NAMES[f], config(pool, s, config_label("mofo", fraction=s.fraction, filter=f),
                                     optimizer="mofo", fraction=s.fraction, filter=f)) for f in s.filters]


def check_filters(s: MofoFiltersSettings, pool=None) -> None:
    """Known, distinct filters including momentum; the fraction in (0, 1]; the task in the pool."""
    got = list(s.filters)
    if "momentum" not in got or len(set(got)) != len(got) or len(got) < 2 or not set(got) <= set(FILTERS):
        raise ParameterError(f"--filters takes distinct filters among {', '.join(FILTERS)}, momentum (MoFO's own) "
                             f"and at least one other; got {got}. E.g. --filters momentum,gradient,random.")
    check_fraction_in(s, pool)


def rank_sums(table: pd.DataFrame, column: str, higher: bool) -> pd.Series:
    """Per method, its rank by speciality plus its rank by general loss (1 = best, ties share the lower rank):
    the smaller, the better the trade-off."""
    spec = table[column].rank(ascending=not higher, method="min")
    gen = table["general_loss"].rank(ascending=True, method="min")
    return pd.Series((spec + gen).to_numpy(), index=table["method"].to_numpy())


def filters_verdict(table: pd.DataFrame, settings=None) -> Verdict:
    """Holds where MoFO's rank sum (speciality rank + general-loss rank among the filters) is the smallest, ties
    included — so no other filter is ahead of it in both. Whether MoFO moves the fewest weights by > 2e-6 is
    reported beside it, not judged."""
    mofo = row_of(table, "MoFO")
    if mofo is None or len(table) < 2:
        return Verdict("the table needs MoFO and another filter to compare.", None)
    column, higher = speciality_column(table)
    sums = rank_sums(table, column, higher)
    best = sums.min()
    moved = ", ".join(f"{r['method']} {r['moved']:.3f}" for _, r in table.iterrows())
    fewest = bool(mofo["moved"] <= table["moved"].min())
    measured = ("rank sums (speciality + general loss, by " + column.replace("_", " ") + "): "
                + ", ".join(f"{m} {v:g}" for m, v in sums.items()) + f"; moved > 2e-6: {moved} (MoFO "
                + ("moves the fewest" if fewest else "does not move the fewest") + ").")
    if sums["MoFO"] <= best:
        return Verdict(measured, True)
    ahead = [m for m, v in sums.items() if v < sums["MoFO"]]
    return Verdict(measured, False, f"{', '.join(ahead)} {'has' if len(ahead) == 1 else 'have'} a smaller rank sum "
                                    f"than MoFO's {sums['MoFO']:g}")


FILTERS_STUDY = declare(FILTERS_INFO, MofoFiltersSettings, filter_runs,
                        lambda t: tradeoff_figure(t, "MoFO's Table 5: which entries move", bars="moved",
                                                  bars_title="share of weights moved > 2e-6"),
                        filters_verdict, check_filters)


# ----------------------------------------------------------------------------------------------- mofo-lion


LION_INFO = StudyInfo(name="mofo-lion", paper="MoFO", artifact="MoFO on Lion (authors' reply)", page="finetune",
                      title="Adam, Lion, MoFO and MoFO-Lion side by side",
                      claim="MoFO's filter applied to Lion reduces Lion's forgetting at comparable fine-tuning "
                            "performance, as it does for Adam.")


@dataclass
class MofoLionSettings(FinetuneStudySettings):
    """MoFO's fraction (both MoFO runs) and the Lion runs' learning rate, over the shared fine-tune study settings."""

    fraction: float = fraction_field("MoFO and MoFO-Lion")
    lion_lr_scale: float = lion_lr_scale_field()


def lion_runs(pool, s: MofoLionSettings) -> list[tuple[str, FinetuneConfig]]:
    """Adam(W) and MoFO at the study's lr; Lion and MoFO-Lion at `lion_lr_scale` times it."""
    adam = config(pool, s, "adamw")
    lion_lr = adam.lr * s.lion_lr_scale
    return [("Adam", adam),
            ("Lion", config(pool, s, "lion", optimizer="lion", lr=lion_lr)),
            ("MoFO", config(pool, s, config_label("mofo", fraction=s.fraction), optimizer="mofo",
                            fraction=s.fraction)),
            ("MoFO-Lion", config(pool, s, config_label("mofo-lion", fraction=s.fraction), optimizer="mofo-lion",
                                 fraction=s.fraction, lr=lion_lr))]


def check_lion(s: MofoLionSettings, pool=None) -> None:
    """A positive Lion lr scale; the fraction in (0, 1]; the task in the pool."""
    check_lion_scale(s)
    check_fraction_in(s, pool)


def lion_verdict(table: pd.DataFrame, settings=None) -> Verdict:
    """Holds where MoFO-Lion `forgets_less` than Lion (strictly lower general loss, speciality within 5 % of
    Lion's); the measurement also says whether MoFO does so against Adam."""
    rows = {m: row_of(table, m) for m in ("Adam", "Lion", "MoFO", "MoFO-Lion")}
    if rows["Lion"] is None or rows["MoFO-Lion"] is None:
        return Verdict("the table needs Lion and MoFO-Lion to compare.", None)
    column, higher = speciality_column(table)
    measured = "; ".join(point(r, column) for r in rows.values() if r is not None) + "."
    if rows["Adam"] is not None and rows["MoFO"] is not None:
        on_adam = forgets_less(rows["MoFO"], rows["Adam"], column, higher)
        measured += f" On Adam, MoFO {'forgets' if on_adam else 'does not forget'} less at comparable speciality."
    if forgets_less(rows["MoFO-Lion"], rows["Lion"], column, higher):
        return Verdict(measured, True)
    return Verdict(measured, False, why_not(rows["MoFO-Lion"], rows["Lion"], column, higher))


LION_STUDY = declare(LION_INFO, MofoLionSettings, lion_runs,
                     lambda t: tradeoff_figure(t, "MoFO on Adam and on Lion"), lion_verdict, check_lion)


# ----------------------------------------------------------------------------------------- mofo-partitions


PARTITIONS_INFO = StudyInfo(name="mofo-partitions", paper="MoFO", artifact="partition ablation (authors' reply)",
                            page="finetune", title="MoFO over PyTorch's tensor partitions and over attention heads",
                            claim="per-head partitions do as well as PyTorch's default ones, with slightly less "
                                  "forgetting on a small model: no more forgetting at comparable speciality.")


@dataclass
class MofoPartitionsSettings(FinetuneStudySettings):
    """MoFO's fraction (both runs), over the shared fine-tune study settings."""

    fraction: float = fraction_field("both runs")


PARTITION_NAMES = {"tensor": "default partitions", "head": "per-head partitions"}
"""The table's name of each partition scheme."""


def partition_runs(pool, s: MofoPartitionsSettings) -> list[tuple[str, FinetuneConfig]]:
    """MoFO over tensor partitions, then over per-head partitions, at the same fraction."""
    return [(PARTITION_NAMES[p], config(pool, s, config_label("mofo", fraction=s.fraction, partition=p),
                                        optimizer="mofo", fraction=s.fraction, partition=p))
            for p in ("tensor", "head")]


def partitions_verdict(table: pd.DataFrame, settings=None) -> Verdict:
    """Holds where the per-head run's general loss is at most the default run's and its speciality is
    `comparable` (within 5 %) to the default run's."""
    tensor, head = row_of(table, PARTITION_NAMES["tensor"]), row_of(table, PARTITION_NAMES["head"])
    if tensor is None or head is None:
        return Verdict("the table needs both partition schemes to compare.", None)
    column, higher = speciality_column(table)
    measured = f"{point(tensor, column)}; {point(head, column)}."
    if head["general_loss"] > tensor["general_loss"]:
        return Verdict(measured, False, f"per-head partitions forget more (general loss {head['general_loss']:.4f} "
                                        f"> {tensor['general_loss']:.4f})")
    if not comparable(head, tensor, column, higher):
        return Verdict(measured, False, why_not(head, tensor, column, higher))
    return Verdict(measured, True)


PARTITIONS_STUDY = declare(PARTITIONS_INFO, MofoPartitionsSettings, partition_runs,
                           lambda t: tradeoff_figure(t, "MoFO's partitions: tensors or attention heads"),
                           partitions_verdict)
