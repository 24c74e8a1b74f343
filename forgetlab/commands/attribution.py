"""CLI: `forgetlab attribution POOL.yaml --model M --task T --level layer|module|head` — where the forgetting is:
per-submodule only-this and leave-one-out maps of a task vector (forgetlab.analysis.attribution)."""
from __future__ import annotations

from forgetlab.commands import args as shared
from forgetlab.commands.io import emit, emit_estimate, emit_frame, tqdm_progress
from forgetlab.core.errors import parse_floats

SHOWN = ["map", "key", "alpha", "d_general_loss", "d_speciality", "d_answer_loss", "tau_share", "zero_tau"]


def register(sub) -> None:
    """Add `forgetlab attribution` to the CLI."""
    p = sub.add_parser("attribution", help="per-submodule map: what each part of the task vector buys and costs",
                       description="For each submodule k: only-this (θ0 + τk, d against the base) and "
                                   "leave-one-out (θ0 + τ − τk, d against the fine-tune) of general loss, exact "
                                   "match and answer loss, with the additivity of the parts. One working copy "
                                   "of the model is rewritten in place.")
    shared.add_pool(p)
    p.add_argument("--model", required=True, help="the fine-tuned model (or LoRA adapter) of the pool")
    p.add_argument("--task", default=None, help="task whose exact match is the speciality (default: the task "
                                                "named in the model's name)")
    p.add_argument("--level", default="module", help="layer, module (attn/mlp/norm per layer; default) or head")
    p.add_argument("--select", nargs="+", default=None, help="only these submodule keys (e.g. 3.mlp 2 embed)")
    p.add_argument("--alphas", default=None, help="an α line per submodule instead of 0/1, e.g. 0,0.5,1")
    shared.add_eval_limits(p)
    shared.add_batch_size(p)
    shared.add_device(p)
    shared.add_dtype(p, what="the working copy and its forward passes")
    shared.add_dry_run(p)
    shared.add_out(p, "also write the map to this CSV or JSON file")
    shared.add_no_save(p)
    p.set_defaults(func=cmd_attribution)


def cmd_attribution(args) -> int:
    """Compute both maps, print them with the additivity table, write --out, save the run (unless --no-save)."""
    from forgetlab.analysis import attribution
    from forgetlab.core.memory import estimate, job_dtype
    from forgetlab.core.pool import ModelPool

    attribution.check_level(args.level)
    pool = ModelPool.from_yaml(args.pool)
    alphas = parse_floats(args.alphas, "--alphas") if args.alphas is not None else None
    dtype = job_dtype(args.dtype, args.device)
    if emit_estimate(estimate("attribution", pool=pool, model=args.model, task=args.task, level=args.level,
                              select=args.select, alphas=alphas, device=args.device, dtype=dtype,
                              batch_size=args.batch_size, max_general=args.max_general, max_task=args.max_task),
                     args.dry_run):
        return 0
    update, close = tqdm_progress(f"attribution {args.model} ({args.level})")
    try:
        result = attribution.attribute(pool, args.model, task=args.task, level=args.level, select=args.select,
                                       alphas=alphas, device=args.device, batch_size=args.batch_size,
                                       max_general=args.max_general, max_task=args.max_task, dtype=dtype,
                                       progress=update)
    finally:
        close()
    b, f = result.scores("base"), result.scores("finetuned")
    emit(f"attribution of {result.model} on {result.task} at the {result.level} level: {result.evaluations} "
         f"evaluations, {result.tensors_written} tensor writes in {result.seconds:.1f} s")
    emit(f"base: general loss {b['general_loss']:.4f}, exact match {b['speciality']:.4f}; fine-tune: general loss "
         f"{f['general_loss']:.4f}, exact match {f['speciality']:.4f}")
    for note in result.notes:
        emit(f"note: {note}")
    emit_frame(result.to_frame()[SHOWN])
    emit("additivity (sum of the parts against the whole):")
    emit_frame(result.additivity())
    if args.out is not None:
        emit_frame(result.to_frame(), args.out)
    if not args.no_save:
        emit(f"saved {attribution.save_attribution(result)}")
    return 0
