"""The submodule-linearity paper's studies (Dai et al., ICLR 2025; docs/methods.md#submodule-levels, #slwm):

- `nls-draws`: the non-linearity score of the model and of every layer, attention, MLP and head as mean ± std over
  seeded draws of the probe data (docs/methods.md#probe-draws), with the share of each level's submodules that are
  more linear (lower NLS) than their parent (a layer's parent is the model; an attention's or MLP's, its layer; a
  head's, its attention);
- `slwm-data`: the data-count ablation — SLWM merge weights solved from 1, 2, 5, … probe samples per task, the
  merged model scored on every task and on general text, as the average normalized score (the share of each
  fine-tune's own-task gain kept, docs/methods.md#retention);
- `slwm-models`: the model-count ablation — every subset of k of the fine-tunes merged with SLWM and with task
  arithmetic (its best λ of a grid, per subset), the average normalized score per k.

Every draw d uses seed `--seed + d` (nls-draws) or `--seed + d·T` (the SLWM studies: slwm draws task t's pairs with
seed + t, so no two tasks or draws share a seed). The base and each fine-tune are scored once per study, at the
study's budget (`forgetlab.core.scorecards.pool_scorecard`, cached with the pool); the merges are built from one
copy of the state dicts into one working model.
"""
from __future__ import annotations

import copy
import itertools
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forgetlab.analysis.linearity import DEFAULT_ALPHAS, LinearitySettings, nonlinearity_scores
from forgetlab.analysis.retention import gain_share, own_tasks
from forgetlab.analysis.study import StudyInfo, Verdict, study_analysis, study_task
from forgetlab.core.anatomy import LEVELS
from forgetlab.core.errors import ParameterError
from forgetlab.core.evaluate import evaluate
from forgetlab.core.progress import report, scaled
from forgetlab.core.scorecards import Budget, pool_scorecard
from forgetlab.core.settings import count_field, device_field, seed_field, setting
from forgetlab.merge.api import merge_state_dicts
from forgetlab.merge.workflow import merge_and_evaluate, pool_recipe
from forgetlab.merge.methods.slwm import DEFAULT_LEVEL, DEFAULT_RIDGE, DEFAULT_SAMPLES, SLWM_LEVELS, slwm_weights
from forgetlab.plots import annotation

PARENT = {"layer": "model", "attn": "layer", "mlp": "layer", "head": "attn"}
"""Each submodule level's parent level (the module it is part of)."""
MEASURES = ("exact_match", "answer_loss")


def draws_field(default: int):
    """`draws`: how many seeded draws of the probe data the ± is taken over."""
    return count_field(default, "seeded draws of the probe data; the table reports mean ± std over them")


def study_seed_field():
    """`seed`: the base seed of the draws (draw d uses a seed of its own, the module docstring)."""
    return seed_field("base seed of the probe draws")


def probe_count(pool, tasks: Sequence[str]) -> int:
    """The fewest probe pairs any of `tasks` has (what a draw of samples is bounded by)."""
    return min(len(pool.probes.task(t).probe) for t in tasks)


def population_std(values) -> float:
    """The population standard deviation (NaN for no finite value), as the linearity analysis reports it."""
    v = np.asarray([x for x in values if x == x], dtype=float)
    return float(v.std()) if len(v) else float("nan")


def finite_mean(values) -> float:
    """The mean of the finite values (NaN for none)."""
    v = np.asarray([x for x in values if x == x], dtype=float)
    return float(v.mean()) if len(v) else float("nan")


# ================================================================================================ nls-draws

NLS_INFO = StudyInfo(
    name="nls-draws", paper="Submodule linearity", artifact="Figure 1 / Table 1 (NLS per level), ± over draws",
    page="linearity", title="non-linearity score per level and submodule, mean ± std over probe draws",
    claim="submodules are more linear than the whole model: every submodule level's NLS is below the model's "
          "(the rebuttal adds the share of MLPs and heads more linear than their parent).")


