"""FAPM pruning curves of LoRA adapters next to full fine-tunes, on the pico zoo: evidence for FAPM's
`adapter_ratio` default (docs/merging.md, "FAPM on LoRA adapters").

For each task, a LoRA adapter (rank 8, α 16, on every projection; the smol zoo's adapter recipe with the
pico fine-tune's steps, batch and a LoRA learning rate) is trained on the pico base and saved; then the FAPM
pruning curve (score "fapm") is run for the adapter and for the zoo's full fine-tune of the same task.
Prints speciality (exact match on the task's eval split) and held-out general loss per ratio.

    FORGETLAB_HOME=<home> python bench/fapm_lora_ratio.py --pool <home>/zoo/pico/pool.yaml [--tasks translate code]
"""
from __future__ import annotations

import argparse
import copy
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", required=True)
    ap.add_argument("--tasks", nargs="+", default=["translate", "code"])
    ap.add_argument("--ratios", default="0,0.3,0.5,0.7,0.8,0.9")
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--max-general", type=int, default=48)
    ap.add_argument("--max-task", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from forgetlab.analysis.sweeps import pruning_curve
    from forgetlab.core.pool import ModelPool
    from forgetlab.zoo.presets import PRESETS, LoraSpec
    from forgetlab.zoo.smol import add_lora
    from forgetlab.zoo.training import finetune

    pool = ModelPool.from_yaml(args.pool)
    spec = PRESETS["pico"]["default"]
    lora = LoraSpec(r=8, alpha=16, dropout=0.0,
                    target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                    train=replace(spec.finetune, lr=args.lr))
    ratios = [float(r) for r in args.ratios.split(",")]
    out = Path(tempfile.mkdtemp(prefix="fapm-lora-"))
    print(f"pool {args.pool}; LoRA r={lora.r} alpha={lora.alpha} lr={lora.train.lr} steps={lora.train.steps} "
          f"batch={lora.train.batch_size}; torch threads {args.threads}")
    for i, task in enumerate(args.tasks):
        t0 = time.perf_counter()
        model = add_lora(copy.deepcopy(pool.load("base", device="cpu")), lora)
        finetune(model, pool.tokenizer, pool.probes.task(task).train, lora.train, seed=1101 + i,
                 template=getattr(spec, "template", None))
        model.eval()
        model.save_pretrained(str(out / f"lora-{task}"), safe_serialization=True)
        pool.add(f"lora-{task}", {"adapter": str(out / f"lora-{task}")})
        trained = time.perf_counter() - t0
        for name in (f"lora-{task}", task):
            res = pruning_curve(pool, name, ratios=ratios, scores=["fapm"], task=task, device="cpu",
                                max_general=args.max_general, max_task=args.max_task)
            print(f"\n## {name} (task {task}{f'; LoRA trained in {trained:.0f} s' if name != task else ''})")
            print(res.to_frame()[["series", "x", "speciality", "answer_loss", "general_loss", "distance"]].to_string(index=False))


if __name__ == "__main__":
    main()
