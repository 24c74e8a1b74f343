"""What the default task sequence costs, against its peer in the same run: the same number of single fine-tunes
as the Fine-tune page runs them.

The sequence is the Sequence page's default: the order math → code → translate and the default comparison
(forgetlab.train.sequence.DEFAULT_COMPARE, 7 methods), each stage with the pool's own fine-tune recipe, scored at
the app's default evaluation budget (the zoo's claims budget). The peer is 3 × 7 single fine-tunes of the base
(`forgetlab.train.runs.finetune`), one per (method, task) with that stage's trainer recipe, recording as the
Fine-tune page does (a record every `default_record_every(steps)` steps, 16 general blocks and 50 pairs per task).
Prints both costs in wall and CPU seconds and their ratio (the issue's aim: ≤ 1.3), plus each chain's seconds.

    FORGETLAB_HOME=… python bench/sequence_cost.py [POOL] [--methods adamw,mofo,…] [--skip-peer]
"""
from __future__ import annotations

import argparse
import time

from forgetlab.core.pool import ModelPool
from forgetlab.core.scorecards import DEFAULT_BUDGET
from forgetlab.core.workspace import home
from forgetlab.train.runs import default_record_every, finetune
from forgetlab.train.sequence import (DEFAULT_COMPARE, SEQUENCE_METHODS, ChainOptions, Strengths, run_sequence,
                                      stage_budgets, stage_config)
from forgetlab.zoo.claims import stored_claims

PAGE_GENERAL, PAGE_PAIRS = 16, 50          # the Fine-tune page's record budget (pages/finetune.py)


def timed(fn):
    """(wall seconds, CPU seconds of this process, result) of one call."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pool", nargs="?", default=None, help="pool.yaml (default: the workspace's pico demo zoo)")
    ap.add_argument("--order", default="math,code,translate")
    ap.add_argument("--methods", default=",".join(DEFAULT_COMPARE))
    ap.add_argument("--lr", type=float, default=None, help="every stage's peak learning rate (default: the zoo's)")
    ap.add_argument("--skip-peer", action="store_true")
    args = ap.parse_args()
    pool = ModelPool.from_yaml(args.pool or home() / "zoo" / "pico" / "pool.yaml")
    order, methods = args.order.split(","), args.methods.split(",")
    claims = stored_claims(pool.source)
    budget = claims.settings if claims is not None else {"max_general": DEFAULT_BUDGET.max_general,
                                                         "max_task": DEFAULT_BUDGET.max_task}
    options = ChainOptions(budgets=stage_budgets(pool, order, lr=args.lr),
                           lora_budgets=stage_budgets(pool, order, lora=True),
                           max_general=budget["max_general"], max_task=budget["max_task"])
    wall, cpu, result = timed(lambda: run_sequence(pool, order, methods, options=options))
    print(f"sequence: {len(methods)} methods × {len(order)} stages on {pool.name}: {wall:.1f} s wall, {cpu:.1f} s CPU")
    for c in result.chains:
        print(f"  {c.method:12s} {c.seconds:6.1f} s")
    if args.skip_peer:
        return
    peer_wall = peer_cpu = 0.0
    for m in methods:
        for t in order:
            recipe = (options.lora_budgets if SEQUENCE_METHODS[m].lora else options.budgets)[t]
            config = stage_config(SEQUENCE_METHODS[m], Strengths(), recipe, 0)
            w, c, _ = timed(lambda: finetune(pool, t, config, eval_every=default_record_every(config.steps),
                                             max_general=PAGE_GENERAL, max_task=PAGE_PAIRS))
            peer_wall, peer_cpu = peer_wall + w, peer_cpu + c
    n = len(methods) * len(order)
    print(f"peer: {n} single fine-tunes as the Fine-tune page runs them: {peer_wall:.1f} s wall, {peer_cpu:.1f} s CPU")
    print(f"ratio sequence / peer: {wall / peer_wall:.2f} wall, {cpu / peer_cpu:.2f} CPU (aim ≤ 1.3)")


if __name__ == "__main__":
    main()
