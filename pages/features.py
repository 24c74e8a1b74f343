"""Features: do the tasks separate in a submodule's features, and how does fine-tuning or merging move them?"""
from __future__ import annotations

import streamlit as st

from forgetlab.analysis.features import ANALYSIS, FEATURE_LEVELS, FeaturesSettings
from forgetlab.core.memory import dtype_name
from forgetlab.plots.features import distance_bars, tsne_scatter
from forgetlab.ui.errors import show_errors
from forgetlab.ui.settings import device_settings
from forgetlab.ui.glossary import explain
from forgetlab.ui.page import start_page
from forgetlab.ui.panel import AnalysisPanel
from forgetlab.ui.tables import show_table
from forgetlab.ui.widgets import field_widget

MENU = ("Features", ":material/scatter_plot:", 60)    # its entry in the app's menu (forgetlab.ui.navigation)

pool = start_page(MENU, "Do the tasks look different inside the model, and does fine-tuning or merging pull them "
                        "apart or together? One point per probe sample: colour is the task, the symbol the model.",
                        how="A submodule's output on each probe sample, averaged over the answer tokens (or the "
                            "last token), reduced with PCA to at most 50 dimensions and mapped to the plane with "
                            "t-SNE. The distance between two tasks is the Euclidean distance between their centres "
                            "in PCA space (t-SNE distances are only a visual guide). Formula: "
                            "docs/methods.md#tsne-features.",
                        needs="tasks", purpose="a feature map")


anatomy = None
with show_errors():
    anatomy = pool.anatomy
level_options = ([lv for lv in FEATURE_LEVELS if lv in anatomy.levels] if anatomy is not None
                 else ["model"])
panel = AnalysisPanel(ANALYSIS, page="features", button="Map features",
                      label=lambda s: "Capturing features and mapping them with t-SNE")
device, dtype = device_settings()
left, right = st.columns([1, 3])
with left:
    all_models = ["base", *pool.model_names]
    models = field_widget(FeaturesSettings, "models", key="features_models", options=all_models)
    tasks = field_widget(FeaturesSettings, "tasks", key="features_tasks", options=pool.task_names)
    level = field_widget(FeaturesSettings, "level", key="features_level", options=level_options,
                         default=level_options[min(1, len(level_options) - 1)], label="submodule",
                         format_func={"model": "last hidden state", "layer": "decoder layer", "attn": "attention",
                                      "mlp": "MLP", "head": "attention head", "expert": "expert"}.get,
                         help=explain("submodule"))
    layer = head = None
    if level != "model":
        layer = field_widget(FeaturesSettings, "layer", key="features_layer", options=list(range(anatomy.num_layers)),
                             default=anatomy.num_layers - 1)
    if level == "head":
        head = field_widget(FeaturesSettings, "head", key="features_head", options=list(range(anatomy.num_heads)))
    if level == "expert":
        head = field_widget(FeaturesSettings, "head", key="features_expert", label="expert",
                            options=list(range(anatomy.num_experts)))
    pooling = field_widget(FeaturesSettings, "pooling", key="features_pooling", radio=True,
                           format_func={"answer": "mean over answer tokens", "last": "last token"}.get,
                           help=explain("pooling"))
    n_min = min((len(pool.probes.tasks[t].probe) for t in tasks), default=1) or 1
    samples = field_widget(FeaturesSettings, "samples", key="features_samples", high=n_min, default=min(30, n_min),
                           label="samples per task")
    perplexity = field_widget(FeaturesSettings, "perplexity", key="features_perplexity", low=2.0, high=100.0,
                              help="Not a model's perplexity.")
    seed = field_widget(FeaturesSettings, "seed", key="features_seed")
    settings = FeaturesSettings(models=models, tasks=tasks, level=level, layer=layer, head=head, pooling=pooling,
                                samples=samples, perplexity=perplexity, seed=seed, device=device,
                                dtype=dtype_name(dtype))
    start = panel.controls(pool, settings)


def show(result) -> None:
    """The t-SNE map, the distances between task clusters (table and bars) and the coordinates to download."""
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


with right:
    panel.results(pool, settings, start=start, show=show,
                  empty="Choose models, tasks and a submodule, then press **Map features**.")
