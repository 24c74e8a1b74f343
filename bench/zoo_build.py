"""Benchmark of the zoo build: torch threads 1 vs 2 on the pico training step, then whole builds.

Usage: python bench/zoo_build.py [--sizes tiny default] [--presets pico] [--steps 20]

Part 1 times the pico pretraining step (the build's dominant cost) for each size with 1 and with 2 torch
threads in the same run and prints the ratio (the peer is the other thread count). Part 2 builds each requested
preset/size into a fresh temporary workspace and prints its time per step, next to the time the same build
would need at the other thread count estimated from part 1's ratio, plus the scorecards.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forgetlab.core.data import EncodedExample  # noqa: E402
from forgetlab.train.trainer import train  # noqa: E402
from forgetlab.zoo import build, get_spec  # noqa: E402
from forgetlab.zoo.pico import init_model  # noqa: E402


class _FakeTokenizer:
    def __init__(self, n: int):
        self.n = n
        self.bos_token_id, self.eos_token_id, self.pad_token_id = 1, 2, 0

    def __len__(self) -> int:
        return self.n


def step_time(size: str, threads: int, steps: int) -> float:
    """Seconds per pretraining step of the pico `size` model with `threads` torch threads."""
    spec = get_spec("pico", size)
    torch.set_num_threads(threads)
    model = init_model(spec.shape, _FakeTokenizer(spec.shape.vocab_size), seed=0)
    gen = torch.Generator().manual_seed(0)
    run = spec.pretrain
    ids = torch.randint(3, spec.shape.vocab_size, (64, run.max_length), generator=gen)
    examples = [EncodedExample(x.tolist(), x.tolist()) for x in ids]
    train(model, examples, steps=2, batch_size=run.batch_size, lr=run.lr)          # warm-up
    t0 = time.perf_counter()
    train(model, examples, steps=steps, batch_size=run.batch_size, lr=run.lr)
    return (time.perf_counter() - t0) / steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="*", default=["tiny", "default"])
    ap.add_argument("--presets", nargs="*", default=["pico"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-build", action="store_true", help="only the thread comparison")
    args = ap.parse_args()

    print("== pico pretraining step, torch threads 1 vs 2 (same run) ==")
    ratios = {}
    for size in args.sizes:
        t1 = step_time(size, 1, args.steps)
        t2 = step_time(size, 2, args.steps)
        ratios[size] = t1 / t2
        print(f"pico/{size}: 1 thread {t1 * 1000:7.1f} ms/step · 2 threads {t2 * 1000:7.1f} ms/step · "
              f"speed-up of 2 threads ×{t1 / t2:.2f} (spec uses {get_spec('pico', size).threads})")
    if args.no_build:
        return 0

    for preset in args.presets:
        for size in args.sizes:
            spec = get_spec(preset, size)
            with tempfile.TemporaryDirectory() as home:
                t0 = time.perf_counter()
                result = build(preset=preset, size=size, home=home)
                wall = time.perf_counter() - t0
                print(f"\n== {preset}/{size}: built in {wall:.1f} s with {spec.threads} thread(s) ==")
                if preset == "pico" and size in ratios:
                    other = 1 if spec.threads == 2 else 2
                    train_s = sum(r["seconds"] for k, r in result.manifest["steps"].items() if k != "data")
                    # ratios = t(1 thread) / t(2 threads)
                    est = train_s / ratios[size] if other == 2 else train_s * ratios[size]
                    print(f"model steps {train_s:.1f} s; with {other} thread(s) they would take about {est:.1f} s "
                          f"(ratio ×{train_s / est:.2f})")
                for name, rec in result.manifest["steps"].items():
                    print(f"  {name:<16}{rec['seconds']:8.1f} s")
                print(result.to_frame().to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
