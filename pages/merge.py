"""Merge: compose a recipe from the pool, run it, judge it beside the base and its parents, keep it."""
from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from forgetlab.analysis.lambda_search import search_then_merge
from forgetlab.analysis.lambda_search_memory import estimate_pcb_search
from forgetlab.core.errors import ParameterError
from forgetlab.merge import METHODS
from forgetlab.merge.memory import estimate_merge
from forgetlab.merge.recipe_io import mergekit_yaml
from forgetlab.merge.registry import method_title
from forgetlab.merge.workflow import (cards_frame, check_merge_name, default_merge_models, merge_and_evaluate,
                                      merge_folder_name, pool_recipe, saved_merges, workspace_merge_dir)
from forgetlab.ui.errors import show_errors
from forgetlab.ui.executor import session_executor
from forgetlab.ui.jobs import job_key, run_once
from forgetlab.ui.settings import budget_caption, device_settings, eval_budget, workspace_home
from forgetlab.ui.merge_compare import judge_figure, judge_takeaway, render_compare
from forgetlab.ui.glossary import explain_group
from forgetlab.ui.measure import SweepMeasures, speciality_measure
from forgetlab.ui.merge_form import param_widget, preset_form
from forgetlab.ui.memory import memory_check
from forgetlab.ui.merge_search import MERGE_BEST_KEY, render_search
from forgetlab.ui.page import start_page
from forgetlab.ui.tables import show_table
from forgetlab.ui.textview import open_text_view
from forgetlab.ui.choices import index_of
from forgetlab.ui.studies import show_studies

MENU = ("Merge", ":material/merge:", 70)    # its entry in the app's menu (forgetlab.ui.navigation)

pool = start_page(MENU, "Can one merged model keep every fine-tune's skill, and what does it cost on general text? "
                        "Each merge is saved in the workspace and scored beside the base and its parents.",
                        how="Retention on a parent's own task t: (s(merge, t) − s(base, t)) / (s(parent, t) − "
                            "s(base, t)); 100 % = as good as the parent, 0 % = no better than the base "
                            "(docs/methods.md#retention). Forgetting: general loss − the base's, in nats "
                            "(docs/methods.md#forgetting). Each method's formula is under its name in "
                            "docs/methods.md.",
                        needs="finetuned", purpose="merge")


REPORT_KEY = "merge_report"

incoming = st.session_state.pop("attribution_recipe", None)   # a recipe made on the Attribution page
if incoming:   # preset the form's widgets with it (before they are drawn)
    preset_form(incoming["method"], incoming["models"], incoming["params"])

budget = eval_budget()
max_general, max_task = budget.max_general, budget.max_task
measure = speciality_measure("merge", pool, benchmarks=True)
# a benchmark measure (TASK/METRIC of the pool's lm-eval tasks) is run on base, parents and the merge
bench_settings = SweepMeasures(pool, measure, "general_loss").settings
device, run_dtype = device_settings()     # merges are scored in it (the form's "output dtype" is what is written)
budget_caption(budget)
render_compare(pool, measure, budget, device, run_dtype)    # the default: the full fine-tunes three ways, one click

st.divider()
st.subheader("Compose a merge")
left, right = st.columns([1, 2])
with left:
    models = st.multiselect("fine-tuned models", pool.model_names, default=default_merge_models(pool),
                            key="merge_models")
    method = st.selectbox("method", list(METHODS), index=index_of(METHODS, "ties"), key="merge_method",
                          format_func=lambda m: f"{method_title(m)} ({m})" if method_title(m) != m else m,
                          help=explain_group("merge"))
    spec = METHODS[method]
    st.caption(f"{spec.description}  \n{spec.formula}" if spec.formula else spec.description)
    params: dict = {}
    with show_errors():
        for p in spec.params:
            params[p.name] = param_widget(method, p, models)
    search = None
    if method == "pcb":
        search = st.checkbox("search a λ per task with CMA-ES first", False, key="merge_pcb_search",
                             help="Minimises the mean answer loss on the pool tasks' probe split; the λ found "
                                  "replace the λ above.")
        budget = st.number_input("λ search budget (evaluations)", 2, 500, 12, key="merge_pcb_budget",
                                 disabled=not search)
    dtype = st.selectbox("output dtype", ["(as the base)", "float32", "bfloat16", "float16"], key="merge_dtype")
    default_name = merge_folder_name(method, models, time.strftime('%m%d-%H%M%S'))
    name = st.text_input("merge name (folder under merges/)", default_name, key=f"merge_name_{method}")
    try:
        planned = pool_recipe(pool, method, models, params)
    except ParameterError:
        planned = None          # pressing the button says what is wrong
    fits = planned is None or memory_check(estimate_merge, recipe=planned, pool=pool, device=device, dtype=run_dtype,
                                           evaluate=True, max_general=max_general, max_task=max_task)
    if search and planned is not None:
        fits = memory_check(estimate_pcb_search, pool=pool, recipe=planned, device=device, dtype=run_dtype,
                            max_task=int(max_task)) and fits
    go = st.button("Merge and evaluate", type="primary", key="merge_run", disabled=not fits)
    go = st.session_state.pop(MERGE_BEST_KEY, False) or go

