"""Peak memory of the pool-statistics merges' `prepare` hooks (fisher, regmean, regmean_pp, slwm), as a multiple
of one model's float32 bytes (issue 28).

    python bench/prepare_memory.py [--size 40M|20M] [--methods fisher,regmean,…] [--zoo DIR] [--src DIR]

Builds a pool of a random Llama base and three random "fine-tunes" of it (named translate, math, code after the
pico zoo's tasks, whose tokenizer and probe data it borrows: `--zoo`, default $FORGETLAB_HOME/zoo/pico), stored
in bfloat16 as 7–8B checkpoints are (a float32 model loaded from float32 safetensors can stay as mapped file
pages, which the meter does not count). Each hook then runs in a fresh Python process on the CPU, one thread,
with `samples` probe pairs per task, under `forgetlab.core.memory.PeakMeter` (anonymous resident memory above
what the process held after importing forgetlab and transformers' Llama code and opening the pool). Prints per
method the peak in GiB, the peak / one model's float32 bytes, the statistics' own share, the "merge" estimate's
prepare phase / the peak (`forgetlab.merge.memory.prepare_parts`), and the models the pool still holds afterwards.

`--src DIR`: the forgetlab source tree the hooks import (default: this checkout), e.g. a `git worktree` of an
older commit, to compare before and after a change with the same script.
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
SIZES = {"40M": dict(hidden_size=512, num_hidden_layers=8, intermediate_size=1408, num_attention_heads=8),
         "20M": dict(hidden_size=384, num_hidden_layers=6, intermediate_size=1024, num_attention_heads=6)}
TASKS = ("translate", "math", "code")
METHODS = ("fisher", "regmean", "regmean_pp", "slwm")


def make_pool(root: Path, size: str, zoo: Path) -> Path:
    """A random Llama base of `size` and three random models standing for its fine-tunes (bfloat16 safetensors),
    with the pico zoo's tokenizer and probe data."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(zoo / "base")
    cfg = LlamaConfig(vocab_size=32000, max_position_embeddings=256, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      **SIZES[size])
    for seed, name in enumerate(["base", *(f"ft-{t}" for t in TASKS)]):
        torch.manual_seed(seed)
        LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(root / name, safe_serialization=True)
        tok.save_pretrained(root / name)
    shutil.copytree(zoo / "data", root / "data")
    probes = "".join(f"    {t}: {{probe: data/{t}_probe.jsonl}}\n" for t in TASKS)
    models = "".join(f"  {t}: ft-{t}\n" for t in TASKS)
    (root / "pool.yaml").write_text(f"name: prep-{size}\nbase: base\nmodels:\n{models}probes:\n  tasks:\n{probes}")
    return root / "pool.yaml"


def child(pool: str, method: str, samples: int) -> None:
    """Run one method's prepare hook in this process under a PeakMeter; print {"peak", "params", "held"}."""
    import torch

    torch.set_num_threads(1)
    import transformers.models.llama.modeling_llama  # noqa: F401  (the code every run imports anyway)

    from forgetlab.core.memory import ModelSize, PeakMeter
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.registry import METHODS, PrepareContext, get_method, validate_params

    METHODS.discover()  # every method's module, imported before the meter starts

    p = ModelPool.from_yaml(pool)
    p.tokenizer                                                      # loaded before the meter starts
    spec = get_method(method)
    params = validate_params(spec, {"samples": samples}, n_models=len(TASKS))
    with PeakMeter("cpu") as meter:
        prepared = spec.prepare(PrepareContext(p, None, [], list(TASKS), params))
    held = [k[0] for k in p._loaded]                                 # works on old code too (no .loaded() there)
    try:                                                             # the "merge" estimate's prepare phase
        from forgetlab.merge.memory import gram_entries, prepare_parts

        est = sum(prepare_parts(method, ModelSize.of(p.checkpoint("base")), len(TASKS),
                                gram_entries(p.checkpoint("base"))).values())
    except ImportError:                                              # an older tree has no estimate
        est = 0
    out = sum(getattr(v, "grams", v).nbytes for v in prepared.values() if hasattr(getattr(v, "grams", v), "nbytes"))
    print(json.dumps({"peak": meter.peak, "params": ModelSize.of(p.checkpoint("base")).parameters, "held": held,
                      "out": out, "estimate": est}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=list(SIZES), default="40M")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--samples", type=int, default=16, help="probe pairs per task")
    ap.add_argument("--zoo", default=str(Path(os.environ.get("FORGETLAB_HOME", Path.home() / ".forgetlab"))
                                         / "zoo" / "pico"))
    ap.add_argument("--src", default=str(ROOT), help="the forgetlab source tree the hooks import")
    ap.add_argument("--mmap-threshold", type=int, default=131072,
                    help="glibc's M_MMAP_THRESHOLD in each hook's process: every larger tensor is mapped and "
                         "unmapped on its own, so the peak is the hook's live memory rather than freed heap that "
                         "glibc kept (0: glibc's default sliding threshold)")
    ap.add_argument("--child", nargs=2, metavar=("POOL", "METHOD"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], a.samples)
    zoo = Path(a.zoo)
    if not (zoo / "pool.yaml").exists():
        sys.exit(f"no pico zoo at {zoo}: build it with `forgetlab zoo build --preset pico` or pass --zoo")
    with tempfile.TemporaryDirectory(prefix="forgetlab-prep-") as tmp:
        pool = make_pool(Path(tmp), a.size, zoo)
        env = {**os.environ, "FORGETLAB_HOME": tmp, "PYTHONPATH": str(Path(a.src).resolve())}
        if a.mmap_threshold:
            env["MALLOC_MMAP_THRESHOLD_"] = str(a.mmap_threshold)
        print(f"{a.size} random Llama, 3 fine-tunes (bf16 on disk, float32 in memory), {a.samples} samples per "
              f"task, CPU, 1 thread, mmap threshold {a.mmap_threshold or 'glibc default'}; source {a.src}; peak "
              "above the bare import; ×model: per one model's float32 bytes; output: the prepared statistics "
              "themselves", flush=True)
        print(f"{'method':12s} {'peak GiB':>9s} {'×model':>7s} {'output ×model':>14s} {'est/meas':>9s}  held after")
        for method in a.methods.split(","):
            out = subprocess.run([sys.executable, __file__, "--samples", str(a.samples), "--child", str(pool),
                                  method], env=env, capture_output=True, text=True)
            line = (out.stdout.strip().splitlines() or [""])[-1]
            if out.returncode or not line.startswith("{"):
                print(f"{method:12s} failed: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
                continue
            r = json.loads(line)
            model = 4 * r["params"]
            print(f"{method:12s} {r['peak'] / 2**30:9.3f} {r['peak'] / model:7.2f} {r['out'] / model:14.2f} "
                  f"{r['estimate'] / max(r['peak'], 1):9.2f}  {', '.join(r['held']) or '-'}", flush=True)


if __name__ == "__main__":
    main()
