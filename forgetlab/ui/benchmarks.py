"""The Models page's "Benchmarks (lm-evaluation-harness)" section: the table model × `task/metric` of the
latest saved benchmark run of the pool, and a button that runs the pool's named benchmarks
(`probes.benchmarks`) on every model as a background job, saved to Runs (kind "benchmarks").

`render_benchmarks(pool)` draws the whole section; `latest_benchmarks(pool)` finds the saved table (also used by
`forgetlab.ui.measure` to list the benchmark measures a pool offers).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import streamlit as st

from forgetlab.core.benchmarks import BenchmarkTable, benchmark_pool
from forgetlab.core.errors import WorkspaceError
from forgetlab.core.eval_memory import estimate_benchmarks
from forgetlab.core.memory import dtype_name, job_dtype
from forgetlab.core.workspace import load_run, runs_dir, save_run
from forgetlab.ui.jobs import job_key, run_once
from forgetlab.ui.memory import memory_check

if TYPE_CHECKING:  # pragma: no cover
    from forgetlab.core.benchmarks import BenchmarkTable
    from forgetlab.core.pool import ModelPool
    from forgetlab.core.workspace import SavedRun

KIND = "benchmarks"
DEFAULT_LIMIT = 20       # examples per task: 4 tasks × 7 models of the pico zoo in well under a minute on CPU
SLOT = "modelsbench"     # the job slot (and key prefix) of the section

SNIPPET = """probes:
  benchmarks:
    general: [arc_easy, hellaswag]     # lm-eval tasks that measure generality
    tasks: {math: [gsm8k]}             # per pool task: lm-eval tasks that measure its speciality
    include: lm_tasks/                 # optional: a folder of local task YAMLs (work offline)
    limit: 200                         # optional: examples per task"""


def pool_spec(pool: "ModelPool"):
    """The pool's BenchmarkSpec when it names at least one lm-eval task, else None."""
    spec = getattr(pool.probes, "benchmarks", None) if pool.probes is not None else None
    return spec if spec is not None and spec.all_tasks else None


def _pool_id(pool: "ModelPool") -> str:
    return str(pool.source or pool.name)


def latest_benchmarks(pool: "ModelPool") -> "tuple[BenchmarkTable, SavedRun] | None":
    """The newest saved benchmark run of this pool in the workspace (its table and the run), or None."""
    root = runs_dir()
    folders = [p for p in root.iterdir() if p.is_dir() and f"-{KIND}-" in p.name] if root.is_dir() else []
    runs = []
    for folder in folders:          # only this kind's folders are read (a workspace holds many sweeps)
        try:
            runs.append(load_run(folder))
        except WorkspaceError:
            continue
    for run in sorted(runs, key=lambda r: r.created, reverse=True):
        if run.kind != KIND or run.recipe.get("pool") != _pool_id(pool) or not isinstance(run.results, dict):
            continue
        try:
            return BenchmarkTable.from_dict(run.results), run
        except (AttributeError, TypeError, ValueError):
            continue
    return None


def benchmark_job(pool: "ModelPool", models: list[str], limit: int, device: str, dtype=None):
    """The job: run the pool's benchmarks on `models` (loaded one at a time in `dtype`, the sidebar's; None:
    the device's default), save the table to Runs with the dtype in its recipe; returns (table, run folder)."""
    def work(progress):
        spec = pool_spec(pool)
        dt = job_dtype(dtype, device)
        table = benchmark_pool(pool, models, spec, limit=limit, device=device, dtype=dt, progress=progress,
                               threads=1 if device == "cpu" else None)     # see benchmark_pool: 1 is faster
        recipe = {"pool": _pool_id(pool), "models": list(models), "tasks": table.tasks,
                  "general": list(spec.general), "task_benchmarks": {k: list(v) for k, v in spec.tasks.items()},
                  "include": table.include, "limit": table.limit, "device": device, "dtype": dtype_name(dt),
                  "threads": 1 if device == "cpu" else None, "evaluated": time.time()}
        path = save_run(KIND, recipe, table.to_dict(), frame=table.to_frame())
        return table, path

    return work


