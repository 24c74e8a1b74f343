"""CLI: `forgetlab linearity` (non-linearity scores per level) and `forgetlab slwm-weights` (the weights
submodule-linearity merging would choose)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from forgetlab.commands import args as shared
from forgetlab.commands.io import emit, emit_estimate, emit_frame, tqdm_progress
from forgetlab.core.errors import parse_floats
from forgetlab.core.outputs import write_text_file


def register(sub) -> None:
    import forgetlab.merge.methods.slwm  # noqa: F401  (registers the `slwm` merge method for `forgetlab merge`)
    from forgetlab.analysis.linearity import DEFAULT_ALPHAS, DEFAULT_LEVELS
    from forgetlab.core.submodules import CAPTURES

    p = sub.add_parser("linearity", help="non-linearity scores (NLS) and d(α) curves per model/layer/attn/mlp/head",
                       description="Distance curves d(α) and non-linearity scores NLS = Σα |d(α) − (1 − α)| of a "
                                   "fine-tuned model and of each submodule, re-run on inputs captured once "
                                   "(docs/methods.md#submodule-levels).")
    shared.add_pool(p)
    p.add_argument("--task", required=True, help="task whose probe samples are used")
    p.add_argument("--model", help="fine-tuned model (default: the one named like the task)")
    p.add_argument("--levels", nargs="+", default=list(DEFAULT_LEVELS), choices=list(DEFAULT_LEVELS),
                   help="levels to score (default: all)")
    p.add_argument("--alphas", default=",".join(f"{a:g}" for a in DEFAULT_ALPHAS),
                   help="α grid, comma-separated (default 0,0.1,…,0.9)")
    shared.add_samples(p)
    p.add_argument("--capture", choices=list(CAPTURES), default="finetuned",
                   help="model whose forward pass gives the submodule inputs")
    shared.add_batch_size(p, default=8, help="probe samples per forward pass (default 8)")
    shared.add_device(p, help=shared.DEVICE_CPU_HELP)
    shared.add_dtype(p, what="the forward passes")
    shared.add_dry_run(p)
    shared.add_out(p, "CSV file for the per-submodule table (curves as 'd(α0);d(α1);…')")
    shared.add_out(p, "CSV file for the long d(α) table", flag="--curves")
    shared.add_no_save(p)
    p.set_defaults(func=cmd_linearity)

    p = sub.add_parser("slwm-weights", help="the per-submodule task weights of submodule-linearity merging",
                       description="Solve G a = b per submodule on the pool's probe data and print the weights "
                                   "(submodule × task). Merge with `forgetlab merge` and method slwm.")
    shared.add_pool(p)
    p.add_argument("--models", nargs="+", help="fine-tuned models (default: those named like the tasks)")
    p.add_argument("--tasks", nargs="+", help="task of each model (default: the task named like the model)")
    p.add_argument("--level", choices=["layer", "attn_mlp", "head_mlp"], default="attn_mlp")
    shared.add_samples(p)
    p.add_argument("--ridge", type=float, default=1e-4, help="ridge relative to tr(G)/T (default 1e-4)")
    shared.add_device(p, help=shared.DEVICE_CPU_HELP)
    shared.add_dry_run(p)
    shared.add_out(p, "CSV file")
    p.set_defaults(func=cmd_slwm_weights)


def write_csv(df: pd.DataFrame, out: str, overwrite: bool) -> Path:
    """Write a CSV atomically (forgetlab.core.outputs.write_text_file); an existing file only with `overwrite`."""
    path = write_text_file(out, df.to_csv(index=False), overwrite=overwrite)
    emit(f"wrote {path}")
    return path


def cmd_linearity(args) -> int:
    from forgetlab.analysis.linearity import nonlinearity_scores
    from forgetlab.core.memory import estimate, job_dtype
    from forgetlab.core.pool import ModelPool

    alphas = parse_floats(args.alphas, "--alphas")
    pool = ModelPool.from_yaml(args.pool)
    job = dict(model=args.model, levels=args.levels, samples=args.samples, batch_size=args.batch_size,
               device=args.device, dtype=job_dtype(args.dtype, args.device))
    if emit_estimate(estimate("linearity", pool=pool, task=args.task, **job), args.dry_run):
        return 0
    update, close = tqdm_progress(f"linearity {args.task}")
    try:
        result = nonlinearity_scores(pool, args.task, alphas=alphas, capture=args.capture, progress=update, **job)
    finally:
        close()
    flat = result.flat_frame()
    emit(f"{result.model} on {result.task}: {result.samples} samples, inputs from the {result.capture} model")
    emit_frame(result.by_level())
    note = result.unchanged_note()
    if note:
        emit(note)
    if args.out is not None:
        write_csv(flat, args.out, args.overwrite)
    else:
        emit_frame(flat.drop(columns=["curve", "curve_std"]))
    if args.curves:
        write_csv(result.curves_frame(), args.curves, args.overwrite)
    if not args.no_save:
        from forgetlab.analysis.linearity import save_linearity

        emit(f"saved run {save_linearity(result, pool=pool)}")
    return 0


def cmd_slwm_weights(args) -> int:
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.methods.slwm import slwm_weights

    pool = ModelPool.from_yaml(args.pool)
    from forgetlab.core.memory import estimate
    from forgetlab.merge.memory import estimate_slwm_weights  # noqa: F401  (registers the estimate)

    if emit_estimate(estimate("slwm_weights", pool=pool, models=args.models, device=args.device), args.dry_run):
        return 0
    update, close = tqdm_progress("slwm weights")
    try:
        w = slwm_weights(pool, args.tasks, models=args.models, level=args.level, samples=args.samples,
                         ridge=args.ridge, device=args.device, progress=update)
    finally:
        close()
    df = w.to_frame()
    if args.out is not None:
        write_csv(df, args.out, args.overwrite)
    else:
        emit_frame(df)
    return 0