@dataclass
class NlsDrawsSettings:
    """The linearity run of each draw (task, model, levels, α grid, samples) and the draws."""

    task: Optional[str] = setting(None, help="task whose probe samples are drawn (default: the pool's first task)")
    model: Optional[str] = setting(None, help="fine-tuned model (default: the one named like the task)")
    levels: Optional[tuple[str, ...]] = setting(None, help="levels to score (default: every level the model has)",
                                                choices=LEVELS)
    samples: int = count_field(16, "probe samples per draw (at most the task's probe count)")
    draws: int = draws_field(3)
    seed: int = study_seed_field()
    alphas: tuple[float, ...] = setting(DEFAULT_ALPHAS, help="α grid, comma-separated; α = 1 is the reference",
                                        range=(0.0, 1.0), label="α grid")
    batch_size: int = count_field(8, "probe samples per forward pass")
    device: Optional[str] = device_field()


def nls_runs(pool, s: NlsDrawsSettings) -> list[LinearitySettings]:
    """One `forgetlab linearity` run per draw: draw d with seed `seed + d`."""
    task = study_task(pool, s.task)
    n = min(s.samples, probe_count(pool, [task])) if pool is not None else s.samples
    levels = None if s.levels is None else tuple(s.levels)
    return [LinearitySettings(task=task, model=s.model, levels=levels, alphas=tuple(s.alphas), samples=n,
                              seed=s.seed + d, batch_size=s.batch_size, device=s.device) for d in range(s.draws)]


def nls_table(draws: Sequence[dict]) -> pd.DataFrame:
    """The study's table from each draw's {(level, layer, head): (module, mean NLS)}: first one row per level
    (submodule "all": the mean over its submodules, per draw), then one per submodule, each with nls_mean and
    nls_std over the draws, its parent and the parent's NLS, and `more_linear_share` — per submodule, the share
    of draws in which it is more linear than its parent; per level, the share of its submodules that are (mean over
    draws, ± `more_linear_std`)."""
    keys = list(draws[0])

    def parent_key(key):
        level, layer, _ = key
        up = PARENT.get(level)
        return None if up is None else (up, None if up == "model" else layer, None)

    rows, per_level = [], {}
    for key in keys:
        level, layer, head = key
        vals = [d[key][1] for d in draws]
        pk = parent_key(key)
        pvals = [d[pk][1] if pk in d else float("nan") for d in draws]
        below = [float(v < p) for v, p in zip(vals, pvals) if v == v and p == p]
        rows.append({"level": level, "submodule": draws[0][key][0], "layer": layer, "head": head,
                     "nls_mean": finite_mean(vals), "nls_std": population_std(vals),
                     "parent": draws[0][pk][0] if pk in draws[0] else None,
                     "parent_nls_mean": finite_mean(pvals), "more_linear_share": finite_mean(below),
                     "more_linear_std": float("nan")})
        per_level.setdefault(level, []).append((vals, pvals))
    summary = []
    for level, items in per_level.items():
        means = [finite_mean([v[d] for v, _ in items]) for d in range(len(draws))]
        shares = [finite_mean([float(v[d] < p[d]) for v, p in items if v[d] == v[d] and p[d] == p[d]])
                  for d in range(len(draws))]
        summary.append({"level": level, "submodule": "all", "layer": None, "head": None,
                        "nls_mean": finite_mean(means), "nls_std": population_std(means),
                        "parent": PARENT.get(level), "parent_nls_mean": float("nan"),
                        "more_linear_share": finite_mean(shares), "more_linear_std": population_std(shares)})
    table = pd.DataFrame(summary + rows)
    for level in table.level.unique():   # a level's parent NLS: the parent level's mean
        up = PARENT.get(level)
        if up is not None and (up in per_level):
            table.loc[(table.level == level) & (table.submodule == "all"), "parent_nls_mean"] = \
                table[(table.level == up) & (table.submodule == "all")].nls_mean.iloc[0]
    table["layer"] = table["layer"].astype("Int64")
    table["head"] = table["head"].astype("Int64")
    table.insert(2, "draws", len(draws))
    return table


