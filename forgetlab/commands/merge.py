"""CLI: `forgetlab merge`, `forgetlab methods`, `forgetlab merge-export` (`forgetlab pcb-search` is the λ search
analysis's command, forgetlab.analysis.lambda_search)."""
from __future__ import annotations

import json

import pandas as pd
import yaml

from forgetlab.analysis.retention import merge_retention, own_tasks, takeaway
from forgetlab.commands import args as shared
from forgetlab.commands.io import emit, emit_estimate, emit_frame, tqdm_progress
from forgetlab.commands.models import benchmark_spec
from forgetlab.core.errors import ParameterError
from forgetlab.core.evaluate import forgetting_text
from forgetlab.core.memory import with_free
from forgetlab.core.outputs import write_text_file
from forgetlab.core.pool import ModelPool
from forgetlab.merge import METHODS, run
from forgetlab.merge.memory import estimate_merge
from forgetlab.merge.mergekit_export import to_mergekit
from forgetlab.merge.recipe_io import load_recipe
from forgetlab.merge.workflow import SCORECARDS, cards_frame, merge_and_evaluate


def register(subparsers) -> None:
    """Add the merge subcommands."""
    p = subparsers.add_parser("merge", help="Merge checkpoints by a recipe (forgetlab or mergekit YAML) into an "
                              "HF folder.", description="Merge checkpoints tensor by tensor into OUT_DIR. The "
                              "recipe format (forgetlab's or mergekit's) is detected from its keys.")
    p.add_argument("recipe", help="Recipe YAML file (forgetlab: method/base/models/params; mergekit: merge_method).")
    p.add_argument("out_dir", help="Output folder (refused if it exists, unless --overwrite).")
    shared.add_overwrite(p, help="Replace OUT_DIR if it exists (only once complete).")
    shared.add_device(p, default="cpu", help="Where the arithmetic runs: cpu (default) or cuda.")
    shared.add_pool(p, flag=True, required=False, help="pool.yaml with probe data, for methods that need one "
                    "(e.g. slwm), and to evaluate the merge (--eval)")
    p.add_argument("--eval", action="store_true", help="score the merge beside the pool's base and the recipe's "
                   "parents (general loss, exact match and answer loss per task, and the pool's lm-eval benchmarks) "
                   "and save the scorecards as OUT_DIR/scorecards.json; needs --pool")
    shared.add_benchmarks(p, "the base, the parents and the merge (implies --eval)")
    shared.add_eval_limits(p, prefix="--eval: ")
    shared.add_dtype(p, what="the scoring of the base, the parents and the merge (--eval); the merge itself is "
                     "computed in float32 and written in the recipe's dtype")
    shared.add_dry_run(p)
    p.set_defaults(func=_merge)

    m = subparsers.add_parser("methods", help="List the merge methods with their parameters and defaults.")
    m.add_argument("--json", action="store_true", help="Print the registry as JSON.")
    m.set_defaults(func=_methods)

    e = subparsers.add_parser("merge-export", help="Convert a merge recipe to mergekit YAML (or back to ours).")
    e.add_argument("recipe", help="Recipe YAML (either format).")
    e.add_argument("--to", choices=("mergekit", "forgetlab"), default="mergekit", help="Target format.")
    shared.add_out(e, "Write to this file instead of standard output.")
    e.set_defaults(func=_export)


def _merge(args) -> int:
    evaluate = args.eval or bool(args.lm_eval)
    if not evaluate and (args.lm_eval_include or args.limit is not None or args.no_lm_eval or args.max_general
                         is not None or args.max_task is not None):
        raise ParameterError("--lm-eval-include, --limit, --no-lm-eval, --max-general and --max-task set how the "
                             "merge is evaluated: add --eval (and --pool).")
    if evaluate and not args.pool:
        raise ParameterError("Evaluating the merge (--eval, --lm-eval) needs the pool whose probe data and base "
                             "judge it: add --pool POOL.yaml.")
    if args.dtype is not None and not evaluate:
        raise ParameterError("--dtype sets the precision the merge is scored in: add --eval (and --pool); the "
                             "merge's own output dtype is the recipe's `dtype:`.")
    recipe = load_recipe(args.recipe)                   # read once: its notes first, then estimate and merge
    for note in recipe.notes:
        emit(f"note: {note}")
    pool = None
    if args.pool:
        pool = ModelPool.from_yaml(args.pool)
    est = with_free(estimate_merge(recipe, pool=pool, device=args.device, dtype=args.dtype, evaluate=evaluate,
                                   max_general=args.max_general, max_task=args.max_task))
    if emit_estimate(est, args.dry_run):
        return 0
    update, close = tqdm_progress("merge")
    try:
        if evaluate:
            bench, manager = benchmark_spec(args, pool)         # tasks checked before the merge starts
            res, cards = merge_and_evaluate(recipe, args.out_dir, pool, overwrite=args.overwrite,
                                            device=args.device, dtype=args.dtype, max_general=args.max_general,
                                            max_task=args.max_task, benchmarks=bench, benchmark_manager=manager,
                                            progress=update)
        else:
            res = run(recipe, args.out_dir, progress=update, overwrite=args.overwrite, device=args.device,
                      pool=pool)
    finally:
        close()
    emit(f"merged {res.n_tensors} tensors ({res.n_parameters:,} parameters) with {res.method} in "
         f"{res.seconds:.1f} s into {res.out_dir}")
    if evaluate:
        emit_frame(cards_frame(cards, merged=[cards[-1].model]))
        if pool.task_names:
            merged = cards[-1].model
            kept = merge_retention(cards, [merged], own_tasks(pool, [c.model for c in cards[1:-1]], cards))
            emit(f"own-task gain kept (exact match, docs/methods.md#retention): mean "
                 f"{100 * kept.mean_retention(merged):.0f} %; forgetting {forgetting_text(kept.forgetting[merged])}")
            emit_frame(kept.to_frame().drop(columns=["merge"]))
            for line in takeaway(kept):
                emit(line)
        for card in cards:
            if card.benchmarks:
                emit(f"{card.model} benchmarks: {json.dumps(card.benchmarks)}")
        emit(f"scorecards saved in {res.out_dir / SCORECARDS}")
    return 0


def _methods(args) -> int:
    if args.json:
        emit(json.dumps({n: s.to_dict() for n, s in METHODS.items()}, indent=2))
        return 0
    rows = []
    for name, spec in METHODS.items():
        params = ", ".join(f"{p.name}={p.default}" for p in spec.params)
        rows.append({"method": name, "parameters": params, "description": spec.description})
    emit_frame(pd.DataFrame(rows))
    return 0


def _export(args) -> int:
    recipe = load_recipe(args.recipe)
    text = yaml.safe_dump(to_mergekit(recipe) if args.to == "mergekit" else recipe.to_dict(), sort_keys=False)
    if args.out is not None:
        emit(f"wrote {write_text_file(args.out, text, overwrite=args.overwrite)}")
        for note in recipe.notes:
            emit(f"note: {note}")
    else:
        for note in recipe.notes:  # YAML comments: the output stays a recipe
            emit(f"# note: {note}")
        emit(text.rstrip("\n"))
    return 0
