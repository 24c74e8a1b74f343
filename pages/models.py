"""Models: what is in the pool, how each model scores, and what fine-tuning changed (task-vector anatomy)."""
from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from forgetlab.ui import device_settings, job_key, require_pool, run_once, show_errors
from forgetlab.ui.benchmarks import render_benchmarks
from forgetlab.ui.glossary import explain
from forgetlab.ui.measure import speciality_measure, stored_scorecards
from forgetlab.ui.navigation import page_header
from forgetlab.ui.tables import show_table
from forgetlab.ui.zoo_claims import render_zoo_claims

page_header("Models",
            "What is in the pool, how good is each model at its task and at general text, "
            "and where in the network did fine-tuning move the weights?")

pool = require_pool()
render_zoo_claims(pool)   # "what this zoo shows": the zoo's measured claims (nothing for a user's own pool)
for warning in pool.warnings:
    st.warning(warning)

CARDS_KEY = "models_cards"


@st.cache_resource
def _scorecards() -> dict:
    """Scorecards by (pool, model, device, limits), shared by every session of this process."""
    return {}


@st.cache_resource
def _anatomy() -> dict:
    """Task-vector norms by level and cosines, by (pool, model), shared by every session of this process."""
    return {}


def _anatomy_job(names: list[str]):
    """A job streaming every fine-tuned model's task vector once: norms per layer × module and the cosines.
    Runs in the background on a page's first visit, so the page is usable while it reads the weights."""
    from forgetlab.analysis.taskvec import cosine_matrix, task_vector_norms

    cache = _anatomy()

    def work(progress):
        for i, n in enumerate(names):
            progress(i / (len(names) + 1), f"task vector of {n}")
            if (pool.key, n) not in cache:
                cache[(pool.key, n)] = task_vector_norms(pool, n).by_level()
        progress(len(names) / (len(names) + 1), "cosines")
        cache[(pool.key, "cosines")] = cosine_matrix(pool, list(names))
        return True

    return work


@st.cache_data(show_spinner=False, max_entries=16)
def _members(_pool, pool_key: str) -> pd.DataFrame:
    rows = [{"model": "base", "kind": _pool.base.kind, "path": str(_pool.base.path),
             "parameters": f"{_pool.base.num_parameters:,}"}]
    for e in _pool.entries.values():
        ckpt = _pool.checkpoint(e.name)
        rows.append({"model": e.name, "kind": "LoRA adapter" if e.adapter else ckpt.kind, "path": e.ref,
                     "parameters": f"{ckpt.num_parameters:,}"})
    return pd.DataFrame(rows)


show_table(_members(pool, pool.key), width="stretch", key="models_members")
st.caption(f"Tasks: {', '.join(pool.task_names) or 'none'} · held-out general text: "
           f"{len(pool.probes.general)} documents · architecture: {pool.config.model_type}")

st.subheader("Scorecards", help=explain("general_loss", "exact_match", "answer_loss"))
stored = stored_scorecards(pool)
measure = speciality_measure("models", pool)
shown_for, evaluated = st.session_state.get(CARDS_KEY, (None, None))
cards = evaluated if evaluated and shown_for == pool.key else stored
if cards:
    from forgetlab.core.evaluate import scorecards_frame
    from forgetlab.plots.models import scorecard_bars

    st.caption("Evaluated in this session with the limits below." if cards is evaluated else
               "Stored by the zoo build (its evaluation limits); **Evaluate** below re-runs them.")
    st.plotly_chart(scorecard_bars(cards, measure), key="models_scores_fig")
    show_table(scorecards_frame(cards), width="stretch", key="models_scores_table")
else:
    st.info("No scorecards yet for this pool: press **Evaluate** below.")

with st.expander("Evaluate again (limits, models)" if cards else "Evaluate", expanded=not cards):
    device, _dtype = device_settings()
    c1, c2 = st.columns(2)
    max_general = c1.number_input("general-text blocks (max)", 8, 4096, 64, step=8, key="models_max_general")
    max_task = c2.number_input("pairs per task (max)", 4, 4096, 100, step=4, key="models_max_task")
    chosen = st.multiselect("models", ["base", *pool.model_names], default=["base", *pool.model_names],
                            key="models_chosen")
    clicked = st.button("Evaluate", type="primary", key="models_eval")
cards_cache = _scorecards()
limits = (device, int(max_general), int(max_task))


def work(progress):
    """(pool key, scorecards of the chosen models, saved run); each card is computed once per pool, device
    and limits, and the set is saved to the workspace's runs/ (kind "scorecards")."""
    from forgetlab.core.evaluate import evaluate
    from forgetlab.core.workspace import save_run

    out = []
    for i, name in enumerate(chosen):
        progress(i / max(1, len(chosen)), name)
        if (pool.key, name, limits) not in cards_cache:
            model = pool.load(name, device=device)
            cards_cache[(pool.key, name, limits)] = evaluate(model, pool.tokenizer, pool.probes, name=name,
                                                             max_general=limits[1], max_task=limits[2])
        out.append(cards_cache[(pool.key, name, limits)])
    recipe = {"pool": str(pool.source or pool.name), "models": list(chosen), "device": device,
              "max_general": limits[1], "max_task": limits[2], "evaluated": time.time()}
    path = save_run("scorecards", recipe, {"cards": [c.to_dict() for c in out]},
                    frame=pd.concat([c.to_frame() for c in out], ignore_index=True) if out else None)
    return pool.key, out, path


def keep(done) -> None:
    st.session_state[CARDS_KEY] = done[:2]
    st.toast(f"Saved under {done[2]}")
    st.rerun()


run_once(job_key("models", pool.key, chosen, limits), work, start=clicked, label="Evaluating", slot="models",
         on_done=keep)

render_benchmarks(pool, device)   # lm-eval table of the latest saved run; a button runs the pool's benchmarks

if pool.model_names:
    from forgetlab.plots.models import cosine_heatmap, norms_heatmap

    st.subheader("Task vectors τ = θt − θ0", help=explain("tau"))
    anatomy = _anatomy()
    if (pool.key, "cosines") not in anatomy:
        from forgetlab.ui.jobs import REGISTRY

        key = job_key("models-anatomy", pool.key)     # started once per pool; a failure is shown, not retried
        run_once(key, _anatomy_job(list(pool.model_names)), start=REGISTRY.get(key) is None,
                 label="Reading the task vectors", cancellable=False)
    if (pool.key, "cosines") in anatomy:
        left, right = st.columns(2)
        with left, show_errors():
            name = st.selectbox("fine-tuned model", pool.model_names, key="models_tv_model")
            value = st.radio("value", ["relative", "norm"], horizontal=True, key="models_tv_value",
                             help="relative = ‖τ‖/‖θ0‖ per layer and module; norm = ‖τ‖")
            st.plotly_chart(norms_heatmap(anatomy[(pool.key, name)], value), key="models_norms_fig")
        with right, show_errors():
            st.markdown("**Cosine similarity between task vectors**")
            st.plotly_chart(cosine_heatmap(anatomy[(pool.key, "cosines")]), key="models_cos_fig")
