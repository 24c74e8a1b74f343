"""CLI: `forgetlab inspect`, `forgetlab eval` — checkpoints and scorecards (`forgetlab taskvec`: the task-vector
analysis, forgetlab.analysis.taskvec)."""
from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd

from forgetlab.commands import args as shared
from forgetlab.commands.executor_args import device_from_args, load_placed
from forgetlab.commands.io import emit, emit_estimate, emit_frame, tqdm_progress
from forgetlab.core.anatomy import Anatomy
from forgetlab.core.benchmarks import BenchmarkSpec, check_limit, checked_manager, parse_tasks
from forgetlab.core.checkpoints import LoraCheckpoint, config_mismatch, open_checkpoint
from forgetlab.core.errors import ForgetlabError, IncompatibleModelsError
from forgetlab.core.eval_memory import estimate_eval
from forgetlab.core.evaluate import (GENERAL_LOSS_HELP, GENERAL_LOSS_MODES, evaluate, scorecards_frame,
                                     scorecards_takeaway)
from forgetlab.core.memory import job_dtype, with_free
from forgetlab.core.outputs import write_text_file
from forgetlab.core.pool import BASE, ModelPool


def register(sub) -> None:
    p = sub.add_parser("inspect", help="architecture, tensors, sizes and per-level counts of a model",
                       description="Show a model's architecture, its tensors (name, shape, dtype), parameter "
                                   "counts per level and size on disk; for a LoRA adapter its rank, alpha and "
                                   "targets. Reads headers (safetensors) or metadata (GGUF): no weights are "
                                   "decoded. Exits 2 when config.json disagrees with the stored shapes.")
    p.add_argument("ref", help="HF folder, .gguf file, PEFT adapter folder or hub id")
    p.add_argument("--base", help="base model, for a LoRA adapter")
    p.add_argument("--tensors", action="store_true", help="list every tensor")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("eval", help="scorecard (generality, speciality per task) of every model of a pool",
                       description="Evaluate every model of a pool: held-out general loss and perplexity, "
                                   "exact match and answer loss per task. " + GENERAL_LOSS_HELP)
    shared.add_pool(p)
    p.add_argument("--models", nargs="*", help="which models (default: base and all fine-tuned)")
    shared.add_eval_limits(p)
    shared.add_device(p, help=shared.DEVICE_CPU_HELP)
    shared.add_out(p, "CSV or JSON file")
    shared.add_benchmarks(p)
    p.add_argument("--general-loss", choices=GENERAL_LOSS_MODES, default="blocks",
                   help="blocks: packed 128-token blocks, EOS between documents (default); documents: one "
                        "sequence per document")
    shared.add_device_map(p)
    shared.add_dtype(p, what="the evaluated models")
    shared.add_dry_run(p)
    p.set_defaults(func=cmd_eval)


def anatomy_line(anatomy) -> str:
    """One line of a model's anatomy: its model type, layers, heads (kv), head dim, width, the attention's
    storage, experts and router, and the levels forgetlab's per-level jobs offer."""
    lay = anatomy.layout
    att = lay.attention
    store = f"fused {att.qkv} ({att.fused})" if att.qkv else f"separate {att.q}/{att.k}/{att.v}"
    moe = ""
    if anatomy.num_experts:
        router = lay.mlp.router or "none found"
        moe = f"; {anatomy.num_experts} experts ({lay.mlp.name}.{lay.mlp.experts}), router {lay.mlp.name}.{router}"
        if lay.mlp.shared:
            moe += f", shared {', '.join(lay.mlp.shared)}"
    return (f"{anatomy.model_type}: {anatomy.num_layers} layers, {anatomy.num_heads} heads "
            f"({anatomy.num_kv_heads} kv), head dim {anatomy.head_dim}, hidden {anatomy.hidden_size}; attention "
            f"{store}{moe}; levels {', '.join(anatomy.levels)}")


