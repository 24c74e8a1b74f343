"""The Merge page's default view: the pool's full fine-tunes merged three ways — the plain weight average beside
TIES and task arithmetic — with one click, and judged by what merging is for: how much of each parent's gain on
ITS OWN task the merged model keeps (`forgetlab.analysis.retention`), and what it costs in held-out loss.

`judge_figure` / `judge_frame` are also what the page's single merges and saved-merge comparisons are drawn with.
"""
from __future__ import annotations

import math
import time
from typing import Mapping, Optional, Sequence

import pandas as pd
import streamlit as st

from forgetlab.analysis.retention import MEASURES, gain_share, merge_retention, own_tasks, takeaway
from forgetlab.core.errors import ForgetlabError
from forgetlab.core.memory import with_free
from forgetlab.core.progress import scaled
from forgetlab.merge import METHODS
from forgetlab.merge.memory import estimate_merge
from forgetlab.merge.registry import method_title
from forgetlab.merge.workflow import (COMPARE_METHODS, default_merge_models, merge_and_evaluate, merge_folder_name,
                                      pool_recipe, workspace_merge_dir)
from forgetlab.plots import color_for
from forgetlab.plots.merge import retention_figure, scorecard_figure
from forgetlab.ui.errors import show_errors
from forgetlab.ui.jobs import job_key, run_once
from forgetlab.ui.memory import show_estimate
from forgetlab.ui.page import show_takeaway
from forgetlab.ui.settings import workspace_home
from forgetlab.ui.tables import show_table

COMPARE_KEY = "merge_default_report"


def _retention(pool, cards, merged: Sequence[str], measure: str, parents: Optional[Mapping[str, Sequence[str]]]):
    parent_names = [c.model for c in cards if c.model != "base" and c.model not in merged]
    return merge_retention(cards, merged, own_tasks(pool, parent_names, cards), measure, parents=parents)


def judge_figure(pool, cards, merged: Sequence[str], measure: str, *, labels: Optional[Mapping[str, str]] = None,
                 parents: Optional[Mapping[str, Sequence[str]]] = None, title: str = "",
                 colors: Optional[Mapping[str, str]] = None):
    """The figure that judges merges: own-task retention and forgetting (`plots.merge.retention_figure`) for
    exact match or answer loss; for an lm-eval measure (no own task to speak of) the scorecards' bars."""
    if measure not in MEASURES:
        return scorecard_figure(cards, measure, merged=merged, title=title)
    return retention_figure(_retention(pool, cards, merged, measure, parents), labels, title=title, colors=colors)


def judge_takeaway(pool, cards, merged: Sequence[str], measure: str, *, key: str,
                   labels: Optional[Mapping[str, str]] = None) -> None:
    """The merges' takeaway (`forgetlab.analysis.retention.takeaway`: the share of the parents' own-task gains
    kept and the forgetting) in the page's takeaway box `key`; nothing for an lm-eval measure."""
    if measure in MEASURES:
        show_takeaway(takeaway(_retention(pool, cards, merged, measure, None), labels), key=key)


def judge_frame(pool, cards, merged: Sequence[str], measure: str, *, labels: Optional[Mapping[str, str]] = None,
                parents: Optional[Mapping[str, Sequence[str]]] = None) -> pd.DataFrame:
    """One row per parent and merge: the share of each parent's own-task gain kept (%), its mean, the mean
    speciality over the parents' own tasks ("exact match, own tasks": where a merge should beat every single
    parent) and the forgetting;
    empty for an lm-eval measure. A parent's row holds the same shares for the parent itself (the formula's one
    home, `gain_share`): 100 % of its own task's gain and what it has of the others' — the mark a merge must
    beat — rather than empty cells (which the app's tables would show as "None")."""
    if measure not in MEASURES:
        return pd.DataFrame()
    result = _retention(pool, cards, merged, measure, parents)
    by_name = {c.model: c for c in cards}
    tasks = list(dict.fromkeys(r.task for r in result.rows if r.task))
    owner = {r.task: r.parent for r in reversed(result.rows) if r.task}      # each task's parent (first row wins)
    kept = [f"{t} kept %" for t in tasks]                  # short: the table fits beside the chart that says it
    spec = f"{measure.replace('_', ' ')}, own tasks"        # the mean over the parents' own tasks
    rows = []
    for m in [*result.parents, *result.merges]:
        row = {"model": (labels or {}).get(m, m), "role": "merge" if m in result.merges else "parent",
               **dict.fromkeys(kept, float("nan")), "mean kept %": float("nan")}
        if m in result.merges:
            for r in result.rows:
                if r.task and r.merge == m:
                    row[f"{r.task} kept %"] = 100 * r.retention
            row["mean kept %"] = 100 * result.mean_retention(m)
        else:
            shares = [100 * gain_share(by_name["base"], by_name[owner[t]], by_name[m], t, measure)
                      if all(t in by_name[n].tasks for n in ("base", owner[t], m)) else float("nan") for t in tasks]
            row.update(zip(kept, shares))
            finite = [v for v in shares if math.isfinite(v)]
            row["mean kept %"] = sum(finite) / len(finite) if finite else float("nan")
        values = [getattr(by_name[m].tasks[t], measure) for t in tasks if t in by_name[m].tasks]
        row[spec] = sum(values) / len(values) if values else float("nan")
        row["forgetting"] = result.forgetting[m]
        rows.append(row)
    return pd.DataFrame(rows, columns=["model", "role", *kept, "mean kept %", spec, "forgetting"])