def nls_compute(pool, s: NlsDrawsSettings, progress=None, executor=None) -> pd.DataFrame:
    """`nonlinearity_scores` on each draw, gathered by `nls_table`."""
    runs = nls_runs(pool, s)
    draws = []
    for d, run in enumerate(runs):
        r = nonlinearity_scores(pool, run.task, model=run.model, levels=run.levels, alphas=run.alphas,
                                samples=run.samples, seed=run.seed, batch_size=run.batch_size, device=run.device,
                                progress=scaled(progress, d / len(runs), (d + 1) / len(runs)))
        draws.append({(x.level, x.layer, x.head): (x.module, x.nls_mean) for x in r.scores})
    return nls_table(draws)


def nls_figure(table: pd.DataFrame) -> go.Figure:
    """Mean NLS per level with its std over the draws as error bars, and the share of each level's submodules
    more linear than their parent."""
    lv = table[table.submodule == "all"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("NLS per level (mean ± std over draws)",
                                                        "share more linear than the parent"))
    fig.add_trace(go.Bar(x=lv.level, y=lv.nls_mean, error_y=dict(type="data", array=lv.nls_std.fillna(0)),
                         name="NLS", marker_color="#1f77b4"), row=1, col=1)
    sub = lv[lv.parent.notna()]
    fig.add_trace(go.Bar(x=[f"{a} < {p}" for a, p in zip(sub.level, sub.parent)], y=sub.more_linear_share,
                         error_y=dict(type="data", array=sub.more_linear_std.fillna(0)), name="share",
                         marker_color="#2ca02c"), row=1, col=2)
    fig.update_yaxes(range=[0, 1], row=1, col=2)
    fig.update_layout(title=f"Non-linearity over {int(table.draws.iloc[0]) if len(table) else 0} probe draws",
                      height=380, showlegend=False)
    return fig


def nls_verdict(table: pd.DataFrame, settings=None) -> Verdict:
    """Whether every submodule level's mean NLS lies below the model's (with the MLP and head shares beside)."""
    lv = table[table.submodule == "all"].set_index("level")
    if "model" not in lv.index or not (lv.loc["model", "nls_mean"] == lv.loc["model", "nls_mean"]):
        return Verdict("the model level was not scored (add model to --levels).", None)
    model = lv.loc["model", "nls_mean"]
    subs = [x for x in lv.index if x != "model" and lv.loc[x, "nls_mean"] == lv.loc[x, "nls_mean"]]
    if not subs:
        return Verdict("no submodule level was scored.", None)
    text = "; ".join(f"{x} {lv.loc[x, 'nls_mean']:.3f} ± {lv.loc[x, 'nls_std']:.3f}" for x in ["model", *subs])
    shares = "; ".join(f"{x}s more linear than their {lv.loc[x, 'parent']}: {lv.loc[x, 'more_linear_share']:.0%}"
                       for x in ("mlp", "head") if x in subs)
    measured = f"NLS {text}" + (f". Shares: {shares}." if shares else ".")
    above = [x for x in subs if lv.loc[x, "nls_mean"] >= model]
    if above:
        return Verdict(measured, False, f"{', '.join(above)} NLS is not below the model's ({model:.3f})")
    return Verdict(measured, True)


def nls_singles(pool, s: NlsDrawsSettings):
    """One `forgetlab linearity --seed` run per draw."""
    return [("linearity", run) for run in nls_runs(pool, s)]


NLS_STUDY = study_analysis(NLS_INFO, NlsDrawsSettings, nls_compute, nls_figure, nls_verdict, singles=nls_singles)


# ====================================================================================== the SLWM studies' merges


