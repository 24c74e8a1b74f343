"""CLI: `forgetlab search RECIPE.yaml --pool POOL.yaml [--budget N] [--objective …] [--executor ray]` — CMA-ES
over a merge method's per-model weights (and optionally per-block α), on the pool's probe split."""
from __future__ import annotations

from forgetlab.commands import args as shared
from forgetlab.commands.executor_args import executor_from_args
from forgetlab.commands.io import emit, emit_estimate, emit_frame, tqdm_progress
from forgetlab.executors import executor_lines
from forgetlab.analysis.measures import measure_benchmarks
from forgetlab.core.errors import parse_floats


def register(sub) -> None:
    """Add `forgetlab search` to the CLI."""
    p = sub.add_parser("search", help="merge search: CMA-ES over per-model weights (and HMA block α) maximising "
                                      "speciality while bounding forgetting",
                       description="Evaluate merges of a recipe's models on the pool's probe split, searching the "
                                   "method's per-model weights with CMA-ES; prints every point, the Pareto front "
                                   "and the best recipe, and saves the run.")
    p.add_argument("recipe", help="a merge recipe (forgetlab or mergekit YAML); its weights are the start")
    shared.add_pool(p, flag=True, help="pool.yaml whose probe split (tasks + general text) judges merges")
    p.add_argument("--budget", type=int, default=30, help="candidate evaluations, the start included (default 30)")
    p.add_argument("--objective", choices=["constrained", "weighted"], default="constrained",
                   help="constrained: best speciality with forgetting ≤ --max-forgetting (default); weighted: "
                        "speciality − W·forgetting")
    p.add_argument("--max-forgetting", type=float, default=0.05,
                   help="bound on forgetting = general loss − the base's, in nats (default 0.05)")
    p.add_argument("--forgetting-weight", type=float, default=1.0, help="W of the weighted objective (default 1)")
    shared.add_measure(p, when="on every candidate")
    shared.add_lm_eval(p)
    p.add_argument("--task", default=None, help="task of the speciality (default: the mean over the pool's tasks)")
    p.add_argument("--param", default=None, help="per-model parameter to search (default: the method's first, "
                                                 "e.g. weights, or lam for pcb)")
    p.add_argument("--bounds", default="0,2", help="LOW,HIGH of the per-model values (default 0,2)")
    p.add_argument("--hma-blocks", type=int, default=0,
                   help="also search one α ∈ [0, 1] per block of layers scaling the merged task vector (HMA)")
    p.add_argument("--sigma0", type=float, default=0.3, help="CMA-ES initial step size (default 0.3)")
    p.add_argument("--popsize", type=int, default=None, help="CMA-ES population (default: cma's 4 + 3 ln n)")
    shared.add_seed(p, help="CMA-ES seed", maximum=shared.NUMPY_SEED_MAX - 1)   # CMA-ES is seeded with seed + 1
    shared.add_eval_limits(p, pairs="probe")
    shared.add_batch_size(p)
    shared.add_device(p)
    shared.add_dtype(p, what="each worker's working copy (the merges are computed in float32 per tensor)")
    shared.add_dry_run(p)
    shared.add_out(p, "also write the table of points to this CSV or JSON file")
    p.add_argument("--save-recipe", metavar="FILE.yaml", help="write the best recipe to this YAML file")
    shared.add_no_save(p)
    shared.add_executor(p)
    p.set_defaults(func=cmd_search)


def cmd_search(args) -> int:
    """Check the settings, estimate a worker's peak (stop there with --dry-run), run the search, print every point
    and the best recipe, save the run."""
    import yaml

    from forgetlab.analysis.search import check_search, save_search, search
    from forgetlab.core.memory import estimate, job_dtype
    from forgetlab.core.outputs import write_text_file
    from forgetlab.core.pool import ModelPool

    bounds = parse_floats(args.bounds, "--bounds")
    if len(bounds) != 2:
        from forgetlab.core.errors import ParameterError
        raise ParameterError(f"--bounds takes LOW,HIGH; got {args.bounds!r}.")
    executor = executor_from_args(args)
    pool = ModelPool.from_yaml(args.pool)
    benchmarks = measure_benchmarks(pool, [args.measure], args.lm_eval_include, args.limit)
    check_search(args.recipe, pool, budget=args.budget, objective=args.objective, measure=args.measure,
                 task=args.task, param=args.param, bounds=tuple(bounds), hma_blocks=args.hma_blocks,
                 benchmarks=benchmarks)
    dtype = job_dtype(args.dtype, args.device)
    if emit_estimate(estimate("search", recipe=args.recipe, pool=pool, device=args.device, dtype=dtype,
                              batch_size=args.batch_size, max_general=args.max_general, max_task=args.max_task),
                     args.dry_run):
        return 0
    update, close = tqdm_progress("search")
    try:
        res = search(args.recipe, pool, budget=args.budget, objective=args.objective,
                     max_forgetting=args.max_forgetting, forgetting_weight=args.forgetting_weight,
                     measure=args.measure, task=args.task, param=args.param, bounds=tuple(bounds),
                     hma_blocks=args.hma_blocks, sigma0=args.sigma0, popsize=args.popsize, seed=args.seed,
                     device=args.device, dtype=dtype, batch_size=args.batch_size, max_general=args.max_general,
                     max_task=args.max_task, executor=executor, progress=update, benchmarks=benchmarks)
    finally:
        close()
    emit(f"{res.method} search over {', '.join(res.scalar_names) or res.param or 'block α'} of {', '.join(res.models)}: {len(res.points)} points in "
         f"{res.seconds:.1f} s (objective {res.objective}; base general loss {res.base_general_loss:.4f}, "
         f"base speciality {res.base_speciality:.4f})")
    for line in executor_lines(res.executor, res.points):
        emit(line)
    frame = res.to_frame()
    emit_frame(frame.drop(columns=["executor", "worker_host", "error"]))
    best = res.best_point
    if best is None:
        emit("no point could be evaluated")
        return 1
    emit(f"best: point {best.index} — speciality {best.speciality:.4f}, forgetting {best.forgetting:+.4f}"
         f"{'' if res.objective != 'constrained' or best.forgetting <= res.max_forgetting else ' (no point met the bound)'}")
    text = yaml.safe_dump(res.best_recipe, sort_keys=False)
    emit(text.rstrip("\n"))
    if args.out is not None:
        emit_frame(frame, args.out)
    if args.save_recipe:
        emit(f"wrote {write_text_file(args.save_recipe, text, overwrite=args.overwrite)}")
    if not args.no_save:
        emit(f"saved {save_search(res)}")
    return 0
