"""Attribution: which layers and modules of the task vector carry the new skill, and which carry the damage?"""
from __future__ import annotations

import streamlit as st

from forgetlab.analysis.attribution import ANALYSIS, AttributionSettings, linearity_nls, recipe_from_map
from forgetlab.analysis.attribution_inputs import levels_of
from forgetlab.analysis.measures import pareto_mask
from forgetlab.analysis.sweeps import default_task
from forgetlab.core.memory import dtype_name
from forgetlab.plots.attribution import MAP_LABELS as MAP_TITLES, heatmap_figure, tradeoff_figure
from forgetlab.ui.errors import show_errors
from forgetlab.ui.settings import budget_caption, device_settings, eval_budget
from forgetlab.ui.measure import speciality_measure
from forgetlab.ui.glossary import explain
from forgetlab.ui.page import start_page
from forgetlab.ui.panel import AnalysisPanel
from forgetlab.ui.tables import show_table
from forgetlab.ui.widgets import field_widget

MENU = ("Attribution", ":material/grid_on:", 40)    # its entry in the app's menu (forgetlab.ui.navigation)

pool = start_page(MENU, "Which layers and modules of the fine-tune carry the new skill, and which carry the "
                        "forgetting? Each part of the fine-tune's change is tried alone on the base, and taken out "
                        "of the fine-tune.",
                        how="The task vector τ = θ1 − θ0 is cut into submodules τk. *Only this*: θ0 + τk — what "
                            "that part alone buys and costs against the base. *Leave one out*: θ0 + τ − τk — what "
                            "removing it gives back and loses against the fine-tune. d = the edited model's score − "
                            "the reference's; red: general loss up (forgetting). Additivity compares Σk d with the "
                            "whole change. Formula: docs/methods.md#attribution.",
                        needs="finetuned", purpose="map")


RECIPE_KEY = "attribution_recipe"      # read by the Merge page: a submodule_alpha recipe to open
MAP_LABELS = {"only_this": "only this part (vs base)", "leave_one_out": "leave this part out (vs fine-tune)"}

panel = AnalysisPanel(ANALYSIS, page="attribution", button="Compute the maps",
                      label=lambda s: f"Attribution of {s.model} ({s.level})")
device, dtype = device_settings()
left, right = st.columns([1, 2])
with left:
    model = field_widget(AttributionSettings, "model", key="attribution_model", options=pool.model_names,
                         label="fine-tuned model")
    tasks = list(pool.task_names)
    task = field_widget(AttributionSettings, "task", key=f"attribution_task_{model}", options=tasks,
                        default=default_task(pool, model), label="speciality task",
                        help=explain("speciality")) if tasks else None
    level = field_widget(AttributionSettings, "level", key="attribution_level", options=levels_of(pool),
                         radio=True,
                         help="layer: one part per decoder layer; module: attn / mlp / norm per layer; head: "
                              "attention heads one by one; expert (a mixture of experts): each expert of each "
                              "layer, the router staying in the layer's MLP. Embeddings, final norm and lm_head are "
                              "parts of their own.")
    alphas = field_widget(AttributionSettings, "alphas", key="attribution_alphas",
                          help="Empty: the 0/1 maps. Values such as 0, 0.5, 1 evaluate every part along a line.")
    readable = alphas is not None or not st.session_state.get("attribution_alphas", "").strip()
    budget = eval_budget()
    budget_caption(budget)
    settings = AttributionSettings(model=model, task=task, level=level, alphas=alphas, device=device,
                                   dtype=dtype_name(dtype), max_general=int(budget.max_general),
                                   max_task=int(budget.max_task))
    start = panel.controls(pool, settings) and readable     # an unreadable α line is an error above: no run

with right:
    measure = speciality_measure("attribution", pool)


