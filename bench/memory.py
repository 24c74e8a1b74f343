"""Each job's peak memory as a multiple of the model's bytes, beside its estimate (issue 28).

    python bench/memory.py [--size 100M|20M] [--device cpu|cuda] [--jobs finetune-adamw,…] [--zoo DIR]

Builds a random Llama of the chosen size (100M: hidden 768, 12 layers, MLP 2048, vocab 32000; 20M: hidden 384,
6 layers, MLP 1024) in a temporary pool that borrows the pico zoo's tokenizer and probe data (`--zoo`, default
$FORGETLAB_HOME/zoo/pico; build it with `forgetlab zoo build`), then runs every job in a fresh Python process
and measures its peak above the bare import of forgetlab and of transformers' Llama code (that import alone holds
≈0.12 GiB, whatever the model's size) with `forgetlab.core.memory.PeakMeter`: the anonymous resident memory on
the CPU (mapped safetensors pages are page cache, not counted), the allocator's peak on CUDA. Prints, per job: its dtype, the peak in GiB, the peak as a
multiple of the model's float32 bytes and of its bytes in the job's dtype, the estimate (`core.memory.estimate`)
and estimate / measured. A float32 job on these float32 checkpoints that only reads its weights (features,
textdiff, a search's resident state dicts) keeps them as mapped file pages: its estimate column leaves those
parts out (`forgetlab.analysis.features_memory.unmapped`), as the measurement does.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"100M": dict(hidden_size=768, num_hidden_layers=12, intermediate_size=2048, num_attention_heads=12),
         "20M": dict(hidden_size=384, num_hidden_layers=6, intermediate_size=1024, num_attention_heads=6)}
SWEEP = ["--model", "math", "--task", "math", "--max-general", "4", "--max-task", "4", "--no-save"]
FT = ["--task", "math", "--steps", "3", "--batch-size", "8", "--eval-every", "3", "--max-general", "4",
      "--max-task", "4", "--no-save"]
TEXTDIFF = ["--model", "math", "--max-general", "16", "--no-save"]
SEARCH = ["--budget", "2", "--measure", "answer_loss", "--max-general", "4", "--max-task", "4", "--batch-size", "8",
          "--no-save"]
EVAL = ["--models", "math", "--max-general", "16", "--max-task", "16"]
JOBS = {   # name → (CLI arguments after the pool, job dtype)
    "finetune-adamw": (["finetune", *FT, "--optimizer", "adamw", "--dtype", "float32"], "float32"),
    "finetune-mofo": (["finetune", *FT, "--optimizer", "mofo", "--dtype", "float32"], "float32"),
    "finetune-adamw-bf16": (["finetune", *FT, "--optimizer", "adamw", "--dtype", "bfloat16"], "bfloat16"),
    "finetune-lora-bf16-ckpt": (["finetune", *FT, "--lora", "16", "--dtype", "bfloat16", "--gradient-checkpointing"],
                                "bfloat16"),
    "sweep-alpha": (["sweep", "alpha", *SWEEP, "--alphas", "0,0.5,1", "--dtype", "float32"], "float32"),
    "sweep-alpha-bf16": (["sweep", "alpha", *SWEEP, "--alphas", "0,0.5,1", "--dtype", "bfloat16"], "bfloat16"),
    "sweep-pruning-fapm": (["sweep", "pruning", *SWEEP, "--ratios", "0.2,0.5,0.9", "--scores", "fapm",
                            "--dtype", "float32"], "float32"),
    # float32 on float32 checkpoints keeps the weights as mapped file pages: the estimate/measured column then
    # compares the estimate's other parts (features_memory.unmapped) with the measured peak
    "features": (["features", "--samples", "8", "--dtype", "float32"], "float32"),
    "features-bf16": (["features", "--samples", "8", "--dtype", "bfloat16"], "bfloat16"),
    "textdiff": (["textdiff", *TEXTDIFF, "--dtype", "float32"], "float32"),
    "textdiff-bf16": (["textdiff", *TEXTDIFF, "--dtype", "bfloat16"], "bfloat16"),
    "search": (["search", *SEARCH, "--dtype", "float32"], "float32"),
    "search-bf16": (["search", *SEARCH, "--dtype", "bfloat16"], "bfloat16"),
    "eval": (["eval", *EVAL, "--dtype", "float32"], "float32"),
    "eval-bf16": (["eval", *EVAL, "--dtype", "bfloat16"], "bfloat16"),
}


def make_pool(root: Path, size: str, zoo: Path) -> Path:
    """A pool of one random Llama of `size` (float32 safetensors) with the pico zoo's tokenizer and probes."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(zoo / "base")
    cfg = LlamaConfig(vocab_size=32000, max_position_embeddings=256, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      **SIZES[size])
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(root / "base", safe_serialization=True)
    tok.save_pretrained(root / "base")
    torch.manual_seed(1)          # a second random model stands for the fine-tuned one the sweeps need
    LlamaForCausalLM(cfg).save_pretrained(root / "ft-math", safe_serialization=True)
    tok.save_pretrained(root / "ft-math")
    shutil.copytree(zoo / "data", root / "data")
    text = (zoo / "pool.yaml").read_text().split("probes:", 1)[1]
    (root / "pool.yaml").write_text(f"name: mem-{size}\nbase: base\nmodels:\n  math: ft-math\nprobes:{text}")
    (root / "search.yaml").write_text(f"method: task_arithmetic\nbase: {root / 'base'}\nmodels:\n"
                                      f"  - model: {root / 'ft-math'}\n    weight: 1.0\nparams:\n  lam: 1.0\n")
    return root / "pool.yaml"