@dataclass
class SlwmStudySettings:
    """What both SLWM studies share: the fine-tunes and their tasks, the SLWM level and ridge, the draws, the
    speciality measure and the scoring budget."""

    models: Optional[tuple[str, ...]] = setting(None, help="fine-tuned models (default: the pool's models named "
                                                           "like its tasks, one per task)")
    tasks: Optional[tuple[str, ...]] = setting(None, help="task of each model (default: the task in its name)")
    level: str = setting(DEFAULT_LEVEL, choices=SLWM_LEVELS, help="SLWM's submodules")
    ridge: float = setting(DEFAULT_RIDGE, range=(0.0, None), help="SLWM's ridge relative to tr(G)/T")
    draws: int = draws_field(3)
    seed: int = study_seed_field()
    measure: Optional[str] = setting(None, choices=MEASURES, help="speciality the normalized score reads (default: "
                                     "exact match where every fine-tune gains some on its task, else answer loss)")
    max_general: Optional[int] = count_field(32, "at most this many held-out general blocks per scorecard")
    max_task: Optional[int] = count_field(50, "at most this many eval pairs per task per scorecard")
    device: Optional[str] = device_field()


def study_models(pool, s: SlwmStudySettings) -> tuple[list[str], list[str]]:
    """(models, their tasks): the given ones, or the pool's models named like its tasks (else every model with a
    task in its name); each model's task is the given one, else the task in its name."""
    models = list(s.models) if s.models else [m for m in pool.model_names if m in pool.task_names]
    if not models:
        models = [m for m, t in own_tasks(pool, pool.model_names).items() if t is not None]
    if s.tasks:
        tasks = list(s.tasks)
        if len(tasks) != len(models):
            raise ParameterError(f"{len(models)} models but {len(tasks)} tasks; give one task per model (--tasks).")
    else:
        found = own_tasks(pool, models)
        missing = [m for m, t in found.items() if t is None]
        if missing:
            raise ParameterError(f"No task named in model(s) {', '.join(missing)}; pass --tasks, one per model.")
        tasks = [found[m] for m in models]
    if len(models) < 2:
        raise ParameterError(f"A merge study needs at least two fine-tunes; the pool gives {models}. Pass --models.")
    return models, tasks


class MergeScorer:
    """Builds merges of the study's fine-tunes into one working model and scores them: each merge's share of each
    parent's own-task gain (`gain_share`), their mean (the average normalized score) and its general loss.
    The base and the fine-tunes are scored once (`pool_scorecard`), their state dicts read once."""

    def __init__(self, pool, s: SlwmStudySettings):
        self.pool, self.s = pool, s
        self.models, self.tasks = study_models(pool, s)
        self.budget = Budget(s.max_general, s.max_task)
        self.base = pool_scorecard(pool, "base", self.budget, device=s.device)
        self.cards = {m: pool_scorecard(pool, m, self.budget, device=s.device) for m in self.models}
        gains = [self.cards[m].tasks[t].exact_match > self.base.tasks[t].exact_match
                 for m, t in zip(self.models, self.tasks)]
        self.measure = s.measure or ("exact_match" if all(gains) else "answer_loss")
        base_model = pool.load("base", device=s.device)
        self.config = getattr(base_model, "config", None)
        self.base_sd = {k: v.detach() for k, v in base_model.state_dict().items()}
        self.sds = {m: {k: v.detach() for k, v in pool.load(m, device=s.device).state_dict().items()}
                    for m in self.models}
        self.work = copy.deepcopy(base_model).eval()

    def score(self, subset: Sequence[int], merged: dict) -> dict:
        """The merged state dict's scores: `avg_normalized` over the subset's parents, `general_loss`, and the
        speciality (`self.measure`) on every task of the pool."""
        self.work.load_state_dict(merged, strict=False)
        card = evaluate(self.work, self.pool.tokenizer, self.pool.probes, name="merge",
                        max_general=self.budget.max_general, max_task=self.budget.max_task)
        shares = [gain_share(self.base, self.cards[self.models[i]], card, self.tasks[i], self.measure)
                  for i in subset]
        out = {"avg_normalized": finite_mean(shares), "general_loss": card.general_loss}
        for t, sc in card.tasks.items():
            out[f"{t}_{self.measure}"] = sc.exact_match if self.measure == "exact_match" else sc.answer_loss
        return out

    def slwm(self, subset: Sequence[int], samples: int, seed: Optional[int], progress=None) -> dict:
        """SLWM of the subset's fine-tunes with weights from `samples` pairs per task drawn with `seed`."""
        models = [self.models[i] for i in subset]
        w = slwm_weights(self.pool, [self.tasks[i] for i in subset], models=models, level=self.s.level,
                         samples=samples, ridge=self.s.ridge, seed=seed, device=self.s.device, progress=progress)
        merged = merge_state_dicts("slwm", self.base_sd, [self.sds[m] for m in models], prepared=w.coefficients(),
                                   config=self.config, level=self.s.level, samples=samples, ridge=self.s.ridge)
        return self.score(subset, merged)

    def plain(self, subset: Sequence[int], method: str, **params) -> dict:
        """A merge of the subset's fine-tunes with a method that needs no probe data (task arithmetic, …)."""
        merged = merge_state_dicts(method, self.base_sd, [self.sds[self.models[i]] for i in subset],
                                   config=self.config, **params)
        return self.score(subset, merged)


