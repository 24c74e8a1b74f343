"""CLI: `forgetlab textdiff POOL --model M [--against REF] [--text FILE | --split heldout] --out tokens.csv` —
where forgetting shows in text: every token scored under two models (forgetlab.analysis.textdiff)."""
from __future__ import annotations

from forgetlab.commands import args as shared
from forgetlab.commands.io import emit, emit_estimate, emit_frame, tqdm_progress
from forgetlab.core.evaluate import GENERAL_LOSS_MODES

T_LENS_BLOCKS = 64      # forgetlab.analysis.textdiff.LENS_BLOCKS (not imported here: torch loads late)
SHOWN_CONTEXTS = ["where", "position", "context", "rise", "kl", "top1_base", "top1_model"]


def register(sub) -> None:
    """Add `forgetlab textdiff` to the CLI."""
    p = sub.add_parser("textdiff", help="token-level view of forgetting: every token scored under two models",
                       description="Score every token of a text under a model and a reference (the base by "
                                   "default): logp under both, rise = logp_base − logp_model (nats lost), "
                                   "KL(p_base ‖ p_model) over the vocabulary and both models' top-3 predictions. "
                                   "Prints the rise per token class, the logit lens per layer and the contexts with "
                                   "the largest rise and KL. With the held-out split (the default) the blocks are "
                                   "the scorecard's, so the mean rise is the scorecard's general-loss rise.")
    shared.add_pool(p)
    p.add_argument("--model", required=True,
                   help="a model of the pool, a merge under the workspace's merges/, or a model folder")
    p.add_argument("--alpha", type=float, default=None,
                   help="score the WiSE-FT point θ0 + α(θ1 − θ0) of --model (a fine-tuned model of the pool)")
    p.add_argument("--against", default="base",
                   help="the reference: base (default), a model of the pool, a merge or a model folder")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, metavar="FILE",
                     help="score each line of this UTF-8 file (a line longer than the context is split)")
    src.add_argument("--split", choices=["heldout"], default=None,
                     help="score the pool's held-out general text in the scorecard's blocks (the default)")
    shared.add_max_general(p)
    p.add_argument("--general-loss", choices=GENERAL_LOSS_MODES, default="blocks",
                   help="held-out blocks as the scorecard cuts them: blocks (default) or documents")
    shared.add_batch_size(p, help="sequences per forward pass")
    shared.add_device(p, help=shared.DEVICE_CPU_HELP)
    shared.add_dtype(p, what="both models and their forward passes")
    shared.add_dry_run(p)
    p.add_argument("--no-lens", action="store_true", help="skip the per-layer logit lens")
    p.add_argument("--lens-blocks", type=int, default=T_LENS_BLOCKS,
                   help=f"read the logit lens on the first N sequences (default {T_LENS_BLOCKS}; it costs a pass "
                        "through the head per layer and model)")
    p.add_argument("--top", type=int, default=10, help="contexts shown per table (default 10)")
    shared.add_out(p, "write the token table to this CSV (or JSON) file")
    shared.add_no_save(p)
    p.set_defaults(func=cmd_textdiff)


def cmd_textdiff(args) -> int:
    """Check everything, estimate the peak (stop there with --dry-run), score the text, print the summaries, write
    --out, save the run (unless --no-save)."""
    from forgetlab.analysis import textdiff as T
    from forgetlab.core.errors import ParameterError
    from forgetlab.core.memory import estimate, job_dtype
    from forgetlab.core.pool import ModelPool

    if args.top < 1:
        raise ParameterError(f"--top must be at least 1; got {args.top}.")
    pool = ModelPool.from_yaml(args.pool)
    kw = dict(against=args.against, alpha=args.alpha, text=args.text, split=args.split,
              max_general=args.max_general, general_mode=args.general_loss, batch_size=args.batch_size)
    T.check(pool, args.model, **kw)
    dtype = job_dtype(args.dtype, args.device)
    run = dict(device=args.device, dtype=dtype, lens=not args.no_lens, **kw)
    if emit_estimate(estimate("textdiff", pool=pool, model=args.model, **run), args.dry_run):
        return 0
    update, close = tqdm_progress(f"textdiff {args.model}")
    try:
        result = T.textdiff(pool, args.model, lens_blocks=args.lens_blocks, progress=update, **run)
    finally:
        close()
    s = result.summary()
    emit(f"textdiff of {result.model} against {result.against} on {result.source}: {s['tokens']} tokens in "
         f"{len(result.docs)} sequences, {result.seconds:.1f} s")
    emit(f"loss {s['loss_base']:.4f} → {s['loss_model']:.4f}: mean rise {s['mean_rise']:.4f} nats, mean KL "
         f"{s['mean_kl']:.4f} nats")
    for note in result.notes:
        emit(f"note: {note}")
    emit("rise per token class:")
    emit_frame(result.by_class())
    if result.lens:
        emit(f"logit lens (next-token loss read after each layer on {result.lens[0]['tokens']} tokens; depth 0 = "
             "embeddings):")
        emit_frame(result.lens_frame())
    for by in ("rise", "kl"):
        emit(f"contexts with the largest {by}:")
        emit_frame(result.top_contexts(by, args.top)[SHOWN_CONTEXTS])
    if args.out is not None:
        emit_frame(result.to_frame(), args.out)
    if not args.no_save:
        emit(f"saved {T.save_textdiff(result)}")
    return 0
