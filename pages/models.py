"""Models: what is in the pool, how each model scores, and what fine-tuning changed (task-vector anatomy)."""
from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from forgetlab.analysis import taskvec
from forgetlab.core.eval_memory import estimate_eval
from forgetlab.core.evaluate import scorecards_frame, scorecards_takeaway
from forgetlab.core.memory import dtype_name
from forgetlab.core.progress import scaled
from forgetlab.core.scorecards import cached_scorecards, pool_scorecard, scorecard_times, up_to_date_text
from forgetlab.core.workspace import save_run
from forgetlab.plots.models import cosine_heatmap, norms_heatmap, scorecard_bars
from forgetlab.ui.benchmarks import render_benchmarks
from forgetlab.ui.errors import show_errors
from forgetlab.ui.glossary import explain
from forgetlab.ui.jobs import REGISTRY, job_key, run_once
from forgetlab.ui.measure import remember_stored_scorecards, speciality_measure, stored_scorecards
from forgetlab.ui.memory import memory_check
from forgetlab.ui.page import show_takeaway, start_page
from forgetlab.ui.settings import budget_caption, device_settings, eval_budget
from forgetlab.ui.tables import measure_view, show_table
from forgetlab.ui.zoo_build import render_pretraining
from forgetlab.ui.zoo_claims import render_zoo_claims
from forgetlab.zoo.watch import stored_snapshots

MENU = ("Models", ":material/hub:", 10)    # its entry in the app's menu (forgetlab.ui.navigation)

pool = start_page(MENU, "What is in the pool, how good is each model at its task and at general text, and where did "
                        "fine-tuning change the weights?",
                        how="General loss: mean next-token loss on held-out general text, in nats (lower is "
                            "better). Exact match: the share of a task's eval answers produced exactly; answer "
                            "loss: the mean loss on the answer tokens (nats). Forgetting: general loss − the "
                            "base's. Task vector τ = θt − θ0: per layer and module ‖τ‖ / ‖θ0‖, and cos(τi, τj) "
                            "between models. Formulas: docs/methods.md#generality, #speciality, #taskvec-stats.",
                        needs="pool")

for warning in pool.warnings:
    st.warning(warning)


@st.cache_resource
def _anatomy() -> dict:
    """The task-vector analysis of every fine-tuned model, by pool, shared by every session of this process."""
    return {}


def _anatomy_job(progress):
    """The task-vector analysis (forgetlab.analysis.taskvec) of every fine-tuned model: norms per layer × module and
    the cosines. Runs in the background on a page's first visit, so the page is usable while it reads the weights;
    the Task vectors page runs, saves and reopens the same analysis."""
    _anatomy()[pool.key] = taskvec.ANALYSIS.run(pool, taskvec.TaskvecSettings(), progress)
    return True


@st.cache_data(show_spinner=False, max_entries=16)
def _members(_pool, pool_key: str) -> pd.DataFrame:
    rows = [{"model": "base", "kind": _pool.base.kind, "path": str(_pool.base.path),
             "parameters": f"{_pool.base.num_parameters:,}"}]
    for e in _pool.entries.values():
        ckpt = _pool.checkpoint(e.name)
        rows.append({"model": e.name, "kind": "LoRA adapter" if e.adapter else ckpt.kind, "path": e.ref,
                     "parameters": f"{ckpt.num_parameters:,}"})
    return pd.DataFrame(rows)


st.subheader("Scorecards", help=explain("general_loss", "exact_match", "answer_loss"))
budget = eval_budget()
device, dtype = device_settings()
remember_stored_scorecards(pool, budget, device)   # the zoo build's cards, when they were made at this budget
names = ["base", *pool.model_names]
measure = speciality_measure("models", pool)
c1, c2 = st.columns([5, 1], vertical_alignment="bottom")
chosen = c1.multiselect("models", names, default=names, key="models_chosen",
                        help="The models to evaluate, and the ones the chart and the table below show.")
fits = memory_check(estimate_eval, pool=pool, models=list(chosen), device=device, dtype=dtype,
                    max_general=budget.max_general, max_task=budget.max_task) if chosen else True
clicked = c2.button("Evaluate", type="primary", key="models_eval", disabled=not fits)
budget_caption(budget, note="; each model is evaluated once per budget and shows these numbers on every page")