def child(pool: str, job: str, device: str) -> None:
    """Run one job in this process under a PeakMeter; print {"peak", "estimate", "model_params"} as JSON."""
    import torch

    torch.set_num_threads(1)
    from forgetlab.cli import main
    from forgetlab.core.memory import ModelSize, PeakMeter, estimate, recording  # noqa: F401
    from forgetlab.core.pool import ModelPool
    import forgetlab.analysis.sweeps  # noqa: F401  (registers the sweep estimator)
    import forgetlab.analysis.features, forgetlab.analysis.textdiff, forgetlab.analysis.search  # noqa: E401,F401

    import transformers.models.llama.modeling_llama  # noqa: F401  (~0.12 GiB of code and tables, any model size)

    args, dtype = JOBS[job]
    p = ModelPool.from_yaml(pool)
    size = ModelSize.of(p.checkpoint("base"))
    est = _estimate(p, args, dtype, device, Path(pool).parent)
    del p
    with PeakMeter(device) as meter:
        if args[0] == "search":                         # "search RECIPE --pool POOL …"
            code = main(["search", str(Path(pool).parent / "search.yaml"), "--pool", pool, *args[1:], "--device",
                         device])
        else:
            words = 2 if args[0] == "sweep" else 1      # "sweep KIND POOL …", "finetune POOL …"
            code = main([*args[:words], pool, *args[words:], "--device", device])
    print(json.dumps({"peak": meter.peak, "estimate": est, "params": size.parameters, "code": code}))


def _estimate(pool, args, dtype, device, root: Path):
    """The job's estimate in bytes (`root`: the pool's folder), less the parts that are memory-mapped checkpoint
    pages (not in the RSS)."""
    from forgetlab.analysis.features_memory import unmapped
    from forgetlab.core.memory import estimate

    if args[0] == "features":
        return unmapped(estimate("features", pool=pool, samples=8, device=device, dtype=dtype).parts)
    if args[0] == "textdiff":
        return unmapped(estimate("textdiff", pool=pool, model="math", max_general=16, device=device,
                                 dtype=dtype).parts)
    if args[0] == "eval":
        from forgetlab.analysis.features_memory import mapped_weights
        from forgetlab.core import eval_memory  # noqa: F401  (registers the "eval" estimate)
        from forgetlab.core.memory import job_dtype

        est = estimate("eval", pool=pool, models=["math"], max_general=16, max_task=16, device=device, dtype=dtype)
        mapped = mapped_weights(pool.checkpoint("math"), job_dtype(dtype), device)
        return est.total - (est.parts["weights"] if mapped else 0)
    if args[0] == "search":
        return unmapped(estimate("search", recipe=str(root / "search.yaml"), pool=pool,
                                 max_general=4, max_task=4, batch_size=8, device=device, dtype=dtype).parts)
    return _estimate_training(pool, args, dtype, device)


