"""Evidence on the demo zoo: WiSE-FT and FAPM curves for every fine-tuned model, and one optimizer comparison.

    python bench/zoo_evidence.py                       # pico zoo under $FORGETLAB_HOME (built if missing)
    python bench/zoo_evidence.py --pool POOL.yaml --compare-task math --steps 250

Every number is printed beside its peers measured in the same run: speciality as a share of the fine-tuned
model's (`spec/ft`), and the forgetting left as a share of the fine-tuned model's forgetting
(`forget/ft` = (general loss − base's) / (fine-tuned's − base's); 0 = none of the forgetting, 1 = all of it).
"""
from __future__ import annotations

import argparse
import sys
import time

import pandas as pd


def _ratios(frame: pd.DataFrame, ft_spec: float, ft_gl: float, base_gl: float) -> pd.DataFrame:
    out = frame.copy()
    out["spec/ft"] = out["speciality"] / ft_spec if ft_spec else float("nan")
    span = ft_gl - base_gl
    out["forget/ft"] = (out["general_loss"] - base_gl) / span if span else float("nan")
    return out


def _show(title: str, df: pd.DataFrame) -> None:
    print(f"\n## {title}\n")
    with pd.option_context("display.width", 200, "display.max_rows", 200, "display.float_format", "{:.4f}".format):
        print(df.to_string(index=False))


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", help="pool.yaml (default: the pico zoo in the workspace, built if missing)")
    ap.add_argument("--preset", default="pico")
    ap.add_argument("--size", default="default")
    ap.add_argument("--alphas", default="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1")
    ap.add_argument("--ratios", default="0,0.5,0.8,0.9,0.95,0.99,1")
    ap.add_argument("--max-general", type=int, default=None, help="general blocks per evaluation (default all)")
    ap.add_argument("--max-task", type=int, default=None, help="eval pairs per task (default all)")
    ap.add_argument("--compare-task", default=None, help="task of the optimizer comparison (default: the first)")
    ap.add_argument("--steps", type=int, default=None, help="steps of each compared fine-tune (default: the zoo's)")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: the zoo's fine-tuning lr)")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-compare", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from forgetlab.analysis.sweeps import alpha_curve, default_task, pruning_curve
    from forgetlab.core.pool import ModelPool
    from forgetlab.train.runs import compare, standard_configs

    pool_path = args.pool
    spec = None
    if pool_path is None:
        from forgetlab.zoo import build, get_spec

        spec = get_spec(args.preset, args.size)
        t0 = time.perf_counter()
        zb = build(preset=args.preset, size=args.size)
        pool_path = zb.pool_yaml
        print(f"zoo {spec.name}: {'built in %.0f s' % (time.perf_counter() - t0) if zb.built else 'present'} "
              f"({pool_path})")
    pool = ModelPool.from_yaml(pool_path)
    print(f"torch threads: {args.threads} · pool {pool.name}: base + {', '.join(pool.model_names)} · "
          f"tasks {', '.join(pool.task_names)} · {pool.base.num_parameters:,} parameters")
    alphas = [float(v) for v in args.alphas.split(",")]
    ratios = [float(v) for v in args.ratios.split(",")]
    ev = dict(max_general=args.max_general, max_task=args.max_task, device="cpu")
    keep = ["series", "x", "speciality", "general_loss", "distance", "pareto", "spec/ft", "forget/ft"]
    for model in pool.model_names:
        task = default_task(pool, model)
        t0 = time.perf_counter()
        a = alpha_curve(pool, model, alphas=alphas, **ev)
        ta = time.perf_counter() - t0
        base_pt = min(a.points, key=lambda p: p.x)
        ft_pt = max(a.points, key=lambda p: p.x)
        ft_spec, ft_gl, base_gl = ft_pt.speciality(task), ft_pt.general_loss, base_pt.general_loss
        _show(f"WiSE-FT α curve · {model} (speciality: {task} exact match; {len(a.points)} points, {ta:.0f} s)",
              _ratios(a.to_frame(), ft_spec, ft_gl, base_gl)[keep].rename(columns={"x": "alpha"}))
        t0 = time.perf_counter()
        p = pruning_curve(pool, model, ratios=ratios, **ev)
        tp = time.perf_counter() - t0
        _show(f"FAPM pruning curve · {model} (x = pruning ratio; {len(p.points)} points, {tp:.0f} s)",
              _ratios(p.to_frame(), ft_spec, ft_gl, base_gl)[keep].rename(columns={"x": "ratio"}))
    if not args.skip_compare:
        task = args.compare_task or pool.task_names[0]
        ft = spec.finetune if spec is not None else None
        steps = args.steps or (ft.steps if ft else 200)
        lr = args.lr or (ft.lr if ft else 1e-3)
        batch = args.batch_size or (ft.batch_size if ft else 16)
        t0 = time.perf_counter()
        comp = compare(pool, task, standard_configs(steps, lr, batch_size=batch), eval_every=max(1, steps // 5),
                       **ev)
        tc = time.perf_counter() - t0
        frame = comp.to_frame()
        adam = frame[frame.label == "adamw"].iloc[0]
        base_gl = comp.runs[0].start_card.general_loss
        frame["spec/adamw"] = frame["speciality"] / adam["speciality"] if adam["speciality"] else float("nan")
        span = adam["general_loss"] - base_gl
        frame["forget/adamw"] = (frame["general_loss"] - base_gl) / span if span else float("nan")
        _show(f"Optimizer comparison · base fine-tuned on {task} ({steps} steps, lr {lr}, batch {batch}; "
              f"{tc:.0f} s; base general loss {base_gl:.4f})",
              frame[["label", "speciality", "general_loss", "forgetting", "distance", "pareto", "spec/adamw",
                     "forget/adamw", "seconds"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