def work(progress, which: list[str], save: bool):
    """The scorecards of `which` at the app's budget in the sidebar's dtype (`forgetlab.core.scorecards`: each
    computed once per pool, budget, device and dtype), one model loaded at a time; a click saves the set to the
    workspace's runs/ (kind "scorecards")."""
    out = []
    for i, n in enumerate(which):
        out.append(pool_scorecard(pool, n, budget, device=device, dtype=dtype,
                                  progress=scaled(progress, i / len(which), (i + 1) / len(which))))
        pool.unload(n)      # as `forgetlab eval`: the estimate above counts one model at a time
    if not save:
        return None

    recipe = {"pool": str(pool.source or pool.name), "models": list(which), "device": device,
              "dtype": dtype_name(dtype), **budget.to_dict(), "evaluated": time.time()}
    return save_run("scorecards", recipe, {"cards": [c.to_dict() for c in out]},
                    frame=pd.concat([c.to_frame() for c in out], ignore_index=True) if out else None)


def keep(path) -> None:
    if path is not None:
        st.toast(f"Saved under {path}")
    st.rerun()


auto_key = job_key("models_cards", pool.key, names, budget.to_dict(), device, dtype_name(dtype))
# a demo zoo (small models whose build stored cards) is scored at the app's budget on the first visit
auto = (bool(stored_scorecards(pool)) and REGISTRY.get(auto_key) is None and fits
        and len(cached_scorecards(pool, names, budget, device=device, dtype=dtype)) < len(names))
# one element, whatever it holds (progress, then chart and table): the claims' folded groups below keep their place,
# so one opened while the first visit scores the pool stays open when the scores arrive
with st.container(key="models_scorecards"):
    run_once(auto_key, lambda progress: work(progress, names, False), start=auto, label="Scoring the pool",
             on_done=keep)
    computed = scorecard_times(pool, chosen, budget, device=device, dtype=dtype)
    up_to_date = clicked and bool(chosen) and len(computed) == len(chosen)     # nothing to compute: say so
    if up_to_date:
        st.info(up_to_date_text(computed.values()))
    run_once(job_key("models", pool.key, chosen, budget.to_dict(), device, dtype_name(dtype)),
             lambda progress: work(progress, list(chosen), True), start=clicked and bool(chosen),
             label="Evaluating", slot="models", on_done=keep)
    cards = cached_scorecards(pool, chosen, budget, device=device, dtype=dtype)     # the models chosen above, only
    if not chosen:
        st.info("Choose at least one model above: the chart and the table show the models chosen there.")
    elif cards:
        show_takeaway(scorecards_takeaway(cards), key="models_takeaway")
        st.plotly_chart(scorecard_bars(cards, measure), key="models_scores_fig")
        show_table(measure_view(scorecards_frame(cards), measure), width="stretch", key="models_scores_table")
    elif not (REGISTRY.get(auto_key) is not None and REGISTRY.get(auto_key).running):
        st.info("No scorecards yet at this budget: press **Evaluate**.")

# the scorecards first; then what the zoo shows (folded), the pool's members, its base's learning, benchmarks
render_zoo_claims(pool)   # "what this zoo shows": the zoo's measured claims (nothing for a user's own pool)
st.subheader("The pool")
show_table(_members(pool, pool.key), width="stretch", key="models_members")
st.caption(f"Tasks: {', '.join(pool.task_names) or 'none'} · held-out general text: "
           f"{len(pool.probes.general)} documents · architecture: {pool.config.model_type}")
snapshots = stored_snapshots(pool)      # a pico zoo's record of its base learning (nothing for a user's own pool)
if snapshots:
    with st.expander("How the base model learned: its pre-training, step by step"):
        render_pretraining(snapshots, version=-1, live=False)
render_benchmarks(pool, device, dtype)   # lm-eval table of the latest saved run; a button runs the pool's benchmarks

if pool.model_names:
    st.subheader("Task vectors τ = θt − θ0", help=explain("tau"))
    anatomy = _anatomy().get(pool.key)
    if anatomy is None:
        key = job_key("models-anatomy", pool.key)     # started once per pool; a failure is shown, not retried
        run_once(key, _anatomy_job, start=REGISTRY.get(key) is None, label="Reading the task vectors",
                 cancellable=False)
    else:
        left, right = st.columns(2)
        with left, show_errors():
            name = st.selectbox("fine-tuned model", pool.model_names, key="models_tv_model")
            value = st.radio("value", ["relative", "norm"], horizontal=True, key="models_tv_value",
                             help=explain("norm"))
            norms = next(n for n in anatomy.norms if n.model == name)
            st.plotly_chart(norms_heatmap(norms.by_level(), value), key="models_norms_fig")
        with right, show_errors():
            st.markdown("**Cosine similarity between task vectors**")
            st.plotly_chart(cosine_heatmap(anatomy.cosine), key="models_cos_fig")
        st.caption("The **Task vectors** page measures them for the models you choose, saves the run and reopens "
                   "saved ones.")
