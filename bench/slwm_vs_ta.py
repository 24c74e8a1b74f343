"""Submodule-linearity merging (slwm) against task arithmetic on the pico zoo's three tasks.

Builds (or reuses) the pico zoo, merges its three fine-tuned models with
  - task arithmetic, λ = 1/T,
  - task arithmetic, the best λ of a small grid (best = highest mean exact match over the tasks, ties broken by
    the lower general loss; the grid's choice is made on the eval split, so it is an optimistic baseline),
  - slwm at each level (layer, attn_mlp, head_mlp), weights fitted on `--samples` probe pairs per task,
and prints speciality per task (exact match, answer loss) and generality (held-out general loss) of each, plus
the base and the fine-tuned models for reference, and slwm's weights.

    /work/venv/bin/python bench/slwm_vs_ta.py [--home DIR] [--size default] [--samples 30]
"""
from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path

import pandas as pd
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=os.environ.get("FORGETLAB_HOME", "/tmp/forgetlab-bench-home"))
    ap.add_argument("--size", default="default", help="pico size (default or tiny)")
    ap.add_argument("--pool", help="use this existing pool.yaml (three fine-tuned models named like their tasks) "
                                   "instead of building the pico zoo")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--levels", default="layer,attn_mlp,head_mlp")
    ap.add_argument("--grid", default="0.2,0.33,0.5,0.7,1.0", help="λ grid for task arithmetic")
    ap.add_argument("--max-general", type=int, default=None)
    ap.add_argument("--max-task", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from forgetlab.core.evaluate import evaluate
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge import merge_state_dicts
    from forgetlab.merge.methods.slwm import slwm_merge
    from forgetlab.zoo import build

    t0 = time.perf_counter()
    if args.pool:
        pool_yaml = Path(args.pool)
        print(f"pool {pool_yaml}; torch threads = {torch.get_num_threads()}")
    else:
        zb = build(preset="pico", size=args.size, home=Path(args.home))
        pool_yaml = zb.pool_yaml
        print(f"zoo {zb.root} ({'built' if zb.built else 'reused'} in {time.perf_counter() - t0:.0f} s); "
              f"torch threads = {torch.get_num_threads()}")
    pool = ModelPool.from_yaml(pool_yaml)
    tasks = [t for t in pool.task_names if t in pool.model_names]
    T = len(tasks)
    base = pool.load("base")
    base_sd = {k: v.detach() for k, v in base.state_dict().items()}
    ft_sds = [{k: v.detach() for k, v in pool.load(t).state_dict().items()} for t in tasks]
    work = copy.deepcopy(base)

    def score(name: str, sd) -> dict:
        with torch.no_grad():
            work.load_state_dict(sd, strict=False)
        card = evaluate(work, pool.tokenizer, pool.probes, name=name, max_general=args.max_general,
                        max_task=args.max_task, tasks=tasks)
        row = {"model": name, "general_loss": card.general_loss}
        for t in tasks:
            row[f"{t}/EM"] = card.tasks[t].exact_match
            row[f"{t}/loss"] = card.tasks[t].answer_loss
        row["mean EM"] = sum(card.tasks[t].exact_match for t in tasks) / T
        return row

    rows = [score("base", base_sd)] + [score(f"fine-tuned {t}", sd) for t, sd in zip(tasks, ft_sds)]
    ta_rows = []
    for lam in sorted({1.0 / T, *[float(x) for x in args.grid.split(",")]}):
        merged = merge_state_dicts("task_arithmetic", base_sd, ft_sds, lam=lam)
        ta_rows.append((lam, score(f"TA λ={lam:.3g}", merged)))
    rows.append(next(r for lam, r in ta_rows if abs(lam - 1.0 / T) < 1e-12) | {"model": f"TA λ=1/T={1 / T:.3g}"})
    best_lam, best = max(ta_rows, key=lambda lr: (lr[1]["mean EM"], -lr[1]["general_loss"]))
    rows.append(best | {"model": f"TA best λ={best_lam:.3g} (grid {args.grid})"})
    weights = {}
    for level in args.levels.split(","):
        t1 = time.perf_counter()
        merged, table = slwm_merge(pool, tasks, level=level, samples=args.samples)
        secs = time.perf_counter() - t1
        rows.append(score(f"slwm {level}", merged) | {"fit_s": secs})
        weights[level] = table
    df = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.3f}".format):
        print(df.to_string(index=False))
        print("\nTask arithmetic over the λ grid:")
        print(pd.DataFrame([r | {"λ": lam} for lam, r in ta_rows])[["λ", "general_loss", "mean EM",
                                                                   *[f"{t}/EM" for t in tasks]]].to_string(index=False))
        for level, table in weights.items():
            print(f"\nslwm weights, level {level} (mean over submodules; fallback = 1/T):")
            print(table[tasks].describe().loc[["mean", "std", "min", "max"]].to_string())
        print("\nslwm attn_mlp weights per submodule:")
        if "attn_mlp" in weights:
            print(weights["attn_mlp"].to_string(index=False))


if __name__ == "__main__":
    main()
