"""Merge: compose a recipe from the pool, run it, judge it beside the base and its parents, keep it."""
from __future__ import annotations

import time
from dataclasses import replace

import streamlit as st

from forgetlab.errors import ParameterError, parse_floats
from forgetlab.merge import METHODS, load_plugins
from forgetlab.merge.recipes import mergekit_yaml
from forgetlab.merge.workflow import (cards_frame, check_merge_name, evaluate_merge, merge_into_workspace,
                                      pool_recipe, recipe_form, saved_merges, search_pool_lambdas)
from forgetlab.plots.merge import scorecard_figure, search_figure
from forgetlab.progress import scaled
from forgetlab.search import OBJECTIVES, SEARCH_MEASURES, check_search, save_search, searchable_param
from forgetlab.search import search as search_weights  # `search` names the PCB λ checkbox below
from forgetlab.ui import (device_settings, eval_limits, job_key, require_finetuned, require_pool, run_once,
                          show_errors, workspace_home)
from forgetlab.ui.jobs import partial_figure
from forgetlab.ui.measure import SweepMeasures, speciality_measure
from forgetlab.ui.navigation import require_app
from forgetlab.ui.tables import show_table

require_app()     # a page opened by its URL on a fresh server: go through app.py
st.title("Merge")
st.caption("Pick fine-tuned models and a merge method; the merged model is written into the workspace and "
           "scored at once beside the base and its parents: general-text loss (generality) and, per task, exact "
           "match or answer loss (speciality).")

pool = require_pool()
require_finetuned(pool, "merge")

load_plugins()  # methods registered by other modules (e.g. slwm) appear in the form too
REPORT_KEY = "merge_report"
CACHE_KEY = "merge_card_cache"
MERGE_BEST_KEY = "merge_search_merge_best"    # set by 'Merge the best': the form, preset, is merged on this run


def _preset_form(method: str, models: list[str], params: dict) -> None:
    """Set the form's widgets to a merge (`recipe_form`'s method, pool models, parameters); call it before they
    are drawn (at the top of the script, or in a button's callback)."""
    st.session_state.update({"merge_models": list(models), "merge_method": method})
    for p in METHODS[method].params:
        if p.name not in params:
            continue
        key, value = f"merge_{method}_{p.name}", params[p.name]
        if p.per_model:
            values = value if isinstance(value, (list, tuple)) else [value] * len(models)
            st.session_state.update({f"{key}_{m}": float(v) for m, v in zip(models, values)})
        elif p.type == "floats":       # a text input of comma-separated numbers
            st.session_state[key] = ", ".join(f"{v:g}" for v in value)
        else:
            st.session_state[key] = int(value) if p.type == "int" else float(value) if p.type == "float" else value


incoming = st.session_state.pop("attribution_recipe", None)   # a recipe made on the Attribution page
if incoming:   # preset the form's widgets with it (before they are drawn)
    _preset_form(incoming["method"], incoming["models"], incoming["params"])


def _param_widget(method: str, p, models: list[str]):
    key = f"merge_{method}_{p.name}"
    lo, hi = (p.range if p.range else (None, None))
    if p.per_model:
        # three per row: one column per model squeezed the labels to a letter per line with six models
        cols = [c for _ in range(0, max(1, len(models)), 3) for c in st.columns(3)]
        return [col.number_input(f"{p.name} · {m}", lo, hi, float(p.default), 0.05, key=f"{key}_{m}", help=p.help)
                for col, m in zip(cols, models)]
    if p.type == "float":
        return st.number_input(p.name, lo, hi, float(p.default), 0.01, key=key, help=p.help, format="%.4f")
    if p.type == "int":
        return int(st.number_input(p.name, int(lo) if lo is not None else None,
                                   int(min(hi, 2**31 - 1)) if hi is not None else None, int(p.default), 1,
                                   key=key, help=p.help))
    if p.type == "bool":
        return st.checkbox(p.name, bool(p.default), key=key, help=p.help)
    if p.type == "str" and not p.choices:
        return st.text_input(p.name, str(p.default), key=key, help=p.help)
    if p.type == "str":
        choices = list(p.choices)
        return st.selectbox(p.name, choices, index=choices.index(p.default), key=key, help=p.help)
    text = st.text_input(p.name, ", ".join(f"{v:g}" for v in p.default), key=key, help=p.help)
    return parse_floats(text, p.name)