def summarize(rows: Sequence[dict], keys: dict) -> dict:
    """One table row from several scored merges: `keys`, then each score's mean over them and, for the average
    normalized score and the general loss, the population std."""
    out = dict(keys)
    out["n"] = len(rows)
    for k in rows[0]:
        out[k] = finite_mean([r[k] for r in rows])
        if k in ("avg_normalized", "general_loss"):
            out[f"{k}_std"] = population_std([r[k] for r in rows])
    return out


def merge_single(pool, s: SlwmStudySettings, method: str, subset: Sequence[int], params: dict):
    """("merge --eval", job) of one merge the study scores, as a user runs it alone: `forgetlab merge RECIPE OUT
    --eval --max-general … --max-task …` (`merge_and_evaluate`, into a temporary folder). An SLWM merge solves its
    weights inside the merge from the same number of probe pairs (the first ones: a recipe takes no seed; the cost
    is the same)."""
    models, tasks = study_models(pool, s)
    names = [models[i] for i in subset]
    if method == "slwm":
        params = {**params, "tasks": ",".join(tasks[i] for i in subset)}
    recipe = pool_recipe(pool, method, names, params)

    def job(pool):
        with tempfile.TemporaryDirectory() as tmp:
            return merge_and_evaluate(recipe, Path(tmp) / "merge", pool, overwrite=True, device=s.device or "cpu",
                                      max_general=s.max_general, max_task=s.max_task)
    return "merge --eval", job


def slwm_singles_of(pool, s: SlwmStudySettings, runs: Sequence[tuple[Sequence[int], int, Optional[int]]],
                    plain: Sequence[tuple[Sequence[int], str, dict]] = ()):
    """The single runs the study's merges stand for: one `forgetlab merge --eval` per SLWM merge ((subset,
    samples, seed) each; SLWM solves its weights inside the merge) and per merge of a method without probe data
    (`plain`: (subset, method, params) each)."""
    out = [merge_single(pool, s, "slwm", sub, {"level": s.level, "samples": n, "ridge": s.ridge})
           for sub, n, _ in runs]
    return out + [merge_single(pool, s, method, sub, params) for sub, method, params in plain]


def check_counts(name: str, counts) -> list[int]:
    """Distinct whole numbers ≥ 1, ascending; ParameterError otherwise."""
    vals = list(counts or [])
    if not vals or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in vals) \
            or len(set(vals)) != len(vals):
        raise ParameterError(f"--{name} takes distinct whole numbers ≥ 1; got {vals}.")
    return sorted(vals)


