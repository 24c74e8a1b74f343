"""CLI: `forgetlab sweep alpha|pruning|density|hma POOL.yaml --model NAME ...` — forgetting curves."""
from __future__ import annotations

from forgetlab.analysis.measures import measure_benchmarks
from forgetlab.commands import args as shared
from forgetlab.commands.executor_args import device_from_args, executor_from_args, executor_lines
from forgetlab.commands.io import emit, emit_frame, tqdm_progress
from forgetlab.core.errors import parse_floats

SHOWN = ["series", "x", "speciality", "answer_loss", "general_loss", "distance", "pareto"]


def _common(p) -> None:
    shared.add_pool(p)
    p.add_argument("--model", required=True, help="the fine-tuned model of the pool to sweep")
    p.add_argument("--task", default=None, help="task whose exact match is the speciality (default: the task "
                                                "named in the model's name, else the mean over tasks)")
    p.add_argument("--tasks", nargs="*", default=None, help="tasks to evaluate (default: all)")
    shared.add_eval_limits(p)
    shared.add_measure(p)
    shared.add_general_measure(p)
    shared.add_lm_eval(p)
    shared.add_batch_size(p)
    shared.add_device(p)
    shared.add_out(p, "also write the table to this CSV or JSON file")
    shared.add_no_save(p)
    shared.add_executor(p)
    shared.add_device_map(p)
    shared.add_dtype(p, what="the working copy (θ0 + f(τ) is computed in float32)")
    shared.add_dry_run(p)


def register(sub) -> None:
    """Add `forgetlab sweep alpha|pruning|density|hma` to the CLI."""
    p = sub.add_parser("sweep", help="forgetting curves: WiSE-FT α (and SLERP t), FAPM pruning, DARE/TIES/DELLA/SCE density, HMA grid",
                       description="Evaluate generality and speciality along a post-hoc fix's setting, with "
                                   "D(θ, θ0) and the Pareto front. One working copy of the model is rewritten "
                                   "in place per point.")
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)

    k = kinds.add_parser("alpha", help="WiSE-FT θ(α) = (1 − α)·θ0 + α·θ1")
    _common(k)
    k.add_argument("--alphas", default="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1",
                   help="α grid, comma separated (default 0,0.1,…,1)")
    k.add_argument("--methods", nargs="+", default=["wise-ft"],
                   help="series: wise-ft slerp (SLERP of θ0 and θ1 at t = α, mergekit's)")
    k.set_defaults(func=cmd_sweep)

    k = kinds.add_parser("pruning", help="FAPM pruning ratios, with magnitude/relative ablations")
    _common(k)
    k.add_argument("--ratios", default="0,0.2,0.4,0.6,0.8,0.9,0.95,0.99,1", help="pruning ratios (zeroed share)")
    k.add_argument("--scores", nargs="+", default=["fapm", "magnitude", "relative"],
                   help="series: fapm magnitude relative")
    k.set_defaults(func=cmd_sweep)

    k = kinds.add_parser("density", help="DARE drop rates, TIES keep fractions, DELLA and SCE densities against density")
    _common(k)
    k.add_argument("--drops", default="0,0.5,0.7,0.9,0.95,0.99", help="DARE drop rates p")
    k.add_argument("--keeps", default="1,0.5,0.3,0.2,0.1,0.05,0.01",
                   help="TIES keep fractions (also DELLA's densities and SCE's select_topk)")
    k.add_argument("--methods", nargs="+", default=["dare", "ties"],
                   help="dare ties della sce (sce merges the model with the pool's other fine-tuned models)")
    shared.add_seed(k, help="DARE and DELLA seed")
    k.set_defaults(func=cmd_sweep)

    k = kinds.add_parser("hma", help="HMA: one α per block of layers, over a grid of α tuples")
    _common(k)
    k.add_argument("--grid", nargs="+", default=None,
                   help="α tuples like 0.1,0.2,0.3 (default: the MoFO rebuttal's 15 triples)")
    k.set_defaults(func=cmd_sweep)

    from forgetlab.analysis.closed_form_sweeps import GRIDS

    for kind, (setting, default, label, help_) in GRIDS.items():   # the closed-form curves (issue 26)
        k = kinds.add_parser(kind, help=label)
        _common(k)
        k.add_argument(f"--{setting.replace('_', '-')}", dest=setting, default=",".join(f"{v:g}" for v in default),
                       help=f"{help_}, comma separated")
        k.set_defaults(func=cmd_sweep)


