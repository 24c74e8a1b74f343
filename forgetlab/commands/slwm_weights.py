"""CLI: `forgetlab slwm-weights` (the weights submodule-linearity merging would choose)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from forgetlab.commands import args as shared
from forgetlab.commands.io import emit, emit_estimate, emit_frame, tqdm_progress
from forgetlab.core.errors import parse_floats
from forgetlab.core.outputs import write_text_file


def register(sub) -> None:
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


def cmd_slwm_weights(args) -> int:
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.methods.slwm import slwm_weights

    pool = ModelPool.from_yaml(args.pool)
    from forgetlab.core.memory import with_free
    from forgetlab.merge.memory import estimate_slwm_weights

    if emit_estimate(with_free(estimate_slwm_weights(pool, models=args.models, device=args.device)), args.dry_run):
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
