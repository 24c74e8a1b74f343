"""Forgetting: what does each post-hoc fix buy in speciality and cost in generality, over its setting?"""
from __future__ import annotations

from dataclasses import replace

import pandas as pd
import streamlit as st

from forgetlab.analysis import sweeps
from forgetlab.analysis.closed_form_sweeps import GRIDS
from forgetlab.core.errors import parse_floats
from forgetlab.plots.forgetting import curves_figure, tradeoff_figure
from forgetlab.ui.errors import show_errors
from forgetlab.ui.jobs import job_key, run_once
from forgetlab.ui.pool import require_finetuned, require_pool
from forgetlab.ui.settings import budget_caption, device_settings, eval_budget, workspace_home
from forgetlab.ui.memory import memory_check
from forgetlab.ui.jobs import partial_figure
from forgetlab.ui.measure import sweep_measures
from forgetlab.ui.glossary import explain, explain_group
from forgetlab.ui.navigation import page_header
from forgetlab.ui.tables import show_table
from forgetlab.ui.textview import alpha_point_link
from forgetlab.ui.choices import index_of

MENU = ("Forgetting", ":material/trending_down:", 30)    # its entry in the app's menu (forgetlab.ui.navigation)

page_header("Forgetting",
            "Pick a fine-tuned model and a post-hoc fix; each point of the sweep is a model between the base "
            "and the fine-tune. Speciality should stay up while the general-text loss stays down — the Pareto "
            "front marks the settings that no other setting beats on both.")

pool = require_pool()
require_finetuned(pool, "sweep")

KIND_LABELS = {"alpha": "WiSE-FT α / SLERP t curve", "pruning": "FAPM pruning curve (+ ablations)",
               "density": "DARE / TIES / DELLA / SCE density curve", "hma": "HMA grid (α per block)",
               **{k: g[2] for k, g in GRIDS.items()}}
RESULT_KEY = "forgetting_result"
DEFAULT_MODEL = "math"      # the README's examples sweep the demo zoo's math model


def _csv(values) -> str:
    return ", ".join(f"{v:g}" for v in values)


left, right = st.columns([1, 2])
with left:
    names = list(pool.model_names)
    model = st.selectbox("fine-tuned model", names, key="forgetting_model",
                         index=index_of(names, DEFAULT_MODEL))
    guess = sweeps.default_task(pool, model)
    task_options = ["(mean over tasks)", *pool.task_names]
    task_choice = st.selectbox("speciality task", task_options,
                               index=index_of(task_options, guess),
                               key=f"forgetting_task_{model}", help=explain("speciality"))
    task = None if task_choice == task_options[0] else task_choice
    measures = sweep_measures("forgetting", pool); measure = measures.measure
    kind = st.radio("sweep", list(KIND_LABELS), format_func=KIND_LABELS.get, key="forgetting_kind",
                    help=explain_group("sweeps"))
    extra: dict = {}
    with show_errors():
        if kind == "alpha":
            text = st.text_input("α values", _csv(sweeps.DEFAULT_ALPHAS), key="forgetting_alphas",
                                 help=explain("alpha"))
            series = st.multiselect("series", list(sweeps.ALPHA_METHODS), default=["wise-ft"],
                                    key="forgetting_alpha_methods",
                                    help="slerp: mergekit's SLERP of the base and the model at t = α")
            extra = {"alphas": parse_floats(text, "the α values"), "methods": series}
        elif kind == "pruning":
            text = st.text_input("pruning ratios", _csv(sweeps.DEFAULT_RATIOS), key="forgetting_ratios",
                                 help=explain("fapm") + "  \nratio: share of each tensor's task-vector entries zeroed.")
            scores = st.multiselect("scores", list(sweeps.PRUNING_SCORES), default=list(sweeps.PRUNING_SCORES),
                                    key="forgetting_scores",
                                    help="fapm: |τ| − mean|W0|·|τ|/|W0|; magnitude: |τ|; relative: −|τ|/|W0|")
            extra = {"ratios": parse_floats(text, "the pruning ratios"), "scores": scores}
        elif kind == "density":
            drops = st.text_input("DARE drop rates", _csv(sweeps.DEFAULT_DROPS), key="forgetting_drops",
                                  help=explain("dare"))
            keeps = st.text_input("TIES keep fractions (DELLA / SCE densities)", _csv(sweeps.DEFAULT_KEEPS),
                                  key="forgetting_keeps", help=explain("ties"))
            series = st.multiselect("series", list(sweeps.DENSITY_METHODS), default=list(sweeps.DEFAULT_DENSITY_METHODS),
                                    key="forgetting_density_methods",
                                    help="della: MAGPRUNE at each density; sce: SCE of this model and the pool's "
                                         "other fine-tuned models at select_topk = each density")
            seed = st.number_input("DARE / DELLA seed", 0, 2**31 - 1, 0, key="forgetting_seed")
            extra = {"drops": parse_floats(drops, "the drop rates"), "seed": int(seed),
                     "keeps": parse_floats(keeps, "the keep fractions"), "methods": series}
        elif kind in GRIDS:
            setting, default, _, label = GRIDS[kind]
            text = st.text_input(label, _csv(default), key=f"forgetting_{setting}")
            extra = {setting: parse_floats(text, f"the {label}")}
        else:
            text = st.text_area("α tuples (one per line)",
                                "\n".join(_csv(t) for t in sweeps.HMA_TRIPLES), key="forgetting_hma", height=160,
                                help=explain("hma") + "  \nOne line per point: the α of each block, first to last.")
            extra = {"grid": [parse_floats(line, "the α tuple") for line in text.splitlines() if line.strip()]}
    budget = eval_budget()
    max_general, max_task = budget.max_general, budget.max_task
    budget_caption(budget)
    device, dtype = device_settings()
    fits = memory_check("sweep", pool=pool, model=model, kind=kind, device=device, dtype=dtype, max_general=max_general,
                        max_task=max_task)
    run = st.button("Run sweep", type="primary", key="forgetting_run", disabled=not fits)

