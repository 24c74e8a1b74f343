"""CLI: `forgetlab features` — a submodule's features across tasks and models, mapped with t-SNE."""
from __future__ import annotations

from forgetlab.commands import args as shared
from forgetlab.commands.io import emit, emit_estimate, emit_frame, tqdm_progress


def register(sub) -> None:
    from forgetlab.analysis.features import BACKENDS, FEATURE_LEVELS, POOLINGS

    p = sub.add_parser("features", help="t-SNE map of a submodule's features across tasks and models",
                       description="Capture a submodule's output on each task's probe samples for each model, "
                                   "pool it (answer tokens or last token), reduce with PCA to 50 dimensions, map "
                                   "with t-SNE, and report the distances between task clusters.")
    shared.add_pool(p)
    p.add_argument("--models", nargs="+", help="models (default: base and every fine-tuned model)")
    p.add_argument("--tasks", nargs="+", help="tasks (default: all)")
    p.add_argument("--level", choices=list(FEATURE_LEVELS), default="layer", help="submodule (default layer)")
    p.add_argument("--layer", type=int, default=-1, help="layer index (negative counts from the end; default -1)")
    p.add_argument("--head", type=int, help="head index, for --level head")
    p.add_argument("--pooling", choices=list(POOLINGS), default="answer")
    shared.add_samples(p, default=None)
    p.add_argument("--perplexity", type=float, default=30.0)
    p.add_argument("--pca-dims", type=int, default=50)
    shared.add_seed(p, help="seed of PCA and t-SNE", maximum=shared.NUMPY_SEED_MAX)
    p.add_argument("--backend", choices=list(BACKENDS), default="auto")
    shared.add_device(p, help=shared.DEVICE_CPU_HELP)
    shared.add_dtype(p, what="the models' forward passes (the pooled features, PCA and t-SNE are float32)")
    shared.add_dry_run(p)
    shared.add_out(p, "CSV file for the coordinates (x, y, task, model, sample)")
    shared.add_out(p, "CSV file for the task-cluster distances", flag="--distances")
    p.set_defaults(func=cmd_features)


def cmd_features(args) -> int:
    """Estimate the peak (stop there with --dry-run), capture the features, map them, print the distances."""
    from forgetlab.analysis.features import capture_features, check_tsne, embed_tsne
    from forgetlab.commands.io import write_csv
    from forgetlab.core.memory import estimate, job_dtype
    from forgetlab.core.pool import ModelPool
    from forgetlab.core.progress import scaled

    check_tsne(args.perplexity, args.seed, args.pca_dims)   # before the features are captured, not after
    pool = ModelPool.from_yaml(args.pool)
    dtype = job_dtype(args.dtype, args.device)
    if emit_estimate(estimate("features", pool=pool, tasks=args.tasks, models=args.models, level=args.level,
                              samples=args.samples, device=args.device, dtype=dtype), args.dry_run):
        return 0
    update, close = tqdm_progress("features")
    try:
        fs = capture_features(pool, args.tasks, args.models, level=args.level, layer=args.layer, head=args.head,
                              pooling=args.pooling, samples=args.samples, device=args.device, dtype=dtype,
                              progress=scaled(update, 0, 0.6))
        result = embed_tsne(fs, perplexity=args.perplexity, seed=args.seed, pca_dims=args.pca_dims,
                            backend=args.backend, progress=scaled(update, 0.6, 1.0))
    finally:
        close()
    emit(f"{len(fs)} points, t-SNE by {result.backend} (perplexity {result.perplexity:g}, PCA {result.pca_dims} dims)")
    emit("average distance between task clusters:")
    emit_frame(result.cluster_summary())
    if args.out is not None:
        write_csv(result.coords, args.out, args.overwrite)
    if args.distances:
        write_csv(result.distances, args.distances, args.overwrite)
    return 0
