"""Models: what is in the pool, how each model scores, and what fine-tuning changed (task-vector anatomy)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from forgetlab.evaluate import evaluate, scorecards_frame
from forgetlab.plots.models import cosine_heatmap, norms_heatmap, scorecard_bars
from forgetlab.pool import BASE
from forgetlab.taskvec import cosine_matrix, task_vector_norms
from forgetlab.ui import device_settings, job_key, require_pool, run_once, show_errors

st.title("Models")
st.caption("What is in the pool, how good is each model at its task and at general text, "
           "and where in the network did fine-tuning move the weights?")

pool = require_pool()
for warning in pool.warnings:
    st.warning(warning)


@st.cache_resource
def _scorecards() -> dict:
    """Scorecards by (pool, model, device, limits), shared by every session of this process."""
    return {}


@st.cache_data(show_spinner=False, max_entries=64)
def _norms(_pool, pool_key: str, name: str):
    return task_vector_norms(_pool, name).by_level()


@st.cache_data(show_spinner=False, max_entries=16)
def _cosines(_pool, pool_key: str, names: tuple[str, ...]):
    return cosine_matrix(_pool, list(names))


rows = [{"model": BASE, "kind": pool.base.kind, "path": str(pool.base.path),
         "parameters": f"{pool.base.num_parameters:,}"}]
for e in pool.entries.values():
    ckpt = pool.checkpoint(e.name)
    rows.append({"model": e.name, "kind": "LoRA adapter" if e.adapter else ckpt.kind, "path": e.ref,
                 "parameters": f"{ckpt.num_parameters:,}"})
st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
st.caption(f"Tasks: {', '.join(pool.task_names) or 'none'} · held-out general text: "
           f"{len(pool.probes.general)} documents · architecture: {pool.config.model_type}")

st.subheader("Scorecards")
device, _dtype = device_settings()
c1, c2 = st.columns(2)
max_general = c1.number_input("general-text blocks (max)", 8, 4096, 64, step=8, key="models_max_general")
max_task = c2.number_input("pairs per task (max)", 4, 4096, 100, step=4, key="models_max_task")
chosen = st.multiselect("models", [BASE, *pool.model_names], default=[BASE, *pool.model_names],
                        key="models_chosen")
clicked = st.button("Evaluate", type="primary", key="models_eval")
cards_cache = _scorecards()
limits = (device, int(max_general), int(max_task))


def work(progress):
    """(pool key, scorecards of the chosen models); each card is computed once per pool, device and limits."""
    cards = []
    for i, name in enumerate(chosen):
        progress(i / max(1, len(chosen)), name)
        if (pool.key, name, limits) not in cards_cache:
            model = pool.load(name, device=device)
            cards_cache[(pool.key, name, limits)] = evaluate(model, pool.tokenizer, pool.probes, name=name,
                                                             max_general=limits[1], max_task=limits[2])
        cards.append(cards_cache[(pool.key, name, limits)])
    return pool.key, cards


def keep(done) -> None:
    st.session_state["models_cards"] = done


run_once(job_key("models", pool.key, chosen, limits), work, start=clicked, label="Evaluating", slot="models",
         on_done=keep)
shown_for, cards = st.session_state.get("models_cards", (None, None))
if cards and shown_for == pool.key:
    st.plotly_chart(scorecard_bars(cards), key="models_scores_fig")
    st.dataframe(scorecards_frame(cards), hide_index=True, width="stretch")

if pool.model_names:
    st.subheader("Task vectors τ = θt − θ0")
    left, right = st.columns(2)
    with left, show_errors():
        name = st.selectbox("fine-tuned model", pool.model_names, key="models_tv_model")
        value = st.radio("value", ["relative", "norm"], horizontal=True, key="models_tv_value",
                         help="relative = ‖τ‖/‖θ0‖ per layer and module; norm = ‖τ‖")
        st.plotly_chart(norms_heatmap(_norms(pool, pool.key, name), value), key="models_norms_fig")
    with right, show_errors():
        st.markdown("**Cosine similarity between task vectors**")
        st.plotly_chart(cosine_heatmap(_cosines(pool, pool.key, tuple(pool.model_names))), key="models_cos_fig")
