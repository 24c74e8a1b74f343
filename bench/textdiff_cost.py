"""What the token-level text view costs, measured against a scorecard of the same two models in the same run.

Issue 27's target: `textdiff` over the whole held-out split of the pico zoo takes at most 2× a scorecard
(`forgetlab.core.evaluate.evaluate`: general loss on every held-out block + exact match and answer loss on every
task's eval pairs) of the same two models. Both sides get models already loaded (the pool's cache), so loading
is left out of both. Prints, with the threads and sizes used (CPU seconds of this process, best of --repeat):

  - textdiff as run by default (the logit lens on the first 64 blocks) / scorecards of base and model  ← ≤ 2
  - textdiff with the lens on every block, and without the lens / the same scorecards
  - textdiff / the general loss alone of both models (the same blocks, one forward pass per model)
and checks that textdiff's mean rise equals the scorecards' general-loss difference.

    FORGETLAB_HOME=/tmp/fh .venv/bin/python bench/textdiff_cost.py [--pool PATH] [--model math] [--device cpu]
"""
from __future__ import annotations

import argparse
import time

import torch

from forgetlab.analysis.textdiff import LENS_BLOCKS, textdiff
from forgetlab.core.evaluate import evaluate
from forgetlab.core.pool import ModelPool
from forgetlab.core.workspace import zoo_dir


def timed(fn, repeat: int, device: str):
    """Best of `repeat` runs: CPU seconds of this process on the CPU (with one thread, the work done, which does
    not grow when other jobs share the machine); wall seconds after a synchronize on a GPU."""
    best, out = float("inf"), None
    for _ in range(repeat):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn()
            torch.cuda.synchronize()
            took = time.perf_counter() - t0
        else:
            t0 = time.process_time()
            out = fn()
            took = time.process_time() - t0
        best = min(best, took)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", default=None, help="pool.yaml (default: the pico zoo of FORGETLAB_HOME)")
    ap.add_argument("--model", default="math")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pool = ModelPool.from_yaml(args.pool or zoo_dir() / "pico" / "pool.yaml", scan_nonfinite=False)
    dev = args.device
    models = {n: pool.load(n, device=dev) for n in ("base", args.model)}
    tok = pool.tokenizer

    def cards(tasks=None):
        return [evaluate(models[n], tok, pool.probes, name=n, batch_size=args.batch_size, tasks=tasks)
                for n in ("base", args.model)]

    def diff(lens, lens_blocks=LENS_BLOCKS):
        return textdiff(pool, args.model, device=dev, batch_size=args.batch_size, lens=lens, lens_blocks=lens_blocks)

    diff(True)                                           # warm-up (allocator, kernels)
    t_cards, full = timed(cards, args.repeat, dev)
    t_general, general = timed(lambda: cards([]), args.repeat, dev)
    t_diff, result = timed(lambda: diff(True), args.repeat, dev)
    t_nolens, _ = timed(lambda: diff(False), args.repeat, dev)
    t_all, _ = timed(lambda: diff(True, None), args.repeat, dev)
    s = result.summary()
    n_tasks = sum(len(pool.probes.task(t).eval) for t in pool.task_names)
    print(f"pool {pool.name} ({pool.source}), model {args.model}, device {dev}, torch threads "
          f"{torch.get_num_threads()}, batch size {args.batch_size}, best of {args.repeat}")
    print(f"held-out: {len(result.docs)} blocks, {s['tokens']} scored tokens; scorecard tasks: {len(pool.task_names)} "
          f"({n_tasks} eval pairs); vocabulary {len(tok)}, {len(result.lens) - 1} layers")
    print(f"scorecards of base + {args.model}:          {t_cards:8.2f} s")
    print(f"general loss alone of both:          {t_general:8.2f} s")
    print(f"textdiff (default: lens on {LENS_BLOCKS} blocks): {t_diff:8.2f} s")
    print(f"textdiff (lens on every block):      {t_all:8.2f} s")
    print(f"textdiff (without the lens):         {t_nolens:8.2f} s")
    print(f"textdiff / scorecards:               {t_diff / t_cards:8.2f}x   (target ≤ 2)")
    print(f"textdiff lens on all / scorecards:   {t_all / t_cards:8.2f}x")
    print(f"textdiff without lens / scorecards:  {t_nolens / t_cards:8.2f}x")
    print(f"textdiff / general loss alone:       {t_diff / t_general:8.2f}x")
    rise = full[1].general_loss - full[0].general_loss
    print(f"mean rise {s['mean_rise']:.6f} vs scorecard general-loss rise {rise:.6f} "
          f"(difference {abs(s['mean_rise'] - rise):.1e})")


if __name__ == "__main__":
    main()