def _estimate_training(pool, args, dtype, device):
    from forgetlab.core.memory import estimate
    from forgetlab.train.runs import FinetuneConfig

    if args[0] == "finetune":
        lora = int(args[args.index("--lora") + 1]) if "--lora" in args else 0
        opt = args[args.index("--optimizer") + 1] if "--optimizer" in args else "adamw"
        cfg = FinetuneConfig(optimizer=opt, steps=3, batch_size=8, lora=lora)
        return estimate("finetune", pool=pool, task="math", config=cfg, device=device, dtype=dtype,
                        gradient_checkpointing="--gradient-checkpointing" in args).total
    if args[0] == "sweep":
        return estimate("sweep", pool=pool, model="math", kind=args[1], device=device, dtype=dtype, max_general=4,
                        max_task=4).total
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=list(SIZES), default="100M")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--zoo", default=str(Path(os.environ.get("FORGETLAB_HOME", Path.home() / ".forgetlab"))
                                         / "zoo" / "pico"))
    ap.add_argument("--mmap-threshold", type=int, default=None,
                    help="glibc's M_MMAP_THRESHOLD in each job's process (e.g. 131072, as the tests measure): every "
                         "larger tensor is then mapped and unmapped on its own, so the peak is the job's live memory "
                         "rather than freed heap glibc kept (default: glibc's sliding threshold)")
    ap.add_argument("--child", nargs=2, metavar=("POOL", "JOB"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], a.device)
    zoo = Path(a.zoo)
    if not (zoo / "pool.yaml").exists():
        sys.exit(f"no pico zoo at {zoo}: build it with `forgetlab zoo build --preset pico` or pass --zoo")
    with tempfile.TemporaryDirectory(prefix="forgetlab-mem-") as tmp:
        pool = make_pool(Path(tmp), a.size, zoo)
        env = {**os.environ, "FORGETLAB_HOME": tmp, "PYTHONPATH": str(ROOT)}
        if a.mmap_threshold is not None:
            env["MALLOC_MMAP_THRESHOLD_"] = str(a.mmap_threshold)
        print(f"{a.size} random Llama on {a.device}, 1 thread; peak above the bare import"
              + (f"; mmap threshold {a.mmap_threshold}" if a.mmap_threshold is not None else ""), flush=True)
        print(f"{'job':26s} {'dtype':9s} {'peak GiB':>9s} {'×fp32':>6s} {'×dtype':>7s} {'estimate':>9s} {'est/meas':>8s}")
        for job in a.jobs.split(","):
            out = subprocess.run([sys.executable, __file__, "--device", a.device, "--child", str(pool), job],
                                 env=env, capture_output=True, text=True)
            line = (out.stdout.strip().splitlines() or [""])[-1]
            if out.returncode or not line.startswith("{"):
                print(f"{job:26s} failed: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
                continue
            r = json.loads(line)
            dtype = JOBS[job][1]
            fp32, own = r["params"] * 4, r["params"] * (4 if dtype == "float32" else 2)
            est = r["estimate"]
            print(f"{job:26s} {dtype:9s} {r['peak'] / 2**30:9.3f} {r['peak'] / fp32:6.2f} {r['peak'] / own:7.2f} "
                  f"{(est or 0) / 2**30:9.3f} {(est / r['peak'] if est and r['peak'] else float('nan')):8.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