def _fits(pool, models, methods, device: str, dtype, budget) -> bool:
    """The memory line of the comparison: the largest of its merges' estimates (they run one after another)."""
    if not models or not methods:
        return True
    kw = dict(pool=pool, device=device, dtype=dtype, evaluate=True, max_general=budget.max_general,
              max_task=budget.max_task)
    try:
        largest = max((with_free(estimate_merge(pool_recipe(pool, m, models, {}), **kw)) for m in methods),
                      key=lambda est: est.total)
    except ForgetlabError:
        return True           # pressing the button says what is wrong
    return show_estimate(largest)


def render_compare(pool, measure: str, budget, device: str, dtype=None) -> None:
    """Draw the default comparison: the full fine-tunes, the three methods, one button, then its verdict (every
    model scored in `dtype`, the sidebar's)."""
    st.subheader("What merging is for: one model that keeps every fine-tune's skill")
    choices = [m for m in COMPARE_METHODS if m in METHODS] + [m for m in METHODS if m not in COMPARE_METHODS]
    c1, c2, c3 = st.columns([2.6, 2.6, 1.5], vertical_alignment="bottom")
    models = c1.multiselect("fine-tuned models", pool.model_names, default=default_merge_models(pool),
                            key="merge_default_models",
                            help="Default: the pool's full fine-tunes (its LoRA adapters left out), one per task.")
    methods = c2.multiselect("methods", choices, default=[m for m in COMPARE_METHODS if m in METHODS],
                             format_func=method_title, key="merge_default_methods",
                             help="Each with its default parameters; compose your own merge below.")
    fits = _fits(pool, models, methods, device, dtype, budget)
    clicked = c3.button("Merge and compare", type="primary", key="merge_default_run",
                        disabled=not models or not methods or not fits)
    st.caption("Each merge is written into the workspace's merges/ and scored with the base and its parents. The "
               "chart shows, for each parent's own task, how much of that parent's gain over the base the merge "
               "keeps (100 % = as good as the parent), and what the merge costs in held-out loss.")
    home = str(workspace_home())
    if clicked:
        st.session_state["merge_default_stamp"] = time.strftime("%m%d-%H%M%S")
    stamp = st.session_state.get("merge_default_stamp", "")
    names = {m: merge_folder_name(m, models, stamp) for m in methods}     # "weight-average-…", as the page says

    def work(progress):
        """Each method's merge into merges/<display-name>-<models>-<time>, scored (merge_and_evaluate); the base's and
        parents' cards are computed once (the pool's scorecard cache)."""
        done = []
        for i, method in enumerate(methods):
            recipe = pool_recipe(pool, method, models, {}, name=names[method])
            result, cards = merge_and_evaluate(recipe, workspace_merge_dir(names[method]), pool, device=device,
                                               dtype=dtype, max_general=budget.max_general,
                                               max_task=budget.max_task,
                                               progress=scaled(progress, i / len(methods), (i + 1) / len(methods)))
            done.append({"method": method, "name": result.out_dir.name, "path": str(result.out_dir), "cards": cards})
        return done

    def keep(done) -> None:
        st.session_state[COMPARE_KEY] = done
        st.toast(f"Saved {len(done)} merges under {home}/merges")

    start = False
    if clicked:
        with show_errors():
            for method in methods:
                pool_recipe(pool, method, models, {}).validated_params()
            start = True
    run_once(job_key("merge_default", home, pool.key, models, methods, budget.to_dict(), device, str(dtype), stamp),
             work,
             start=start, slot="merge_default", on_done=keep,
             label=f"Merging {len(models)} models {len(methods)} ways")
    done = st.session_state.get(COMPARE_KEY)
    if not done:
        st.info("Press **Merge and compare**: about ten seconds on the pico zoo.")
        return
    cards = [*done[0]["cards"][:-1], *(d["cards"][-1] for d in done)]
    merged = [d["name"] for d in done]
    labels = {d["name"]: method_title(d["method"]) for d in done}
    with show_errors():
        judge_takeaway(pool, cards, merged, measure, labels=labels, key="merge_takeaway")
        colors = {d["name"]: color_for(d["method"]) for d in done}      # a method's colour, whatever the folder
        st.plotly_chart(judge_figure(pool, cards, merged, measure, labels=labels, colors=colors),
                        key="merge_default_chart")
        show_table(judge_frame(pool, cards, merged, measure, labels=labels), key="merge_default_table", precision=3)
    st.caption("Saved as " + ", ".join(f"`{d['name']}`" for d in done) + " (reopen them under *Earlier merges*).")