ACCURACY_NOTE = ("**acc** is lm-eval's multiple-choice accuracy: the share of items where the model gives the right "
                 "choice a higher log-likelihood than every wrong one (chance: one in the number of choices, 25 % on "
                 "the zoo's four-choice tasks; **acc_norm** per character of the choice). It asks a model to "
                 "*recognise* the answer, not to *write* it and stop, as the scorecards' exact match does: a base "
                 "that learned the sums from its text but not the task's prompt format gets accuracy without a "
                 "single exact match.")


def show_benchmark_table(table: "BenchmarkTable", *, key: str = "models_bench_table") -> None:
    """The table model × `task/metric` (the names a measure is written with), three decimals; a task on which
    every model scores the same (`BenchmarkTable.uniform_tasks`) is left out, and a caption says so."""
    frame = table.to_frame()
    flat = table.uniform_tasks()
    if flat:
        frame = frame[[c for c in frame.columns if c.partition("/")[0] not in flat]]
        first = next(iter(table.results.values()))
        st.caption("Left out: " + "; ".join(
            f"**{t}** ({', '.join(f'{m} {v:.3f}' for m, v in first[t].items())} for all {len(table.results)} models)"
            for t in flat) + " — a benchmark on which every model scores the same cannot tell them apart.")
    if len(frame.columns) > 1:
        st.dataframe(frame.style.format(precision=3, na_rep=""), hide_index=True, key=key, width="stretch")


def render_benchmarks(pool: "ModelPool", device: str = "cpu", dtype=None) -> None:
    """The whole section: heading, stored table (if any), limit + button, the job's progress and errors. The
    button's job loads the models in `dtype` (the sidebar's; None: the device's default)."""
    st.subheader("Benchmarks (lm-evaluation-harness)")
    spec = pool_spec(pool)
    if spec is None:
        st.info("This pool names no lm-eval benchmarks. Add them to its pool.yaml (standard lm-eval task names, "
                "or local task YAMLs in an include folder), then reload the pool:")
        st.code(SNIPPET, language="yaml")
        return
    groups = [f"general: {', '.join(spec.general)}"] if spec.general else []
    groups += [f"{t}: {', '.join(names)}" for t, names in spec.tasks.items()]
    st.caption("lm-eval tasks named by the pool — " + " · ".join(groups) + ". Each metric can be chosen as the "
               "speciality or generality measure (written TASK/METRIC). " + ACCURACY_NOTE)
    c1, c2 = st.columns([1, 2])
    limit = c1.number_input("examples per task (limit)", 1, 100_000, min(DEFAULT_LIMIT, spec.limit or DEFAULT_LIMIT),
                            key="models_bench_limit",
                            help=f"lm-eval's --limit: at most this many examples of each task (the pool's "
                                 f"pool.yaml says {spec.limit or 'all'}). Small limits are quick but noisy.")
    models = ["base", *pool.model_names]
    c2.write("")

    with c2:
        fits = memory_check(estimate_benchmarks, pool=pool, models=models, device=device, dtype=dtype)
    clicked = c2.button(f"Run benchmarks on all {len(models)} models", key="models_bench_run", disabled=not fits,
                        help="Runs in the background; the result is saved to Runs.")

    def keep(done) -> None:
        st.toast(f"Saved under {done[1]}")

    key = job_key(SLOT, pool.key, str(_pool_id(pool)), models, int(limit), device, dtype_name(job_dtype(dtype, device)))
    done = run_once(key, benchmark_job(pool, models, int(limit), device, dtype), start=clicked,
                    label="Running the benchmarks", slot=SLOT, on_done=keep)
    latest = latest_benchmarks(pool)
    if done is not None and (latest is None or str(latest[1].path) != str(done[1])):
        latest = (done[0], None)
    if latest is None:
        st.info("No benchmark results for this pool yet: press the button above.")
        return
    table, run = latest
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.created)) if run is not None else "just now"
    st.caption(f"Latest run ({when}, limit {table.limit or 'all'} per task, {table.seconds:.0f} s"
               + (f", saved as {run.id}" if run is not None else "") + ").")
    show_benchmark_table(table)