def merge_figure(table: pd.DataFrame, x: str, title: str, xtitle: str, log: bool = False) -> go.Figure:
    """The average normalized score and the general loss against `x`, one line per method, std as error bars;
    methods with one point (no `x`) as dashed lines."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("share of the gain kept (↑)",
                                                        "general loss (↓)"))
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for k, (method, rows) in enumerate(table.groupby("method", sort=False)):
        pts = rows[rows[x] > 0]
        for col, name in ((1, "avg_normalized"), (2, "general_loss")):
            if len(pts):
                fig.add_trace(go.Scatter(x=pts[x], y=pts[name], mode="lines+markers", name=method,
                                         showlegend=col == 1, line=dict(color=colors[k % len(colors)]),
                                         error_y=dict(type="data", array=pts[f"{name}_std"].fillna(0))),
                              row=1, col=col)
            else:
                fig.add_hline(y=float(rows[name].iloc[0]), line_dash="dash", line_color=colors[k % len(colors)],
                              row=1, col=col, **annotation(method if col == 1 else None))
        for col in (1, 2):
            fig.update_xaxes(title_text=xtitle, type="log" if log else "linear", row=1, col=col,
                             **({} if log else {"dtick": 1}))             # whole counts: no 2.5 models
    fig.update_layout(title=title, height=380)
    return fig


# ================================================================================================ slwm-data

DATA_INFO = StudyInfo(
    name="slwm-data", paper="Submodule linearity", artifact="data-count ablation (Appendix A.1.4)", page="linearity",
    title="SLWM merge quality against the probe samples per task its weights are solved from",
    claim="a handful of samples per task suffices: the merged model's average normalized score saturates at few "
          "samples (≤ 10).")


@dataclass
class SlwmDataSettings(SlwmStudySettings):
    """The sample counts, over the SLWM studies' shared settings."""

    counts: tuple[int, ...] = setting((1, 2, 5, 10, 20, 50), help="probe samples per task to solve the weights "
                                      "from (a count above the pool's probe count becomes that count)",
                                      metavar="N[,N…]", range=(1, None))


def data_runs(pool, s: SlwmDataSettings) -> list[tuple[tuple[int, ...], int, Optional[int]]]:
    """(subset, samples, seed) of every SLWM merge: per count, `draws` draws (one where the count is every probe
    pair: all draws would be the same)."""
    models, tasks = study_models(pool, s)
    most = probe_count(pool, tasks)
    everyone = tuple(range(len(models)))
    counts = sorted({min(c, most) for c in check_counts("counts", s.counts)})
    return [(everyone, n, s.seed + d * len(models)) for n in counts for d in range(1 if n == most else s.draws)]


def data_plain(pool, s: SlwmDataSettings) -> list[tuple[tuple[int, ...], str, dict]]:
    """The reference merge: the plain average of every model (task arithmetic at λ = 1/T)."""
    n = len(study_models(pool, s)[0])
    return [(tuple(range(n)), "task_arithmetic", {"lam": 1.0 / n})]


def data_compute(pool, s: SlwmDataSettings, progress=None, executor=None) -> pd.DataFrame:
    """Per count, the SLWM merges of the draws summarized (`summarize`), after the plain average (1/T each, what
    SLWM falls back to with no data) as the reference row with samples 0."""
    runs = data_runs(pool, s)
    scorer = MergeScorer(pool, s)
    everyone = tuple(range(len(scorer.models)))
    n = len(scorer.models)
    rows = [summarize([scorer.plain(everyone, "task_arithmetic", lam=1.0 / n)],
                      {"method": "average (λ = 1/T)", "samples": 0})]
    by_count: dict[int, list] = {}
    for k, (sub, count, seed) in enumerate(runs):
        report(progress, k / len(runs), f"SLWM from {count} samples per task (seed {seed})")
        by_count.setdefault(count, []).append(scorer.slwm(sub, count, seed))
    rows += [summarize(v, {"method": "slwm", "samples": c}) for c, v in by_count.items()]
    report(progress, 1.0, "merges scored")
    table = pd.DataFrame(rows)
    table.insert(2, "measure", scorer.measure)
    return table


def data_figure(table: pd.DataFrame) -> go.Figure:
    """Average normalized score and general loss against the samples per task (log axis)."""
    return merge_figure(table, "samples", "SLWM: probe samples per task", "probe samples per task", log=True)