left, right = st.columns([1, 2])
with left:
    models = st.multiselect("fine-tuned models", pool.model_names, default=pool.model_names, key="merge_models")
    method = st.selectbox("method", list(METHODS), index=list(METHODS).index("ties") if "ties" in METHODS else 0,
                          key="merge_method")
    spec = METHODS[method]
    st.caption(f"{spec.description}  \n{spec.formula}" if spec.formula else spec.description)
    params: dict = {}
    with show_errors():
        for p in spec.params:
            params[p.name] = _param_widget(method, p, models)
    search = None
    if method == "pcb":
        search = st.checkbox("search a λ per task with CMA-ES first", False, key="merge_pcb_search",
                             help="Minimises the mean answer loss on the pool tasks' probe split; the λ found "
                                  "replace the λ above.")
        budget = st.number_input("λ search budget (evaluations)", 2, 500, 12, key="merge_pcb_budget",
                                 disabled=not search)
    dtype = st.selectbox("output dtype", ["(as the base)", "float32", "bfloat16", "float16"], key="merge_dtype")
    default_name = f"{method}-{'-'.join(models)[:40]}-{time.strftime('%m%d-%H%M%S')}"
    name = st.text_input("merge name (folder under merges/)", default_name, key=f"merge_name_{method}")
    max_general, max_task = eval_limits("merge")
    go = st.button("Merge and evaluate", type="primary", key="merge_run")
    go = st.session_state.pop(MERGE_BEST_KEY, False) or go

with right:
    measure = speciality_measure("merge", pool, benchmarks=True)
    # a benchmark measure (TASK/METRIC of the pool's lm-eval tasks) is run on base, parents and the merge
    bench_settings = SweepMeasures(pool, measure, "general_loss").settings
    device, _dtype = device_settings()
    out_dtype = None if dtype.startswith("(") else dtype
    start = False
    if go:
        with show_errors():
            check_merge_name(name)
            pool_recipe(pool, method, models, params, dtype=out_dtype).validated_params()
            start = True
    cache = st.session_state.setdefault(CACHE_KEY, {})

    def work(progress):
        """(λ search,) merge into merges/<name>, evaluate beside base and parents: the page's report."""
        from forgetlab.ui.executor import session_executor

        found, merge_params = None, dict(params)
        if search:
            lam0 = params["lam"][0] if isinstance(params["lam"], list) else params["lam"]
            found = search_pool_lambdas(pool, models, keep=params["keep"], lam=float(lam0), scope=params["scope"],
                                        budget=int(budget), max_task=int(max_task), device=device,
                                        executor=session_executor(), progress=scaled(progress, 0.0, 0.4))
            merge_params["lam"] = [round(v, 6) for v in found.lambdas]
        recipe = pool_recipe(pool, method, models, merge_params, dtype=out_dtype)
        result = merge_into_workspace(recipe, name, device=device, pool=pool,
                                      progress=scaled(progress, 0.4 if search else 0.0, 0.7))
        cards = evaluate_merge(pool, result.out_dir, models, device=device, max_general=int(max_general),
                               max_task=int(max_task), cache=cache, benchmarks=bench_settings.get("benchmarks"),
                               progress=scaled(progress, 0.7, 1.0))
        return {"name": result.out_dir.name, "path": str(result.out_dir), "recipe": recipe, "cards": cards,
                "seconds": result.seconds, "search": found}

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
        frame = cards_frame(report["cards"], merged=[report["name"]])
        st.plotly_chart(scorecard_figure(report["cards"], measure, merged=[report["name"]]), key="merge_chart")
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

st.divider()
st.subheader("Search merge weights (CMA-ES)")
SEARCH_KEY = "merge_search_result"
param = searchable_param(method)
st.caption(f"CMA-ES over the per-model {param or 'weights'} of the {method} merge composed above, as mergekit-evolve "
           "does: every point is a merge evaluated on the probe split (speciality against held-out loss), drawn "
           "as it arrives; the best one maximises the speciality within the forgetting bound (constrained) or "
           "minimises −speciality + forgetting (weighted). Runs on the executor chosen in the sidebar.")
c1, c2, c3 = st.columns(3)
s_budget = int(c1.number_input("evaluations (budget)", 0, 500, 30, key="merge_search_budget",
                                help="merges evaluated, the start included (about 0.5 s each on the pico zoo)"))
objective = c2.selectbox("objective", list(OBJECTIVES), key="merge_search_objective")
bound = c3.number_input("forgetting bound (nats of held-out loss)", 0.0, 10.0, 0.05, 0.01, format="%.3f",
                        key="merge_search_bound", disabled=objective != "constrained")