with right:
    out_dtype = None if dtype.startswith("(") else dtype
    start = False
    if go:
        with show_errors():
            check_merge_name(name)
            pool_recipe(pool, method, models, params, dtype=out_dtype).validated_params()
            start = True

    def work(progress):
        """(λ search,) merge into merges/<name> and evaluate it beside base and parents, all or nothing (the path
        `forgetlab merge --eval` takes): the page's report."""
        recipe = pool_recipe(pool, method, models, params, dtype=out_dtype, name=name)
        kw = dict(device=device, dtype=run_dtype, max_general=int(max_general), max_task=int(max_task),
                  benchmarks=bench_settings.get("benchmarks"), progress=progress)
        found = None
        if search:      # the path `forgetlab pcb-search … --merge` takes
            done = search_then_merge(pool, recipe, workspace_merge_dir(name), budget=int(budget),
                                     executor=session_executor(), **kw)
            found, recipe, result, cards = done.search, done.recipe, done.merge, done.cards
        else:
            result, cards = merge_and_evaluate(recipe, workspace_merge_dir(name), pool, **kw)
        return {"name": result.out_dir.name, "path": str(result.out_dir), "recipe": recipe, "cards": cards,
                "seconds": result.seconds, "search": found, "notes": list(result.notes)}

    def keep(report) -> None:
        st.session_state[REPORT_KEY] = report
        st.toast(f"Saved under {report['path']}")

    run_once(job_key("merge", str(workspace_home()), name), work, start=start, slot="merge", on_done=keep,
             label=f"Merging {len(models)} model(s) with {method} into {name}")

    report = st.session_state.get(REPORT_KEY)
    if report is None:
        st.info("Compose a merge on the left and run it; its scorecard appears here.")
    else:
        st.subheader(f"{report['name']}")
        st.caption(f"merged in {report['seconds']:.1f} s into {report['path']}")
        for note in report.get("notes", []):
            st.info(note)
        frame = cards_frame(report["cards"], merged=[report["name"]])
        with show_errors():
            judge_takeaway(pool, report["cards"], [report["name"]], measure, key="merge_one_takeaway",
                           labels={report["name"]: "The merge"})
            st.plotly_chart(judge_figure(pool, report["cards"], [report["name"]], measure), key="merge_chart")
        show_table(frame, key="merge_table")
        found = report.get("search")
        if found is not None:
            st.caption(f"λ search: probe answer loss {found.initial_loss:.4f} at the start → {found.loss:.4f} with "
                       f"λ = {', '.join(f'{v:.3f}' for v in found.lambdas)} ({found.n_evals} evaluations)")
            show_table(found.to_frame(), key="merge_search_table")
        d1, d2 = st.columns(2)
        d1.download_button("Download recipe (forgetlab YAML)", report["recipe"].to_yaml(),
                           file_name=f"{report['name']}.yaml", key="merge_download")
        try:
            mk = mergekit_yaml(report["recipe"])
        except ParameterError:
            mk = None
        if mk is not None:
            d2.download_button("Download as mergekit YAML", mk, file_name=f"{report['name']}.mergekit.yaml",
                               key="merge_download_mk")
        if st.button("Open this merge in the Text view (against the base)", key="merge_text"):
            open_text_view(report["name"])

st.divider()
render_search(pool, method, models, params, out_dtype=out_dtype, measure=measure, bench_settings=bench_settings,
              device=device, max_general=int(max_general), max_task=int(max_task), dtype=run_dtype)

st.divider()
st.subheader("Earlier merges")
with show_errors():
    earlier = saved_merges()
if not earlier:
    st.caption("No merge saved in this workspace yet.")
else:
    show_table(pd.DataFrame([m.to_row() for m in earlier]), key="merge_saved_table")
    evaluated = [m for m in earlier if m.cards]
    chosen = st.multiselect("compare evaluated merges", [m.name for m in evaluated], key="merge_compare")
    if chosen:
        picked = [m for m in evaluated if m.name in chosen]
        cards, seen = [], set()
        for m in picked:
            for c in m.cards:
                label = c.model
                if label not in seen:
                    seen.add(label)
                    cards.append(c)
        frame = cards_frame(cards, merged=chosen)
        budgets = {m.budget for m in picked}
        if len(budgets) > 1 or budgets != {(max_general, max_task)}:
            st.warning("These merges were scored at other evaluation budgets than the sidebar's ("
                       + "; ".join(f"{m.name}: {m.budget_text()}" for m in picked)
                       + "): their numbers differ from the other pages' for the same model.")
        with show_errors():
            st.plotly_chart(judge_figure(pool, cards, chosen, measure, parents={m.name: m.parents for m in picked},
                                         title="saved merges beside their base and parents"),
                            key="merge_compare_chart")
        show_table(frame, key="merge_compare_table")
        for m in picked:
            with st.expander(f"recipe of {m.name}"):
                for note in m.notes:
                    st.info(note)
                st.code(m.recipe_yaml(), language="yaml")

show_studies(pool, "merge")