def data_verdict(table: pd.DataFrame, settings=None) -> Verdict:
    """Whether the score saturates by 10 samples: the fewest samples whose mean lies within max(0.02, the best
    count's std) of the best count's mean is ≤ 10."""
    sl = table[(table.method == "slwm") & table.avg_normalized.notna()].sort_values("samples")
    if sl.empty:
        return Verdict("no SLWM merge has a normalized score (no fine-tune gained on its task).", None)
    best = sl.loc[sl.avg_normalized.idxmax()]
    tol = max(0.02, float(best.avg_normalized_std) if best.avg_normalized_std == best.avg_normalized_std else 0.0)
    sat = int(sl[sl.avg_normalized >= best.avg_normalized - tol].samples.iloc[0])
    curve = ", ".join(f"{int(r.samples)}: {r.avg_normalized:.3f} ± {r.avg_normalized_std:.3f}"
                      for r in sl.itertuples())
    ref = table[table.method != "slwm"]
    measured = (f"average normalized score by samples per task — {curve}"
                + (f"; plain average {ref.avg_normalized.iloc[0]:.3f}" if len(ref) else "")
                + f". Within {tol:.3f} of the best ({best.avg_normalized:.3f} at {int(best.samples)}) from "
                  f"{sat} samples on.")
    if sat <= 10:
        return Verdict(measured, True)
    return Verdict(measured, False, f"the score keeps rising past 10 samples (saturates at {sat})")


DATA_STUDY = study_analysis(DATA_INFO, SlwmDataSettings, data_compute, data_figure, data_verdict,
                            singles=lambda pool, s: slwm_singles_of(pool, s, data_runs(pool, s), data_plain(pool, s)))


# ================================================================================================ slwm-models

MODELS_INFO = StudyInfo(
    name="slwm-models", paper="Submodule linearity", artifact="model-count ablation (Appendix A.1.3)",
    page="linearity", title="SLWM against task arithmetic as more fine-tunes are merged",
    claim="SLWM's advantage over task arithmetic holds and grows as more models are merged (the rebuttal: −2.6 % "
          "with 2 models to +14.9 % with 5).")


@dataclass
class SlwmModelsSettings(SlwmStudySettings):
    """The model counts, SLWM's samples and task arithmetic's λ grid, over the SLWM studies' shared settings."""

    counts: Optional[tuple[int, ...]] = setting(None, help="how many fine-tunes to merge (default: 2 up to every "
                                                "model); each count merges every subset of that many",
                                                metavar="K[,K…]", range=(2, None))
    samples: int = count_field(DEFAULT_SAMPLES, "SLWM's probe samples per task (at most the pool's probe count)")
    lams: tuple[float, ...] = setting((0.3, 0.5, 1.0), help="task arithmetic's λ grid: each subset takes its best "
                                      "λ (chosen on the scores themselves, in the baseline's favour)",
                                      label="λ grid", range=(0.0, None))
    draws: int = draws_field(1)


def model_subsets(pool, s: SlwmModelsSettings) -> list[tuple[int, ...]]:
    """Every subset of the models of each count."""
    models, _ = study_models(pool, s)
    counts = check_counts("counts", s.counts or range(2, len(models) + 1))
    if counts[0] < 2 or counts[-1] > len(models):
        raise ParameterError(f"--counts must lie in 2..{len(models)} (the study's models: {', '.join(models)}); "
                             f"got {counts}.")
    return [sub for k in counts for sub in itertools.combinations(range(len(models)), k)]


def models_runs(pool, s: SlwmModelsSettings) -> list[tuple[tuple[int, ...], int, Optional[int]]]:
    """(subset, samples, seed) of every SLWM merge."""
    models, tasks = study_models(pool, s)
    n = min(s.samples, probe_count(pool, tasks))
    return [(sub, n, s.seed + d * len(models)) for sub in model_subsets(pool, s) for d in range(s.draws)]


