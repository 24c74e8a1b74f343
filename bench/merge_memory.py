"""Each merge method's peak memory as a multiple of the largest tensor, beside the "merge" estimate (issue 28).

    python bench/merge_memory.py [--methods ties,pcb,…] [--models 2,3] [--zoo DIR] [--reference]

Builds a random Llama (hidden 384, 6 layers, vocab 32000, head untied: the embedding and the head, 12.3M entries
each, are the largest tensors) and three fine-tunes of it (the base plus Gaussian noise), borrowing the pico zoo's
tokenizer (`--zoo`, default $FORGETLAB_HOME/zoo/pico). Each method then merges N of the fine-tunes with its
defaults, each N in a fresh Python process, measured with `forgetlab.core.memory.PeakMeter` (anonymous resident
memory, sampled every 2 ms) above the process after importing forgetlab's merge code. Prints per method and N the
peak in MiB and in units of the largest tensor in float32 (E·4), the estimate (`forgetlab.merge.memory`) in the
same units, estimate / measured, and the method's working memory beyond the N + 1 tensors read, in units of E·4
(what `forgetlab.merge.memory.WORKING` holds).
Methods that take one fine-tune (slerp, nearswap, wise_ft…) merge one; methods that need a pool (fisher, regmean,
slwm) get one naming the models after the zoo's tasks, with its probe data, and the peak includes their prepare
phase (forward passes on the CPU).
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

SIZE = dict(hidden_size=384, num_hidden_layers=6, intermediate_size=1024, num_attention_heads=6)
VOCAB = 32000
LARGEST = VOCAB * SIZE["hidden_size"]


TASKS = ("math", "code", "translate")


def make_models(root: Path, zoo: Path, n: int = 3) -> None:
    """A random base and `n` noisy copies of it (float32 safetensors) with the zoo's tokenizer, and a pool.yaml
    naming them after the zoo's tasks (math: ft0, …) with its probe data, for the methods that need a pool."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(zoo / "base")
    cfg = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=256, tie_word_embeddings=False,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      **SIZE)
    torch.manual_seed(0)
    base = LlamaForCausalLM(cfg)
    base.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    for t in range(n):
        torch.manual_seed(10 + t)
        with torch.no_grad():
            for p in base.parameters():
                p.add_(torch.randn_like(p) * 0.01)
        base.save_pretrained(root / f"ft{t}")
        tok.save_pretrained(root / f"ft{t}")
    shutil.copytree(zoo / "data", root / "data")
    probes = (zoo / "pool.yaml").read_text().split("probes:", 1)[1]
    members = "".join(f"  {task}: ft{t}\n" for t, task in enumerate(TASKS[:n]))
    (root / "pool.yaml").write_text(f"name: merge-memory\nbase: base\nmodels:\n{members}probes:{probes}")


def child(root: str, method: str, n: int, reference: bool) -> None:
    """Merge `n` fine-tunes with `method` under a PeakMeter (with `reference`, through the method's reference
    function, as on a GPU, instead of its CPU kernel); print {"peak", "estimate", "code"} as JSON."""
    import torch

    torch.set_num_threads(1)
    from forgetlab.cli import main
    from forgetlab.core.memory import PeakMeter, estimate
    from forgetlab.merge.registry import METHODS, get_method
    import forgetlab.merge.engine  # noqa: F401  (the merge code, imported before the meter starts)
    import transformers.models.llama.modeling_llama  # noqa: F401  (a pool method's forward passes need it)
    from forgetlab.merge.memory import estimate_merge  # noqa: F401

    METHODS.discover()  # every method's module, imported before the meter starts
    if reference:       # every CPU kernel off: the reference functions run, as they do on a GPU
        for name, module in list(sys.modules.items()):
            if name.startswith("forgetlab.merge") and hasattr(module, "on_cpu_fast_path"):
                module.on_cpu_fast_path = lambda *tensors: False
    base = Path(root)
    recipe = base / f"{method}-{n}.yaml"
    models = "".join(f"  - model: {base}/ft{t}\n" for t in range(n))
    extra = ""
    if get_method(method).needs_pool:      # the pool's probe data, each model's task named
        extra = f"pool: {base}/pool.yaml\nparams:\n  tasks: {','.join(TASKS[:n])}\n"
    recipe.write_text(f"method: {method}\nbase: {base}/base\nmodels:\n{models}{extra}")
    out = base / f"out-{method}-{n}"
    est = estimate("merge", recipe=str(recipe)).total
    if reference:       # the GPU's estimate of the working tensors, on the CPU's tensors read
        from forgetlab.merge.memory import working_units

        est += int((working_units(method, n, reference=True) - working_units(method, n)) * LARGEST * 4)
    with PeakMeter("cpu") as meter:
        code = main(["merge", str(recipe), str(out), "--device", "cpu"])
    shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({"peak": meter.peak, "estimate": est, "code": code}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="", help="comma-separated (default: every method that needs no pool)")
    ap.add_argument("--models", default="2,3", help="numbers of fine-tunes to merge (default 2,3)")
    ap.add_argument("--zoo", default=None)
    ap.add_argument("--reference", action="store_true", help="merge with the reference functions (the GPU's "
                    "path) instead of the CPU kernels")
    args = ap.parse_args()
    from forgetlab.core.workspace import home
    from forgetlab.merge import METHODS

    zoo = Path(args.zoo) if args.zoo else home() / "zoo" / "pico"
    if not (zoo / "base").exists():
        sys.exit(f"No pico zoo at {zoo}: build it with `forgetlab zoo build` or pass --zoo DIR.")
    methods = args.methods.split(",") if args.methods else list(METHODS)
    counts = [int(x) for x in args.models.split(",")]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    with tempfile.TemporaryDirectory() as tmp:
        make_models(Path(tmp), zoo, max(counts))
        print(f"{'method':18s} {'N':>2s} {'peak MiB':>9s} {'× E·4':>7s} {'estimate':>9s} {'est/meas':>9s} "
              f"{'working':>8s}", flush=True)
        for m in methods:
            spec = METHODS[m]
            ns = sorted({max(spec.min_models, n if spec.max_models is None else min(n, spec.max_models))
                         for n in counts})
            for n in ns:
                r = subprocess.run([sys.executable, __file__, "--methods", "child", tmp, m, str(n),
                                    str(int(args.reference))],
                                   capture_output=True, text=True, env=env)
                try:
                    d = json.loads(r.stdout.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    print(f"{m:18s} {n:2d} failed: {r.stderr.strip().splitlines()[-1:]}", flush=True)
                    continue
                unit = LARGEST * 4
                working = d["peak"] / unit - (1 + n)
                print(f"{m:18s} {n:2d} {d['peak'] / 2**20:9.1f} {d['peak'] / unit:7.2f} {d['estimate'] / unit:9.2f} "
                      f"{d['estimate'] / max(d['peak'], 1):9.2f} {working:8.2f}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1:3] == ["--methods", "child"]:
        child(sys.argv[3], sys.argv[4], int(sys.argv[5]), bool(int(sys.argv[6])))
    else:
        main()
