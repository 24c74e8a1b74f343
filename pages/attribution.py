"""Attribution: which layers and modules of the task vector carry the new skill, and which carry the damage?"""
from __future__ import annotations

import streamlit as st

from forgetlab.analysis import attribution as A
from forgetlab.analysis.measures import pareto_mask
from forgetlab.analysis.sweeps import default_task
from forgetlab.core.errors import parse_floats
from forgetlab.core.memory import dtype_name
from forgetlab.plots.attribution import MAP_LABELS as MAP_TITLES, heatmap_figure, tradeoff_figure
from forgetlab.ui.errors import show_errors
from forgetlab.ui.jobs import job_key, run_once
from forgetlab.ui.pool import require_finetuned, require_pool
from forgetlab.ui.settings import budget_caption, device_settings, eval_budget, workspace_home
from forgetlab.ui.measure import speciality_measure
from forgetlab.ui.memory import memory_check
from forgetlab.ui.glossary import explain
from forgetlab.ui.navigation import page_header
from forgetlab.ui.tables import show_table
from forgetlab.ui.choices import index_of

MENU = ("Attribution", ":material/grid_on:", 40)    # its entry in the app's menu (forgetlab.ui.navigation)

page_header("Attribution",
            "Cut the task vector τ = θ1 − θ0 into submodules. *Only this*: the base plus one part of τ — what "
            "that part alone buys and costs against the base. *Leave one out*: the fine-tune without that part — "
            "what removing it gives back and loses against the fine-tune. Red: general loss up (forgetting).")

pool = require_pool()
require_finetuned(pool, "map")

RESULT_KEY = "attribution_result"
RECIPE_KEY = "attribution_recipe"      # read by the Merge page: a submodule_alpha recipe to open
MAP_LABELS = {"only_this": "only this part (vs base)", "leave_one_out": "leave this part out (vs fine-tune)"}

device, dtype = device_settings()
left, right = st.columns([1, 2])
with left:
    model = st.selectbox("fine-tuned model", pool.model_names, key="attribution_model")
    guess = default_task(pool, model)
    tasks = list(pool.task_names)
    task = st.selectbox("speciality task", tasks, index=index_of(tasks, guess),
                        key=f"attribution_task_{model}", help=explain("speciality")) if tasks else None
    level = st.radio("level", list(A.LEVELS), index=1, key="attribution_level", horizontal=True,
                     help="layer: one part per decoder layer; module: attn / mlp / norm per layer; head: attention "
                          "heads one by one. Embeddings, final norm and lm_head are parts of their own.")
    line = st.text_input("α line per part (optional)", "", key="attribution_alphas",
                         help="Empty: the 0/1 maps. Values such as 0, 0.5, 1 evaluate every part along a line.")
    budget = eval_budget()
    max_general, max_task = budget.max_general, budget.max_task
    budget_caption(budget)
    fits = memory_check("attribution", pool=pool, model=model, task=task, level=level, device=device, dtype=dtype,
                        max_general=int(max_general), max_task=int(max_task))
    run = st.button("Compute the maps", type="primary", key="attribution_run", disabled=not fits)

with right:
    measure = speciality_measure("attribution", pool)
    alphas = None
    start = False
    with show_errors():
        alphas = parse_floats(line, "the α line") if line.strip() else None
    settings = dict(task=task, level=level, alphas=alphas, device=device, dtype=dtype_name(dtype),
                    max_general=int(max_general), max_task=int(max_task))
    if run and (alphas is not None or not line.strip()):
        with show_errors():
            A.check(pool, model, **settings)
            start = True
    key = job_key("attribution", pool.key, str(workspace_home()), model, settings)

    def work(progress):
        """Both maps, then saved to the workspace's runs/ (also if nobody is watching)."""
        result = A.attribute(pool, model, progress=progress, **settings)
        return result, A.save_attribution(result)

    def keep(done) -> None:
        st.session_state[RESULT_KEY] = done[0]
        st.toast(f"Saved under {done[1]}")

    run_once(key, work, start=start, label=f"Attribution of {model} ({level})", slot="attribution", on_done=keep)

    current = st.session_state.get(RESULT_KEY)
    if current is not None and current.model != model:
        current = None
    saved = A.list_attributions(model=model)
    if current is None and saved:
        labels = {r.id: f"{r.recipe.get('level')} · {r.recipe.get('task')} · {r.id}" for r in saved}
        chosen = st.selectbox("saved maps of this model", list(labels), format_func=labels.get,
                              key=f"attribution_saved_{model}")
        with show_errors():
            current = A.load_attribution(next(r.path for r in saved if r.id == chosen))
    if current is None:
        st.info("Compute the maps (left) to see where the task vector buys speciality and costs generality.")
        st.stop()

    r = current
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
    nls = A.linearity_nls(r.model, r.task)
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

    st.subheader("A merge recipe from the map")
    only = frame[(frame["map"] == "only_this") & (frame["alpha"] == 1.0) & frame["head"].isna()]
    y = only["d_speciality"] if measure == "exact_match" else -only["d_answer_loss"]
    front = [k for k, on in zip(only["key"], pareto_mask(list(y), list(only["d_general_loss"]))) if on]
    options = list(only["key"])
    if not options:
        st.info("Head-level maps give one α per head, which a merge cannot apply; compute a module-level map.")
        st.stop()
    keep_keys = st.multiselect("submodules whose τ to keep", options, default=[k for k in front if k in options],
                               key=f"attribution_keep_{r.model}_{r.level}",
                               help="Default: the Pareto front of the only-this map.")
    a_keep = st.slider("α of the kept submodules", 0.0, 1.0, 1.0, 0.05, key="attribution_alpha_keep")
    a_rest = st.slider("α of every other submodule", 0.0, 1.0, 0.0, 0.05, key="attribution_alpha_rest")
    if st.button("Open this recipe on the Merge page", key="attribution_to_merge"):
        with show_errors():
            recipe = A.recipe_from_map(pool, r.model, {k: a_keep for k in keep_keys}, default=a_rest)
            st.session_state[RECIPE_KEY] = {"models": [r.model], "method": recipe.method,
                                            "params": dict(recipe.params)}
            st.code(recipe.to_yaml(), language="yaml")
            try:
                st.switch_page("pages/merge.py")
            except Exception:  # the page run alone (tests): the recipe waits in the session state
                st.success("Recipe ready: open the Merge page.")
