"""CLI: `forgetlab finetune POOL.yaml --task NAME --optimizer adamw|mofo ...` — what-if fine-tunes."""
from __future__ import annotations

from forgetlab.commands import args as shared
from forgetlab.commands.executor_args import executor_from_args
from forgetlab.commands.io import emit, emit_estimate, emit_frame, tqdm_progress

FINAL = ["label", "optimizer", "steps", "speciality", "answer_loss", "general_loss", "forgetting", "distance",
         "pareto"]
TRAJ = ["label", "step", "general_loss", "exact_match", "answer_loss", "distance"]


def register(sub) -> None:
    """Add `forgetlab finetune` to the CLI."""
    p = sub.add_parser("finetune", help="fine-tune on a task (AdamW, MoFO, SFA, L1/L2) and record forgetting",
                       description="Fine-tune a pool member on a task's train pairs, recording generality, "
                                   "speciality and D(θ, θ0) every few steps; optionally compare AdamW, MoFO, "
                                   "SFA and L2 on the same data, or save the result as a new pool model.")
    shared.add_pool(p)
    p.add_argument("--task", required=True, help="the task to fine-tune on (its train split)")
    p.add_argument("--start", default="base", help="the pool model to start from (default: base)")
    p.add_argument("--optimizer", choices=["adamw", "mofo", "sgd"], default="adamw")
    p.add_argument("--fraction", type=float, default=0.2, help="MoFO update fraction (default 0.2)")
    p.add_argument("--steps", type=int, default=100)
    shared.add_batch_size(p, default=8, help="training batch size (default 8)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--warmup", type=int, default=0, help="linear warm-up steps before the cosine decay")
    p.add_argument("--schedule", choices=["cosine", "constant"], default="cosine")
    shared.add_seed(p, help="seed of the batch order, dropout and LoRA's initial weights")
    p.add_argument("--sfa-p", type=float, default=None, help="SFA: average with the start every ⌈p·T⌉ steps")
    p.add_argument("--sfa-beta", type=float, default=0.5, help="SFA: θ ← (1 − β)·θ + β·θo (default 0.5)")
    p.add_argument("--l1", type=float, default=0.0, help="L1-to-init penalty λ (loss + λ‖θ − θo‖₁); with --compare "
                   "the L1-to-init run's λ (default there 1e-3)")
    p.add_argument("--l2", type=float, default=0.0, help="L2-to-init penalty λ (loss + λ/2‖θ − θo‖²); with --compare "
                   "the L2-to-init run's λ (default there 1)")
    p.add_argument("--compare", action="store_true",
                   help="run AdamW, MoFO, SFA, L2- and L1-to-init with these steps/lr/seed instead of one run")
    p.add_argument("--eval-every", type=int, default=None, help="record every k steps (default: 10 records)")
    shared.add_eval_limits(p)
    p.add_argument("--max-train", type=int, default=None, help="at most this many training pairs")
    shared.add_device(p)
    shared.add_dtype(p, what="the weights, gradients and optimizer state")
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute each layer's activations in the backward pass instead of keeping them "
                        "(less memory, about a third more time)")
    shared.add_lora(p)
    shared.add_dry_run(p)
    p.add_argument("--save-as", default=None, help="save the fine-tuned model into the pool under this name")
    shared.add_out(p, "also write the trajectories to this CSV or JSON file")
    shared.add_no_save(p)
    shared.add_measure(p, when="at every record")
    shared.add_general_measure(p, when="at every record")
    shared.add_lm_eval(p)
    shared.add_executor(p)
    p.set_defaults(func=cmd_finetune)


