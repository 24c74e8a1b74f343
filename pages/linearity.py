"""Linearity: how linear is the model, and each of its submodules, in its task vector?"""
from __future__ import annotations

import streamlit as st

from forgetlab.analysis import linearity
from forgetlab.core.errors import ParameterError, parse_floats
from forgetlab.core.memory import dtype_name
from forgetlab.core.submodules import CAPTURES
from forgetlab.plots.linearity import curves_figure, level_bars, nls_heatmap
from forgetlab.ui import device_settings, job_key, require_pool, run_once, show_errors
from forgetlab.ui.glossary import explain
from forgetlab.ui.memory import memory_check
from forgetlab.ui.navigation import page_header
from forgetlab.ui.tables import show_table
from forgetlab.ui.choices import index_of

page_header("Linearity",
            "Each submodule is re-run on inputs captured once from the fine-tuned model while only its own "
            "parameters move from θ0 to θ0 + τ. d(α) is its output's distance to the fine-tuned output, "
            "relative to the base's; a perfectly linear submodule follows 1 − α and scores NLS = 0.")

pool = require_pool()
if not pool.model_names or not pool.task_names:
    st.info("The pool needs a fine-tuned model and probe data for a task: add them to the pool file.")
    st.stop()


@st.cache_resource
def _results() -> dict:
    """Results by (pool, task, model, settings), shared by every session of this process."""
    return {}


@st.cache_data(show_spinner=False)
def _distance(pool_key: str, model: str) -> float:
    """D(θ, θ0) of a pool model, once per pool file version and model."""
    from forgetlab.analysis.taskvec import checkpoint_distance

    return checkpoint_distance(pool, model)


device, dtype = device_settings()
left, right = st.columns([1, 3])
with left:
    task = st.selectbox("task", pool.task_names, key="linearity_task")
    models = pool.model_names
    model = st.selectbox("fine-tuned model", models, index=index_of(models, task),
                         key="linearity_model")
    n_probe = len(pool.probes.tasks[task].probe)
    if n_probe == 0:
        st.warning(f"Task {task!r} has no probe samples; add a probe file for it to the pool.")
        st.stop()
    samples = st.number_input("samples", 1, n_probe, min(30, n_probe), key=f"linearity_samples_{task}",
                              help=f"probe pairs of the task used (it has {n_probe})")
    alpha_text = st.text_input("α grid", ", ".join(f"{a:g}" for a in linearity.DEFAULT_ALPHAS),
                               key="linearity_alphas", help=explain("alpha", "d_alpha"))
    try:
        level_options = list(pool.anatomy.levels)
    except ParameterError as exc:
        st.caption(f"Only the model level: {exc}")
        level_options = ["model"]
    levels = st.multiselect("levels", level_options, default=level_options, key="linearity_levels",
                            help=explain("submodule") + "  \nmodel: the whole network; layer: one decoder block; "
                                 "attn / mlp: its attention / MLP; head: one attention head.")
    capture = st.radio("inputs captured from", list(CAPTURES), key="linearity_capture",
                       format_func={"finetuned": "the fine-tuned model", "base": "the base model"}.get,
                       help="Each submodule is re-run on the inputs it received in this model's forward pass.")
    fits = memory_check("linearity", pool=pool, task=task, model=model, levels=levels or ["model"],
                        samples=int(samples), device=device, dtype=dtype)
    run = st.button("Compute scores", type="primary", key="linearity_run", disabled=not fits)

key = None
with show_errors():
    alphas = linearity.check_alphas(parse_floats(alpha_text, "the α grid"))
    if not levels:
        raise ParameterError("Choose at least one level (model, layer, attn, mlp or head).")
    key = job_key("linearity", pool.key, task, model, tuple(levels), alphas, int(samples), capture, device,
                  str(dtype))

with right:
    cache = _results()
    if key is None:
        st.stop()

    def work(progress):
        """The scores, kept for this process and saved to the workspace's runs/ as the CLI saves them."""
        settings = linearity.LinearitySettings(task=task, model=model, levels=levels, alphas=alphas,
                                               samples=int(samples), capture=capture, device=device,
                                               dtype=dtype_name(dtype))
        result = linearity.ANALYSIS.run(pool, settings, progress)
        cache[key] = result
        return result, linearity.save_linearity(result, pool=pool)

    def keep(done) -> None:
        st.toast(f"Saved under {done[1]}")

    last = run_once(key, work, start=run, label=f"Non-linearity of {model} on {task}", slot="linearity",
                    on_done=keep)
    last = last[0] if last is not None else None
    result = cache.get(key)
    if result is None and last is not None:
        st.info("These settings are not computed yet; below is the last result computed on this page "
                f"({last.model} on {last.task}). Press **Compute scores** for the settings on the left.")
        result = last
    if result is None:
        st.info("Choose the settings and press **Compute scores**. The whole table (every layer, module and "
                "head) costs about three times the model level alone (docs/linearity.md).")
        st.stop()
    by_level = result.by_level()
    # at most four metrics per row, three significant digits: six narrow columns truncated values to "0.3…"
    n = len(by_level) + 1
    st.caption("Non-linearity score (NLS, mean over samples) per level, and the task vector's size D(θ, θ0)",
               help=explain("nls", "distance"))
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
    labels = {}
    for r in frame.itertuples():
        if r.level == "model":
            labels[("model", None, None)] = "model"
        elif r.level == "head":
            labels[(r.level, int(r.layer), int(r.head))] = f"layer {int(r.layer)} · head {int(r.head)}"
        else:
            labels[(r.level, int(r.layer), None)] = f"layer {int(r.layer)} · {r.level}"
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
                       file_name=f"linearity-{model}-{task}.csv", key="linearity_csv", on_click="ignore")
    d2.download_button("Download d(α) curves (CSV)", result.curves_frame().to_csv(index=False), mime="text/csv",
                       file_name=f"linearity-curves-{model}-{task}.csv", key="linearity_curves_csv",
                       on_click="ignore")