with right:
    settings = dict(task=task, device=device, dtype=dtype, max_general=max_general, max_task=max_task, **extra,
                    **measures.settings)
    key = job_key("forgetting", pool.key, str(workspace_home()), model, kind, settings)
    from forgetlab.ui.executor import session_executor
    executor = session_executor()
    start = False
    if run and extra:
        with show_errors():
            sweeps.check(kind, pool, model, **settings)
            start = True

    def work(progress):
        """The sweep, publishing a snapshot after each point, then saved (also if nobody is watching)."""
        result = sweeps.SWEEPS[kind](pool, model, progress=progress, **settings, executor=executor,
                                     on_point=lambda point, partial:
                                     progress.publish(replace(partial, points=list(partial.points))))
        return result, sweeps.save_sweep(result)

    def show_partial(partial) -> None:
        st.caption(f"{len(partial.points)} point(s) so far")
        st.plotly_chart(partial_figure(partial, tradeoff_figure, task=partial.task, measure=measure,
                                       general_measure=measures.general_measure),
                        key="forgetting_live")

    def keep(done) -> None:
        st.session_state[RESULT_KEY] = done[0]
        st.toast(f"Saved under {done[1]}")

    run_once(key, work, start=start, label=f"{KIND_LABELS[kind]} of {model}", slot="forgetting", on_done=keep,
             show_partial=show_partial)

    saved = sweeps.list_sweeps(model=model)
    current = st.session_state.get(RESULT_KEY)
    if current is not None and current.model != model:
        current = None
    if saved:
        labels = {r.id: f"{r.kind.removeprefix('sweep-')} · {r.id}" for r in saved}
        chosen = st.multiselect("saved sweeps of this model to show", list(labels), format_func=labels.get,
                                default=[] if current is not None else [saved[0].id], key=f"forgetting_saved_{model}")
    else:
        chosen = []
    results, ids = ([current], ["latest"]) if current is not None else ([], [])
    with show_errors():
        for r in saved:
            if r.id in chosen:
                loaded = sweeps.load_sweep(r.path)
                if current is None or loaded.recipe != current.recipe:
                    results.append(loaded)
                    ids.append(r.id[-6:])
    if not results:
        st.info("Run a sweep (left) or pick a saved one to see its curves.")
    else:
        for r in results:
            r.task = task if task is not None else r.task
        measures.apply(results)
        st.subheader("Speciality vs generality, every series", help=explain_group("tradeoff"))
        st.plotly_chart(tradeoff_figure(results, task=task, ids=ids), key="forgetting_tradeoff")
        for i, r in enumerate(results):
            st.subheader(f"{KIND_LABELS.get(r.kind, r.kind)} · {r.model}",
                         help=explain("speciality", "general_loss", "distance"))
            r.mark_pareto()
            event = st.plotly_chart(curves_figure(r), key=f"forgetting_curves_{i}", on_select="rerun",
                                    selection_mode="points")
            if r.kind == "alpha":
                alpha_point_link(r.model, event, key=f"forgetting_text_{i}")
        frame = pd.concat([r.to_frame() for r in results], ignore_index=True)
        show_table(frame, key="forgetting_table")
        st.download_button("Download table (CSV)", frame.to_csv(index=False), file_name=f"forgetting-{model}.csv",
                           mime="text/csv", key="forgetting_csv", on_click="ignore")