def cmd_inspect(args) -> int:
    ckpt = open_checkpoint(args.ref, base=args.base)
    cfg = ckpt.config
    arch = ", ".join(getattr(cfg, "architectures", None) or []) or "architecture not recorded"
    emit(f"{ckpt.ref}: {ckpt.kind} checkpoint, {cfg.model_type} ({arch})")
    if isinstance(ckpt, LoraCheckpoint):
        a = ckpt.summary()
        emit(f"LoRA adapter: rank {a['rank']}, alpha {a['alpha']}{', rsLoRA' if a['rslora'] else ''}"
             f"{', DoRA' if a['dora'] else ''}; targets {a['target_modules']}"
             f"{'; saved whole: ' + ', '.join(a['modules_to_save']) if a['modules_to_save'] else ''}")
        emit(f"{a['parameters']:,} adapter parameters, {a['stored_bytes'] / 2**20:.1f} MiB as stored; "
             f"applies to the base {a['base']} ({ckpt.base.num_parameters:,} parameters)")
        infos = ckpt.base.infos()
    else:
        infos = ckpt.infos()
        emit(f"{len(infos)} tensors, {ckpt.num_parameters:,} parameters, "
             f"{ckpt.stored_bytes / 2**20:.1f} MiB as stored")
    try:
        anatomy = Anatomy.from_config(cfg)
    except ForgetlabError as exc:  # an unknown architecture still lists its tensors; the message says which
        emit(f"(no per-level counts) {exc}")   # levels are unavailable and why
    else:
        rows = []
        for i in infos.values():
            role = anatomy.role(i.name)
            module = "expert" if role.expert is not None else role.module or "other"
            rows.append({"layer": role.layer if role.layer is not None else -1, "module": module,
                         "params": i.numel})
        df = pd.DataFrame(rows).groupby(["module"], as_index=False)["params"].sum()
        emit(f"anatomy: {anatomy_line(anatomy)}")
        emit_frame(df)
    if args.tensors:
        emit_frame(pd.DataFrame([{"name": i.name, "shape": "x".join(map(str, i.shape)), "dtype": str(i.dtype)}
                                 for i in infos.values()]))
    mismatch = None if isinstance(ckpt, LoraCheckpoint) else config_mismatch(ckpt)
    if mismatch:
        raise IncompatibleModelsError(f"The config.json of {ckpt.ref} disagrees with its weights ({mismatch}): "
                                      "loading it would re-initialise those weights. Fix the config (or the "
                                      "weights) so their shapes match.")
    return 0


def cmd_eval(args) -> int:
    pool = ModelPool.from_yaml(args.pool)
    names = args.models or [BASE, *pool.model_names]
    bench, manager = benchmark_spec(args, pool)
    placement = device_from_args(args)

    dtype = job_dtype(args.dtype, args.device)
    est = with_free(estimate_eval(pool=pool, models=names, device=args.device, dtype=dtype,
                                  max_general=args.max_general, max_task=args.max_task,
                                  general_mode=args.general_loss))
    # with a device map the model is spread over devices: the single-device check would refuse what fits
    if (args.dry_run or isinstance(placement, (str, type(None)))) and emit_estimate(est, args.dry_run):
        return 0
    cards = []
    for name in names:
        model = (pool.load(name, device=args.device, dtype=dtype) if isinstance(placement, (str, type(None)))
                 else load_placed(pool.checkpoint(name), placement))
        update, close = tqdm_progress(f"eval {name}")
        try:
            cards.append(evaluate(model, pool.tokenizer, pool.probes, name=name, max_general=args.max_general,
                                  max_task=args.max_task, benchmarks=bench, benchmark_manager=manager,
                                  general_mode=args.general_loss, progress=update))
        finally:
            close()
        pool.unload(name)
    df = scorecards_frame(cards)
    if args.out and args.out.endswith(".json"):
        text = json.dumps([c.to_dict() for c in cards], indent=2)
        emit(f"wrote {write_text_file(args.out, text, overwrite=True)}")
    else:
        emit_frame(df, args.out)
    if bench is not None and not args.out:
        for card in cards:
            emit(f"{card.model} benchmarks: {json.dumps(card.benchmarks)}")
    for line in scorecards_takeaway(cards):
        emit(line)
    return 0


def benchmark_spec(args, pool):
    """(BenchmarkSpec, lm-eval TaskManager) from --lm-eval/--lm-eval-include/--limit, else the pool's
    probes.benchmarks; (None, None) when no benchmark is asked for. Every task is checked before any model
    is loaded."""

    spec = None if args.no_lm_eval else pool.probes.benchmarks if pool.probes is not None else None
    if args.lm_eval:
        spec = BenchmarkSpec(general=parse_tasks(args.lm_eval),
                             include=args.lm_eval_include or (spec.include if spec else None),
                             limit=spec.limit if spec else None)
    elif args.lm_eval_include and spec is not None:
        spec = replace(spec, include=args.lm_eval_include)
    if spec is None or not spec.all_tasks:
        return None, None
    if args.limit is not None:
        spec = replace(spec, limit=check_limit(args.limit))
    return spec, checked_manager(spec)