def cmd_finetune(args) -> int:
    """Run one fine-tune or the comparison; print trajectories and finals; save the run and, with --save-as, the model."""
    from forgetlab.core.errors import ParameterError
    from forgetlab.core.pool import ModelPool
    from forgetlab.train.runs import (L1_DEFAULT, FinetuneComparison, FinetuneConfig, check_save_as, compare,
                                      finetune, save_finetune_run, save_finetuned, standard_configs)

    if args.executor != "local" and not args.compare:
        raise ParameterError("--executor ray runs the runs of --compare on workers (one run per worker); a single "
                             "fine-tune runs in process: add --compare or drop --executor.")
    from forgetlab.analysis.measures import check_general_measure, check_measure, measure_benchmarks

    pool = ModelPool.from_yaml(args.pool)
    if args.save_as is not None and not args.compare:
        check_save_as(pool, args.save_as)          # before training, not after
    measure, general = check_measure(args.measure), check_general_measure(args.general_measure)
    lora = dict(lora=args.lora or 0, lora_alpha=args.lora_alpha, lora_targets=args.lora_targets)
    if args.lora is None and (args.lora_alpha is not None or args.lora_targets is not None):
        raise ParameterError("--lora-alpha and --lora-targets apply only to a LoRA fine-tune: add --lora R (a rank "
                             "≥ 1, e.g. --lora 16), or leave them out for a full fine-tune.")
    if args.compare:
        configs = standard_configs(args.steps, args.lr, batch_size=args.batch_size, seed=args.seed,
                                   fraction=args.fraction, sfa_p=args.sfa_p or 0.25, sfa_beta=args.sfa_beta,
                                   l2=args.l2 or 1.0, l1=args.l1 or L1_DEFAULT, **lora)
    else:
        label = args.optimizer if args.optimizer != "mofo" else f"mofo-{args.fraction:g}"
        if args.sfa_p:
            label += f"+sfa-p{args.sfa_p:g}"
        if args.l1:
            label += f"+l1-{args.l1:g}"
        if args.l2:
            label += f"+l2-{args.l2:g}"
        if args.lora:
            label = f"lora{args.lora}-{label}"
        configs = [FinetuneConfig(label=label, optimizer=args.optimizer, steps=args.steps,
                                  batch_size=args.batch_size, lr=args.lr, weight_decay=args.weight_decay,
                                  fraction=args.fraction, warmup=args.warmup, schedule=args.schedule, seed=args.seed,
                                  sfa_p=args.sfa_p, sfa_beta=args.sfa_beta, l1=args.l1, l2=args.l2, **lora)]
    from forgetlab.core.memory import estimate

    est = estimate("finetune", pool=pool, task=args.task, configs=configs, start=args.start, device=args.device,
                   dtype=args.dtype, gradient_checkpointing=args.gradient_checkpointing, max_train=args.max_train)
    if emit_estimate(est, args.dry_run):
        return 0
    opts = dict(start=args.start, eval_every=args.eval_every, max_general=args.max_general,
                max_task=args.max_task, max_train=args.max_train, device=args.device, dtype=args.dtype,
                gradient_checkpointing=args.gradient_checkpointing,
                benchmarks=measure_benchmarks(pool, [measure, general], args.lm_eval_include, args.limit))
    update, close = tqdm_progress(f"finetune {args.task}")
    try:
        if args.compare:
            if args.save_as is not None:
                raise ParameterError("--save-as saves one run; drop --compare or --save-as.")
            comp = compare(pool, args.task, configs, progress=update, executor=executor_from_args(args),
                           measure=measure, general_measure=general, **opts)
            model = None
        else:
            cfg = configs[0]
            run, model = finetune(pool, args.task, cfg, progress=update, return_model=True, **opts)
            comp = FinetuneComparison(args.task, args.start, [run], {"task": args.task, "start": args.start,
                                                                     "configs": [cfg.to_dict()], "measure": measure,
                                                                     "general_measure": general})
            comp.mark_pareto(measure, general)
    finally:
        close()
    traj = comp.trajectories()
    shown = list(dict.fromkeys(m for m in (measure, general) if "/" in m))       # the benchmark measures
    emit(f"fine-tuning {args.start} on {args.task}: trajectories")
    emit_frame(traj[[c for c in TRAJ + shown if c in traj.columns]])
    named = [f"speciality: {measure}"] if measure != "exact_match" else []
    named += [f"generality: {general}"] if general != "general_loss" else []
    emit("final" + (f" ({'; '.join(named)})" if named else ""))
    final = comp.to_frame()
    emit_frame(final[FINAL + [m for m in shown if m in final.columns]])
    if args.out is not None:
        emit_frame(traj, args.out)
    if not args.no_save:
        emit(f"saved {save_finetune_run(comp)}")
    if args.save_as is not None and model is not None:
        emit(f"added {args.save_as} to the pool: {save_finetuned(pool, model, args.save_as, run=comp.runs[0])}")
    return 0