def cmd_sweep(args) -> int:
    """Run one sweep, print its table, save it under runs/ (unless --no-save)."""
    from forgetlab.analysis import measures, sweeps
    from forgetlab.commands.io import emit_estimate
    from forgetlab.core.memory import estimate, job_dtype
    from forgetlab.core.pool import ModelPool

    measure = measures.check_measure(args.measure)
    general_measure = measures.check_general_measure(args.general_measure)
    pool = ModelPool.from_yaml(args.pool)
    device = device_from_args(args)
    dtype = job_dtype(args.dtype, device if isinstance(device, str) else None)
    common = dict(task=args.task, tasks=args.tasks, max_general=args.max_general, max_task=args.max_task,
                  batch_size=args.batch_size, device=device, executor=executor_from_args(args),
                  dtype=dtype,
                  benchmarks=measure_benchmarks(pool, [measure, general_measure], args.lm_eval_include, args.limit))
    if args.kind == "alpha":
        extra = dict(alphas=parse_floats(args.alphas, "--alphas"), methods=args.methods)
    elif args.kind == "pruning":
        extra = dict(ratios=parse_floats(args.ratios, "--ratios"), scores=args.scores)
    elif args.kind == "density":
        extra = dict(drops=parse_floats(args.drops, "--drops"), keeps=parse_floats(args.keeps, "--keeps"),
                     methods=args.methods, seed=args.seed)
    elif args.kind == "hma":
        extra = dict(grid=[parse_floats(t, "--grid") for t in args.grid] if args.grid else sweeps.HMA_TRIPLES)
    else:
        from forgetlab.analysis.closed_form_sweeps import GRIDS

        setting = GRIDS[args.kind][0]
        extra = {setting: parse_floats(getattr(args, setting), "--" + setting.replace("_", "-"))}
    # a device map spreads the copy over devices and disk by design: its estimate is shown, never enforced
    if (isinstance(device, str) or args.dry_run) and emit_estimate(
            estimate("sweep", pool=pool, model=args.model, kind=args.kind, device=device, dtype=dtype, batch_size=args.batch_size,
                     max_general=args.max_general, max_task=args.max_task),
            args.dry_run):
        return 0
    update, close = tqdm_progress(f"sweep {args.kind} {args.model}")
    try:
        result = sweeps.SWEEPS[args.kind](pool, args.model, progress=update, **common, **extra)
    finally:
        close()
    result.measure, result.general_measure = measure, general_measure
    result.mark_pareto()
    frame = result.to_frame()
    speciality = (measure if measures.is_benchmark(measure)
                  else f"{result.task or 'mean over tasks'} {measures.measure_label(measure)}")
    emit(f"{args.kind} sweep of {args.model} (speciality: {speciality}; generality: "
         f"{measures.measure_label(general_measure)}; x = {result.x_name}; {len(result.points)} points in "
         f"{result.seconds:.1f} s)")
    for line in executor_lines(result.executor, result.points):
        emit(line)
    for f in result.failed:
        emit(f"FAILED {f['series']} {result.x_name}={f['x']:g}: {f['error']}")
    shown = SHOWN + (["generality"] if general_measure != "general_loss" else [])
    emit_frame(frame[shown])
    if args.out is not None:
        emit_frame(frame, args.out)
    if not args.no_save:
        emit(f"saved {sweeps.save_sweep(result)}")
    return 1 if result.failed else 0