def models_plain(pool, s: SlwmModelsSettings) -> list[tuple[tuple[int, ...], str, dict]]:
    """Task arithmetic of every subset at every λ of the grid."""
    return [(sub, "task_arithmetic", {"lam": float(lam)}) for sub in model_subsets(pool, s) for lam in s.lams]


def models_compute(pool, s: SlwmModelsSettings, progress=None, executor=None) -> pd.DataFrame:
    """Per count k: SLWM over every subset × draw, and task arithmetic at each subset's best λ, summarized; `gap`
    is SLWM's mean minus task arithmetic's."""
    if not s.lams or any(not (lam > 0) for lam in s.lams):
        raise ParameterError(f"--lams takes positive values; got {list(s.lams)}.")
    runs = models_runs(pool, s)
    scorer = MergeScorer(pool, s)
    slwm_rows: dict[int, list] = {}
    ta_rows: dict[int, list] = {}
    lams: dict[int, list] = {}
    done = set()
    for k, (sub, n, seed) in enumerate(runs):
        report(progress, k / len(runs), f"merging {', '.join(scorer.models[i] for i in sub)}")
        slwm_rows.setdefault(len(sub), []).append(scorer.slwm(sub, n, seed))
        if sub not in done:
            done.add(sub)
            tried = [(lam, scorer.plain(sub, "task_arithmetic", lam=float(lam))) for lam in s.lams]
            lam, best = max(tried, key=lambda t: -math.inf if t[1]["avg_normalized"] != t[1]["avg_normalized"]
                            else t[1]["avg_normalized"])
            ta_rows.setdefault(len(sub), []).append(best)
            lams.setdefault(len(sub), []).append(lam)
    rows = []
    for k in sorted(slwm_rows):
        sl = summarize(slwm_rows[k], {"method": "slwm", "models": k})
        ta = summarize(ta_rows[k], {"method": "task arithmetic (best λ)", "models": k})
        sl["subsets"] = ta["subsets"] = len(ta_rows[k])
        sl["lam"], ta["lam"] = "", ",".join(f"{x:g}" for x in lams[k])
        sl["gap"] = ta["gap"] = sl["avg_normalized"] - ta["avg_normalized"]
        rows += [sl, ta]
    report(progress, 1.0, "merges scored")
    table = pd.DataFrame(rows)
    table.insert(2, "measure", scorer.measure)
    return table


def models_figure(table: pd.DataFrame) -> go.Figure:
    """Average normalized score and general loss against the number of models merged, SLWM beside task
    arithmetic."""
    return merge_figure(table, "models", "SLWM against task arithmetic: models merged", "models merged")


def models_verdict(table: pd.DataFrame, settings=None) -> Verdict:
    """Whether SLWM leads task arithmetic at the largest count and its lead there is at least the smallest
    count's."""
    gaps = table[table.method == "slwm"].sort_values("models")
    gaps = gaps[gaps.gap.notna()]
    if gaps.empty:
        return Verdict("no count has a normalized score for both methods.", None)
    text = ", ".join(f"{int(r.models)} models: SLWM {r.avg_normalized:.3f} vs TA "
                     f"{r.avg_normalized - r.gap:.3f} (gap {r.gap:+.3f})" for r in gaps.itertuples())
    first, last = gaps.iloc[0], gaps.iloc[-1]
    measured = f"average normalized score — {text}."
    if last.gap > 0 and last.gap >= first.gap:
        return Verdict(measured, True)
    why = (f"SLWM trails task arithmetic with {int(last.models)} models ({last.gap:+.3f})" if last.gap <= 0 else
           f"the gap shrinks from {first.gap:+.3f} ({int(first.models)} models) to {last.gap:+.3f}")
    return Verdict(measured, False, why)


MODELS_STUDY = study_analysis(MODELS_INFO, SlwmModelsSettings, models_compute, models_figure, models_verdict,
                              singles=lambda pool, s: slwm_singles_of(pool, s, models_runs(pool, s),
                                                                      models_plain(pool, s)))
