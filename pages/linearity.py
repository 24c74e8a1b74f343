"""Linearity: how linear is the model, and each of its submodules, in its task vector?"""
from __future__ import annotations

import streamlit as st

from forgetlab.analysis.base import ANALYSES
from forgetlab.analysis.linearity import LinearitySettings
from forgetlab.core.taskvectors import checkpoint_distance
from forgetlab.core.errors import ParameterError
from forgetlab.core.memory import dtype_name
from forgetlab.plots.linearity import curves_figure, level_bars, nls_heatmap
from forgetlab.ui.errors import show_errors
from forgetlab.ui.settings import device_settings
from forgetlab.ui.choices import index_of
from forgetlab.ui.glossary import explain
from forgetlab.ui.page import start_page
from forgetlab.ui.panel import AnalysisPanel
from forgetlab.ui.tables import show_table
from forgetlab.ui.widgets import field_widget
from forgetlab.ui.studies import show_studies

MENU = ("Linearity", ":material/show_chart:", 20)    # its entry in the app's menu (forgetlab.ui.navigation)

pool = start_page(MENU, "When a fine-tune's change is scaled up from none of it to all of it, does each part of the "
                        "model respond in a straight line? Parts that do can be interpolated and merged "
                        "predictably; parts that don't are where merges surprise.",
                        how="Each submodule is re-run on inputs captured once from the fine-tuned model while only "
                            "its own parameters move from θ0 to θ0 + α·τ (τ = θ1 − θ0). d(α) is its output's "
                            "distance to the fine-tuned output, relative to the base's; a perfectly linear "
                            "submodule follows 1 − α. Non-linearity score NLS = Σα |d(α) − (1 − α)|: 0 is linear. "
                            "Formulas: docs/methods.md#distance-curve, #nls.",
                        needs="pool")

if not pool.model_names or not pool.task_names:
    st.info("The pool needs a fine-tuned model and probe data for a task: add them to the pool file.")
    st.stop()


@st.cache_data(show_spinner=False)
def _distance(pool_key: str, model: str) -> float:
    """D(θ, θ0) of a pool model, once per pool file version and model."""
    return checkpoint_distance(pool, model)


panel = AnalysisPanel(ANALYSES.get("linearity"), page="linearity", button="Compute scores",
                      label=lambda s: f"Non-linearity of {s.model} on {s.task}")
device, dtype = device_settings()
left, right = st.columns([1, 3])
with left:
    task = field_widget(LinearitySettings, "task", key="linearity_task", options=pool.task_names)
    model = field_widget(LinearitySettings, "model", key="linearity_model", options=pool.model_names,
                         default=pool.model_names[index_of(pool.model_names, task)], label="fine-tuned model")
    n_probe = len(pool.probes.tasks[task].probe)
    if n_probe == 0:
        st.warning(f"Task {task!r} has no probe samples; add a probe file for it to the pool.")
        st.stop()
    samples = field_widget(LinearitySettings, "samples", key=f"linearity_samples_{task}", high=n_probe,
                           default=min(30, n_probe), help=f"The task has {n_probe}.")
    alphas = field_widget(LinearitySettings, "alphas", key="linearity_alphas", help=explain("alpha", "d_alpha"))
    try:
        level_options = list(pool.anatomy.levels)
    except ParameterError as exc:
        st.caption(f"Only the model level: {exc}")
        level_options = ["model"]
    levels = field_widget(LinearitySettings, "levels", key="linearity_levels", options=level_options,
                          help=explain("submodule") + "  \nmodel: the whole network; layer: one decoder block; "
                               "attn / mlp: its attention / MLP; head: one attention head; expert: one expert of a "
                               "mixture of experts, on the tokens its router sent it.")
    capture = field_widget(LinearitySettings, "capture", key="linearity_capture", label="inputs captured from",
                           format_func={"finetuned": "the fine-tuned model", "base": "the base model"}.get, radio=True)
    settings = LinearitySettings(task=task, model=model, levels=levels or ("model",), alphas=alphas or (0.0,),
                                 samples=samples, capture=capture, device=device, dtype=dtype_name(dtype))
    start = panel.controls(pool, settings, disabled=alphas is None)


def show(result) -> None:
    """Scores per level, the heatmap and bars, the chosen d(α) curves, the table and its downloads."""
    st.caption("Non-linearity score (NLS, mean over samples) per level, and the task vector's size D(θ, θ0)",
               help=explain("nls", "distance"))
    by_level = result.by_level()
    n = len(by_level) + 1        # at most four metrics per row: six narrow columns truncated values to "0.3…"
    cells = [c for i in range(0, n, 4) for c in st.columns(4)][:n]
    for c, row in zip(cells, by_level.itertuples()):
        c.metric(str(row.level), f"{row.nls_mean:.3g}", help=f"NLS {row.nls_mean:.4f} ± {row.nls_std:.4f} over "
                 f"samples, {row.submodules} submodule(s).  \n" + explain("nls"))
    with show_errors():
        cells[-1].metric("D(θ, θ0)", f"{_distance(pool.key, result.model):.3g}",
                        help=explain("distance") + "  \nNLS grows with D: submodules are near-linear for small "
                             "task vectors and less so for large ones (measurements in docs/linearity.md).")
    st.plotly_chart(nls_heatmap(result), key="linearity_heatmap")
    st.plotly_chart(level_bars(result), key="linearity_bars")
    frame = result.to_frame()
    labels = {("model", None, None): "model"} if "model" in result.levels else {}
    for r in frame[frame.level != "model"].itertuples():
        head = None if r.level != "head" else int(r.head)
        labels[(r.level, int(r.layer), head)] = (f"layer {int(r.layer)} · " +
                                                 (f"head {head}" if head is not None else r.level))
    chosen = st.multiselect("curves to draw (empty: the model and each level's mean)", list(labels),
                            format_func=labels.get, key="linearity_curves")
    st.plotly_chart(curves_figure(result, chosen or None), key="linearity_curve_chart")
    shown = frame.assign(curve=[", ".join(f"{v:.3f}" for v in c) for c in frame["curve"]],
                         curve_std=[", ".join(f"{v:.3f}" for v in c) for c in frame["curve_std"]])
    show_table(shown, key="linearity_table")
    st.caption(f"{result.samples} samples · α ∈ {{{', '.join(f'{a:g}' for a in result.alphas)}}} · inputs from "
               f"the {result.capture} model · NLS = Σα |d(α) − (1 − α)|; residual = Property 1's relative error.",
               help=explain("nls", "d_alpha", "residual"))
    d1, d2 = st.columns(2)
    d1.download_button("Download scores (CSV)", shown.to_csv(index=False), mime="text/csv",
                       file_name=f"linearity-{result.model}-{result.task}.csv", key="linearity_csv",
                       on_click="ignore")
    d2.download_button("Download d(α) curves (CSV)", result.curves_frame().to_csv(index=False), mime="text/csv",
                       file_name=f"linearity-curves-{result.model}-{result.task}.csv", key="linearity_curves_csv",
                       on_click="ignore")


with right:
    panel.results(pool, settings, start=start, show=show,
                  empty="Choose the settings and press **Compute scores**. The whole table (every layer, module "
                        "and head) costs about three times the model level alone (docs/linearity.md).")

show_studies(pool, "linearity")
