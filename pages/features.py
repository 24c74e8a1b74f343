"""Features: do the tasks separate in a submodule's features, and how does fine-tuning or merging move them?"""
from __future__ import annotations

import streamlit as st

from forgetlab.analysis import features
from forgetlab.core.errors import ParameterError
from forgetlab.core.memory import dtype_name
from forgetlab.plots.features import distance_bars, tsne_scatter
from forgetlab.ui.errors import show_errors
from forgetlab.ui.jobs import job_key, run_once
from forgetlab.ui.pool import require_pool, require_tasks
from forgetlab.ui.settings import device_settings
from forgetlab.ui.glossary import explain
from forgetlab.ui.memory import memory_check
from forgetlab.ui.navigation import page_header
from forgetlab.ui.tables import show_table

MENU = ("Features", ":material/scatter_plot:", 60)    # its entry in the app's menu (forgetlab.ui.navigation)

page_header("Features",
            "One point per probe sample: a submodule's output, averaged over the answer tokens (or the last "
            "token), reduced with PCA to 50 dimensions and mapped with t-SNE. Colour is the task, the symbol "
            "the model.")

pool = require_pool()
require_tasks(pool, "a feature map")


@st.cache_resource
def _results() -> dict:
    """t-SNE maps by (pool, settings), shared by every session of this process."""
    return {}


anatomy = None
with show_errors():
    anatomy = pool.anatomy
level_options = list(features.FEATURE_LEVELS) if anatomy is not None else ["model"]
device, dtype = device_settings()
left, right = st.columns([1, 3])
with left:
    all_models = ["base", *pool.model_names]
    models = st.multiselect("models", all_models, default=all_models, key="features_models")
    tasks = st.multiselect("tasks", pool.task_names, default=pool.task_names, key="features_tasks")
    level = st.selectbox("submodule", level_options, index=min(1, len(level_options) - 1), key="features_level",
                         format_func={"model": "last hidden state", "layer": "decoder layer", "attn": "attention",
                                      "mlp": "MLP", "head": "attention head"}.get, help=explain("submodule"))
    layer = head = None
    if level != "model":
        layer = st.selectbox("layer", list(range(anatomy.num_layers)), index=anatomy.num_layers - 1,
                             key="features_layer")
    if level == "head":
        head = st.selectbox("head", list(range(anatomy.num_heads)), key="features_head")
    pooling = st.radio("pooling", list(features.POOLINGS), key="features_pooling",
                       format_func={"answer": "mean over answer tokens", "last": "last token"}.get)
    n_min = min((len(pool.probes.tasks[t].probe) for t in tasks), default=1) or 1
    samples = st.number_input("samples per task", 1, n_min, min(30, n_min), key="features_samples")
    perplexity = st.number_input("perplexity", 2.0, 100.0, 30.0, key="features_perplexity",
                                 help="t-SNE's neighbourhood size: about how many neighbours each point keeps close "
                                      "(capped at (points − 1) / 3). Not a model's perplexity.")
    seed = st.number_input("seed", 0, 2**31 - 1, 0, key="features_seed")
    fits = memory_check("features", pool=pool, tasks=list(tasks), models=list(models), level=level,
                        samples=int(samples), device=device, dtype=dtype) if models and tasks else True
    run = st.button("Map features", type="primary", key="features_run", disabled=not fits)

key = job_key("features", pool.key, tuple(models), tuple(tasks), level, layer, head, pooling, int(samples),
              float(perplexity), int(seed), device, dtype_name(dtype))
with right:
    cache = _results()
    start = False
    if run:
        with show_errors():
            if not models or not tasks:
                raise ParameterError("Choose at least one model and one task to map.")
            start = True

    def work(progress):
        """The map, kept for this process and saved to the workspace's runs/ (kind "features")."""
        settings = features.FeaturesSettings(models=list(models), tasks=list(tasks), level=level, layer=layer,
                                             head=head, pooling=pooling, samples=int(samples),
                                             perplexity=float(perplexity), seed=int(seed), device=device,
                                             dtype=dtype_name(dtype))
        result = features.ANALYSIS.run(pool, settings, progress)
        cache[key] = result
        return result, features.save_features(result, pool=pool)

    def keep(done) -> None:
        st.toast(f"Saved under {done[1]}")

    last = run_once(key, work, start=start, label="Capturing features and mapping them with t-SNE",
                    slot="features", on_done=keep)
    last = last[0] if last is not None else None
    result = cache.get(key)
    if result is None and last is not None:
        st.info("These settings are not mapped yet; below is the last map made on this page. Press "
                "**Map features** for the settings on the left.")
        result = last
    if result is None:
        st.info("Choose models, tasks and a submodule, then press **Map features**.")
        st.stop()
    st.plotly_chart(tsne_scatter(result), key="features_scatter")
    st.caption("Colour is the task, the symbol the model; click a task in the legend to hide its points.",
               help=explain("tsne"))
    st.subheader("Distance between task clusters")
    st.caption("Euclidean distance between task centroids, per model: in the t-SNE plane and in the PCA space "
               "(the latter is the one to compare; t-SNE distances are only indicative).")
    show_table(result.cluster_summary(), key="features_summary")
    show_table(result.distances, key="features_distances")
    if len(result.cluster_summary()):
        st.plotly_chart(distance_bars(result), key="features_distance_bars")
    st.download_button("Download coordinates (CSV)", result.coords.to_csv(index=False), mime="text/csv",
                       file_name="features-tsne.csv", key="features_csv", on_click="ignore")