def show(r) -> None:
    """The scores, both heatmaps and the trade-off of the chosen map, the additivity, the table, and a merge
    recipe made from the map."""
    b, f = r.scores("base"), r.scores("finetuned")
    key, label = ("speciality", "exact match") if measure == "exact_match" else ("answer_loss", "answer loss")
    st.caption(f"{r.model} on {r.task}, {r.level} level · {r.evaluations} evaluations, {r.seconds:.1f} s · base: "
               f"general loss {b['general_loss']:.3f}, {label} {b[key]:.3f} · fine-tune: general loss "
               f"{f['general_loss']:.3f}, {label} {f[key]:.3f}")
    for note in r.notes:
        st.warning(note)
    which = st.radio("map", list(MAP_LABELS), format_func=MAP_LABELS.get, key="attribution_map", horizontal=True,
                     help=explain("tau") + "  \nOnly this: θ0 + τk, one part of τ added to the base. Leave one out: "
                          "θ0 + τ − τk, the fine-tune without that part.")
    spec_col = "d_speciality" if measure == "exact_match" else "d_answer_loss"
    st.markdown(f"**{MAP_TITLES[which][0].upper()}{MAP_TITLES[which][1:]}**")
    c1, c2 = st.columns(2)
    c1.plotly_chart(heatmap_figure(r, "d_general_loss", which), key="attribution_heat_general")
    c2.plotly_chart(heatmap_figure(r, spec_col, which), key="attribution_heat_speciality")
    nls = linearity_nls(r.model, r.task)
    if nls:
        st.caption("Points coloured by the non-linearity score (NLS) of the newest linearity run of this model.",
                   help=explain("nls"))
    st.plotly_chart(tradeoff_figure(r, which, measure=measure, nls=nls or None), key="attribution_scatter")
    st.caption("The parts farthest from the origin are named on the chart; hover over a point for any other.",
               help=explain("pareto", "generality", "speciality"))
    st.subheader("How additive are the parts?")
    st.caption("Sum of the parts' d against the whole change (fine-tune − base for only-this; base − fine-tune "
               "for leave-one-out). A ratio of 1: the parts add up exactly.")
    show_table(r.additivity(), key="attribution_additivity")
    frame = r.to_frame()
    show_table(frame, key="attribution_table")
    st.download_button("Download the map (CSV)", frame.to_csv(index=False), file_name=f"attribution-{r.model}.csv",
                       mime="text/csv", key="attribution_csv", on_click="ignore")
    merge_recipe(r, frame)


def merge_recipe(r, frame) -> None:
    """The submodules to keep (default: the only-this map's Pareto front) with their α and every other one's, as
    a submodule_alpha recipe opened on the Merge page."""
    st.subheader("A merge recipe from the map")
    only = frame[(frame["map"] == "only_this") & (frame["alpha"] == 1.0) & frame["head"].isna()]
    y = only["d_speciality"] if measure == "exact_match" else -only["d_answer_loss"]
    front = [k for k, on in zip(only["key"], pareto_mask(list(y), list(only["d_general_loss"]))) if on]
    options = list(only["key"])
    if not options:
        st.info("Head- and expert-level maps give one α per head or expert, which a merge cannot apply; compute a "
                "module-level map.")
        return
    keep_keys = st.multiselect("submodules whose τ to keep", options, default=[k for k in front if k in options],
                               key=f"attribution_keep_{r.model}_{r.level}",
                               help="Default: the Pareto front of the only-this map.")
    a_keep = st.slider("α of the kept submodules", 0.0, 1.0, 1.0, 0.05, key="attribution_alpha_keep")
    a_rest = st.slider("α of every other submodule", 0.0, 1.0, 0.0, 0.05, key="attribution_alpha_rest")
    if st.button("Open this recipe on the Merge page", key="attribution_to_merge"):
        with show_errors():
            recipe = recipe_from_map(pool, r.model, {k: a_keep for k in keep_keys}, default=a_rest)
            st.session_state[RECIPE_KEY] = {"models": [r.model], "method": recipe.method,
                                            "params": dict(recipe.params)}
            st.code(recipe.to_yaml(), language="yaml")
            try:
                st.switch_page("pages/merge.py")
            except Exception:  # the page run alone (tests): the recipe waits in the session state
                st.success("Recipe ready: open the Merge page.")


with right:
    panel.results(pool, settings, start=start, show=show, model=model,
                  empty="Compute the maps (left) to see where the task vector buys speciality and costs generality.")