s_go = st.button("Search weights", key="merge_search_run", disabled=param is None or not models,
                 help=None if param else f"{method} has no per-model weight to search; pick another method.")
s_measure = measure if measure in SEARCH_MEASURES or bench_settings else "exact_match"
search_kw = dict(budget=s_budget, objective=objective, max_forgetting=float(bound), measure=s_measure,
                 device=device, max_general=int(max_general), max_task=int(max_task),
                 benchmarks=bench_settings.get("benchmarks"))
s_settings = dict(method=method, models=list(models), params=params, **search_kw)
s_start = False
if s_go:
    with show_errors():     # bad settings (e.g. a budget of 0) are said here, before any job starts
        check_search(pool_recipe(pool, method, models, params, dtype=out_dtype), pool, **search_kw)
        s_start = True


def search_work(progress):
    """The search, publishing a snapshot after each point, then saved to Runs (kind `search`)."""
    from forgetlab.ui.executor import session_executor

    res = search_weights(pool_recipe(pool, method, models, params, dtype=out_dtype), pool, **search_kw,
                         executor=session_executor(), progress=progress,
                         on_point=lambda point, partial: progress.publish(replace(partial,
                                                                                  points=list(partial.points))))
    return res, save_search(res)


def show_search_partial(partial) -> None:
    st.caption(f"{len(partial.points)} of {s_budget} point(s) so far")
    st.plotly_chart(partial_figure(partial, search_figure), key="merge_search_live")
    show_table(partial.to_frame(), key="merge_search_live_points")     # with the worker of each point


def keep_search(done) -> None:
    st.session_state[SEARCH_KEY] = done[0]
    st.toast(f"Saved under {done[1]}")


def use_best(form, merge: bool = False) -> None:
    """Put the best recipe (`recipe_form`) into the form above and, with `merge`, merge it at once under a new
    name (a callback: it runs before the widgets are drawn)."""
    _preset_form(*form)
    if merge:
        st.session_state[f"merge_name_{form[0]}"] = f"{form[0]}-search-best-{time.strftime('%m%d-%H%M%S')}"
        st.session_state[MERGE_BEST_KEY] = True


run_once(job_key("merge-search", pool.key, str(workspace_home()), s_settings), search_work, start=s_start,
         slot="merge-search", on_done=keep_search, show_partial=show_search_partial,
         label=f"Searching {param} of {len(models)} model(s) for {method}")
found_search = st.session_state.get(SEARCH_KEY)
if found_search is not None:
    best = found_search.best_point
    st.plotly_chart(search_figure(found_search), key="merge_search_chart")
    if best is not None:
        st.caption(f"best: point {best.index} — {found_search.param} "
                   + ", ".join(f"{m} {v:.3f}" for m, v in zip(found_search.models, best.values))
                   + f"; speciality {best.speciality:.4f}, forgetting {best.forgetting:+.4f} "
                   + ("(no point met the forgetting bound: this is the one that forgot least) "
                      if found_search.objective == "constrained" and best.forgetting > found_search.max_forgetting
                      else "")
                   + f"({len(found_search.points)} points in {found_search.seconds:.1f} s, "
                   f"{found_search.executor.get('name', 'local')} executor)")
        with show_errors():
            best_form = recipe_form(pool, found_search.best_recipe)
            b1, b2 = st.columns(2)
            b1.button("Merge the best and evaluate", type="primary", key="merge_search_merge_best",
                      on_click=use_best, args=(best_form, True),
                      help="Writes the best recipe into merges/ (as 'Merge and evaluate' does) and scores it beside "
                           "the base and its parents; its scorecard appears above.")
            b2.button("Use the best weights in the form above", key="merge_search_use", on_click=use_best,
                      args=(best_form,), help="Then change what you like and press 'Merge and evaluate'.")
    show_table(found_search.to_frame(), key="merge_search_points")

st.divider()
st.subheader("Earlier merges")
with show_errors():
    earlier = saved_merges()
if not earlier:
    st.caption("No merge saved in this workspace yet.")
else:
    import pandas as pd

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
        st.plotly_chart(scorecard_figure(cards, measure, merged=chosen,
                                         title="saved merges beside their base and parents"),
                        key="merge_compare_chart")
        show_table(frame, key="merge_compare_table")
        for m in picked:
            with st.expander(f"recipe of {m.name}"):
                st.code(m.recipe_yaml(), language="yaml")
