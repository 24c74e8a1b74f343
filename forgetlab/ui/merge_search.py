"""The Merge page's "Search merge weights (CMA-ES)" section: the merge search (`forgetlab.analysis.search`) over the
per-model weights of the merge composed in the form, drawn through the analysis panel (forgetlab.ui.panel: the
memory line, the button, the background job on the session's executor with its points drawn as they arrive, the
saved run, the saved searches to reopen); the best recipe can be put into the form or merged at once."""
from __future__ import annotations

import time
from typing import Optional

import streamlit as st

from forgetlab.analysis.search import ANALYSIS, SEARCH_MEASURES, SearchSettings, search_scalars, searchable_param
from forgetlab.analysis.search_results import SearchResult
from forgetlab.core.errors import ForgetlabError
from forgetlab.core.memory import dtype_name
from forgetlab.merge.workflow import merge_folder_name, pool_recipe, recipe_form
from forgetlab.plots import forgetting_text
from forgetlab.plots.merge import search_figure
from forgetlab.ui.errors import show_errors
from forgetlab.ui.jobs import partial_figure
from forgetlab.ui.merge_form import preset_form
from forgetlab.ui.panel import AnalysisPanel
from forgetlab.ui.tables import show_table
from forgetlab.ui.widgets import field_widget

PAGE = "merge_search"                          # the panel's state keys and job slot
MERGE_BEST_KEY = "merge_search_merge_best"    # set by 'Merge the best': the form, preset, is merged on that run


def search_settings(pool, method: str, models: list[str], params: dict, *, out_dtype, measure: str,
                    bench_settings: dict, device, max_general: int, max_task: int, dtype=None) -> SearchSettings:
    """The settings of a search of the merge composed in the form (its recipe as YAML; None when the form's
    merge cannot be made, which the search's check then says), drawing the search's own widgets: budget,
    objective and forgetting bound."""
    c1, c2, c3 = st.columns(3)
    budget = field_widget(SearchSettings, "budget", key="merge_search_budget", high=500, container=c1,
                          label="evaluations (budget)", help="merges evaluated, the start included (about 0.5 s "
                                                             "each on the pico zoo)")
    objective = field_widget(SearchSettings, "objective", key="merge_search_objective", container=c2)
    bound = field_widget(SearchSettings, "max_forgetting", key="merge_search_bound", container=c3, high=10.0,
                         disabled=objective != "constrained")
    try:
        recipe = pool_recipe(pool, method, models, params, dtype=out_dtype).to_yaml() if models else None
    except ForgetlabError:      # said when the button is pressed (the search's check)
        recipe = None
    bench = bench_settings.get("benchmarks")
    return SearchSettings(recipe=recipe, budget=budget, objective=objective, max_forgetting=float(bound),
                          measure=measure if measure in SEARCH_MEASURES or bench is not None else "exact_match",
                          limit=bench.limit if bench is not None else None, max_general=int(max_general),
                          max_task=int(max_task), device=device, dtype=dtype_name(dtype) if dtype is not None else None)


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
    panel = AnalysisPanel(ANALYSIS, page=PAGE, button="Search weights",
                          label=lambda s: f"Searching {', '.join(scalars) or param} of {len(models)} model(s) for "
                                          f"{method}")
    settings = search_settings(pool, method, models, params, out_dtype=out_dtype, measure=measure,
                               bench_settings=bench_settings, device=device, max_general=max_general,
                               max_task=max_task, dtype=dtype)
    start = panel.controls(pool, settings, disabled=(param is None and not scalars) or not models,
                           help=None if param or scalars else f"{method} has no per-model weight to search; pick "
                                                              "another method.")

    def show_partial(partial: SearchResult) -> None:
        st.caption(f"{len(partial.points)} of {settings.budget} point(s) so far")
        st.plotly_chart(partial_figure(partial, search_figure), key="merge_search_live")
        show_table(partial.to_frame(), key="merge_search_live_points")     # with the worker of each point

    panel.results(pool, settings, start=start, show=lambda found: show_search(pool, found),
                  show_partial=show_partial,
                  empty="Press **Search weights** to search the merge composed above; every point is drawn as it "
                        "arrives.")


def use_best(form, merge: bool = False) -> None:
    """Put the best recipe (`recipe_form`) into the form above and, with `merge`, merge it at once under a new
    name (a callback: it runs before the widgets are drawn)."""
    preset_form(*form)
    if merge:
        st.session_state[f"merge_name_{form[0]}"] = merge_folder_name(form[0], ["search-best"],
                                                                      time.strftime('%m%d-%H%M%S'))
        st.session_state[MERGE_BEST_KEY] = True


def best_caption(found: SearchResult) -> Optional[str]:
    """What the best point is: its values, speciality and forgetting (and that no point met the bound), how many
    points in how long on which executor; None when no point could be evaluated."""
    best = found.best_point
    if best is None:
        return None
    missed = found.objective == "constrained" and best.forgetting > found.max_forgetting
    return (f"best: point {best.index} — {found.param} "
            + ", ".join(f"{m} {v:.3f}" for m, v in zip(found.models, best.values))
            + f"; speciality {best.speciality:.4f}, forgetting {forgetting_text(best.forgetting, 4)} "
            + ("(no point met the forgetting bound: this is the one that forgot least) " if missed else "")
            + f"({len(found.points)} points in {found.seconds:.1f} s, {found.executor.get('name', 'local')} "
              "executor)")


def show_search(pool, found: SearchResult) -> None:
    """The search's chart, its best point with the buttons that merge it or put it into the form (a recipe of
    `pool`'s models), its points."""
    st.plotly_chart(search_figure(found), key="merge_search_chart")
    caption = best_caption(found)
    if caption is not None:
        st.caption(caption)
        with show_errors():
            best_form = recipe_form(pool, found.best_recipe)
            b1, b2 = st.columns(2)
            b1.button("Merge the best and evaluate", type="primary", key="merge_search_merge_best",
                      on_click=use_best, args=(best_form, True),
                      help="Writes the best recipe into merges/ (as 'Merge and evaluate' does) and scores it "
                           "beside the base and its parents; its scorecard appears above.")
            b2.button("Use the best weights in the form above", key="merge_search_use", on_click=use_best,
                      args=(best_form,), help="Then change what you like and press 'Merge and evaluate'.")
    show_table(found.to_frame(), key="merge_search_points")
