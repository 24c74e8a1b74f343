"""The Merge page's "Search merge weights (CMA-ES)" section: `forgetlab.analysis.search` over the per-model weights of
the merge composed in the form, run as a background job on the session's executor, its points drawn as they
arrive; the best recipe can be put into the form or merged at once."""
from __future__ import annotations

import time
from dataclasses import replace

import streamlit as st

from forgetlab.analysis.search import (OBJECTIVES, SEARCH_MEASURES, check_search, save_search, search, search_scalars,
                                      searchable_param)
from forgetlab.core.errors import ForgetlabError
from forgetlab.core.memory import dtype_name
from forgetlab.merge.workflow import pool_recipe, recipe_form
from forgetlab.plots.merge import search_figure
from forgetlab.ui.errors import show_errors
from forgetlab.ui.jobs import job_key, run_once
from forgetlab.ui.settings import workspace_home
from forgetlab.ui.jobs import partial_figure
from forgetlab.ui.merge_form import preset_form
from forgetlab.ui.memory import memory_check
from forgetlab.ui.tables import show_table

SEARCH_KEY = "merge_search_result"
MERGE_BEST_KEY = "merge_search_merge_best"    # set by 'Merge the best': the form, preset, is merged on that run


def render_search(pool, method: str, models: list[str], params: dict, *, out_dtype, measure: str,
                  bench_settings: dict, device, max_general: int, max_task: int, dtype=None) -> None:
    """Draw the search section for the merge composed in the form (method, pool models, parameters); `dtype`
    (the sidebar's) is the workers' working copies' precision."""
    st.subheader("Search merge weights (CMA-ES)")
    scalars = search_scalars(method)      # lines: its α and β rather than per-model weights
    param = None if scalars else searchable_param(method)
    what = f"the {', '.join(scalars)}" if scalars else f"the per-model {param or 'weights'}"
    st.caption(f"CMA-ES over {what} of the {method} merge composed above, as "
               "mergekit-evolve does: every point is a merge evaluated on the probe split (speciality against "
               "held-out loss), drawn as it arrives; the best one maximises the speciality within the forgetting "
               "bound (constrained) or minimises −speciality + forgetting (weighted). Runs on the executor chosen in "
               "the sidebar.")
    c1, c2, c3 = st.columns(3)
    s_budget = int(c1.number_input("evaluations (budget)", 0, 500, 30, key="merge_search_budget",
                                    help="merges evaluated, the start included (about 0.5 s each on the pico zoo)"))
    objective = c2.selectbox("objective", list(OBJECTIVES), key="merge_search_objective")
    bound = c3.number_input("forgetting bound (nats of held-out loss)", 0.0, 10.0, 0.05, 0.01, format="%.3f",
                            key="merge_search_bound", disabled=objective != "constrained")
    try:
        recipe = pool_recipe(pool, method, models, params, dtype=out_dtype) if models else None
    except ForgetlabError:      # said when the button is pressed (check_search below)
        recipe = None
    fits = recipe is None or memory_check("search", recipe=recipe, pool=pool, device=device, dtype=dtype,
                                          max_general=int(max_general), max_task=int(max_task))
    s_go = st.button("Search weights", key="merge_search_run",
                     disabled=(param is None and not scalars) or not models or not fits,
                     help=None if param else f"{method} has no per-model weight to search; pick another method.")
    s_measure = measure if measure in SEARCH_MEASURES or bench_settings else "exact_match"
    search_kw = dict(budget=s_budget, objective=objective, max_forgetting=float(bound), measure=s_measure,
                     device=device, dtype=dtype_name(dtype) if dtype is not None else None,
                     max_general=int(max_general), max_task=int(max_task), benchmarks=bench_settings.get("benchmarks"))
    s_settings = dict(method=method, models=list(models), params=params, **search_kw)
    s_start = False
    if s_go:
        with show_errors():     # bad settings (e.g. a budget of 0) are said here, before any job starts
            check_search(pool_recipe(pool, method, models, params, dtype=out_dtype), pool, **search_kw)
            s_start = True


    def search_work(progress):
        """The search, publishing a snapshot after each point, then saved to Runs (kind `search`)."""
        from forgetlab.ui.executor import session_executor

        res = search(pool_recipe(pool, method, models, params, dtype=out_dtype), pool, **search_kw,
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
        preset_form(*form)
        if merge:
            st.session_state[f"merge_name_{form[0]}"] = f"{form[0]}-search-best-{time.strftime('%m%d-%H%M%S')}"
            st.session_state[MERGE_BEST_KEY] = True


    run_once(job_key("merge-search", pool.key, str(workspace_home()), s_settings), search_work, start=s_start,
             slot="merge-search", on_done=keep_search, show_partial=show_search_partial,
             label=f"Searching {param} of {len(models)} model(s) for {method}")
    found_search = st.session_state.get(SEARCH_KEY)
    if found_search is not None:
        from forgetlab.plots import forgetting_text

        best = found_search.best_point
        st.plotly_chart(search_figure(found_search), key="merge_search_chart")
        if best is not None:
            st.caption(f"best: point {best.index} — {found_search.param} "
                       + ", ".join(f"{m} {v:.3f}" for m, v in zip(found_search.models, best.values))
                       + f"; speciality {best.speciality:.4f}, forgetting {forgetting_text(best.forgetting, 4)} "
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
                          help="Writes the best recipe into merges/ (as 'Merge and evaluate' does) and scores it "
                               "beside the base and its parents; its scorecard appears above.")
                b2.button("Use the best weights in the form above", key="merge_search_use", on_click=use_best,
                          args=(best_form,), help="Then change what you like and press 'Merge and evaluate'.")
        show_table(found_search.to_frame(), key="merge_search_points")
