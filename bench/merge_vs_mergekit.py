"""Benchmark: forgetlab's streaming merge against mergekit 0.1.5 on a Llama-architecture model.

Creates (in a temporary folder) a random Llama base of ≥100M parameters and three fine-tuned variants
(θ0 + small noise) as safetensors folders, then runs the same TIES and task-arithmetic recipes with
forgetlab and with mergekit, each in its own process (mergekit from its venv: bash tools/mergekit_env.sh).
Prints, side by side, wall time and peak RSS of each and their ratios forgetlab / mergekit, and forgetlab's
merge throughput as a fraction of a plain read-and-write of the same bytes (read all inputs, write one
output, in a separate process too). Also measures forgetlab with 1 and 2 torch threads.

    python bench/merge_vs_mergekit.py [--hidden 768 --layers 12 --vocab 32000] [--repeats 1] [--keep]

Peak RSS is the child's ru_maxrss (file-backed pages of memory-mapped checkpoints count, for both tools).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MK_VENV = Path(os.environ.get("MERGEKIT_VENV", ROOT / ".venv-mergekit"))

LAUNCH = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
dt = time.perf_counter() - t
if p.returncode:
    sys.stderr.write(p.stderr.decode(errors="replace")[-4000:])
    sys.exit(p.returncode)
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": dt, "cpu_seconds": ru.ru_utime + ru.ru_stime, "peak_rss_kb": ru.ru_maxrss}))
"""

FORGETLAB_CHILD = r"""
import sys, torch
torch.set_num_threads(int(sys.argv[3]))
from forgetlab.merge import run
run(sys.argv[1], sys.argv[2], threads=int(sys.argv[3]))
"""

PLAIN_CHILD = r"""
import sys, os
from pathlib import Path
files, out, nbytes = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
buf = bytearray(64 << 20)
view = memoryview(buf)
for f in files:
    with open(f, "rb", buffering=0) as fh:
        while fh.readinto(buf):
            pass
with open(out, "wb", buffering=0) as fh:
    left = nbytes
    while left > 0:
        n = min(left, len(buf))
        fh.write(view[:n])
        left -= n
"""


def make_models(root: Path, hidden: int, layers: int, vocab: int, inter: int, n_variants: int = 3) -> tuple[Path, list[Path], int]:
    """Write a random Llama base and `n_variants` perturbed copies as safetensors folders."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, tie_word_embeddings=False,
                      max_position_embeddings=2048, architectures=["LlamaForCausalLM"])
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in LlamaForCausalLM(cfg).state_dict().items()}
    n_params = sum(int(torch.tensor(s).prod()) for s in shapes.values())
    folders_done = all((root / ("base" if i == 0 else f"ft{i}") / "model.safetensors").exists()
                       for i in range(n_variants + 1))
    g = torch.Generator().manual_seed(0)
    base = {} if folders_done else {k: (torch.ones(s) if k.endswith("norm.weight") else 0.02 * torch.randn(s, generator=g))
            for k, s in shapes.items()}
    folders = [root / ("base" if i == 0 else f"ft{i}") for i in range(n_variants + 1)]
    if all((f / "model.safetensors").exists() for f in folders):  # reuse models made by an earlier --keep run
        for f in folders:
            cfg.save_pretrained(str(f))
        return folders[0], folders[1:], n_params
    paths = []
    for i in range(n_variants + 1):
        folder = folders[i]
        folder.mkdir(parents=True, exist_ok=True)
        cfg.save_pretrained(str(folder))
        if i == 0:
            sd = base
        else:
            gi = torch.Generator().manual_seed(100 + i)
            sd = {k: v + 0.002 * torch.randn(v.shape, generator=gi) for k, v in base.items()}
        save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
        paths.append(folder)
        del sd
    return paths[0], paths[1:], n_params


def measure(cmd: list[str], env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", LAUNCH, *cmd], env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--threads", type=lambda t: [int(x) for x in t.split(",")], default=[1, 2],
                    help="torch thread counts to run forgetlab with (default 1,2).")
    ap.add_argument("--recipes", type=lambda t: t.split(","), default=["task_arithmetic", "ties"],
                    help="Which recipes to run (default task_arithmetic,ties).")
    ap.add_argument("--repeats", type=int, default=1, help="Runs per measurement; the minimum time is kept.")
    ap.add_argument("--workdir", help="Folder for the models (default: a temporary folder, removed at the end).")
    ap.add_argument("--keep", action="store_true", help="Keep the generated models.")
    args = ap.parse_args()

    mk_yaml = MK_VENV / "bin" / "mergekit-yaml"
    if not mk_yaml.exists():
        raise SystemExit(f"mergekit venv missing at {MK_VENV}: run `bash tools/mergekit_env.sh` first.")
    root = Path(args.workdir or tempfile.mkdtemp(prefix="forgetlab-merge-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        base, fts, n_params = make_models(root / "models", args.hidden, args.layers, args.vocab, args.intermediate)
        print(f"models: Llama, {n_params / 1e6:.1f}M parameters, float32, base + {len(fts)} variants "
              f"({time.perf_counter() - t:.0f} s to create)", flush=True)
        recipes = {
            "task_arithmetic": {"merge_method": "task_arithmetic", "base_model": str(base),
                                "models": [{"model": str(p), "parameters": {"weight": 1.0}} for p in fts],
                                "parameters": {"lambda": 0.5}, "dtype": "float32"},
            "ties": {"merge_method": "ties", "base_model": str(base),
                     "models": [{"model": str(p), "parameters": {"weight": 1.0, "density": 0.2}} for p in fts],
                     "parameters": {"lambda": 1.0, "normalize": True}, "dtype": "float32"},
        }
        import yaml
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env_fl = dict(env, PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
        in_bytes = sum((p / "model.safetensors").stat().st_size for p in [base, *fts])
        out_bytes = (base / "model.safetensors").stat().st_size
        files = ",".join(str(p / "model.safetensors") for p in [base, *fts])

        def best(cmd, e, out_dir=None):
            runs = []
            for _ in range(args.repeats):
                if out_dir is not None and Path(out_dir).exists():
                    shutil.rmtree(out_dir)
                runs.append(measure(cmd, e))
            return min(runs, key=lambda r: r["seconds"])

        plain = best([sys.executable, "-c", PLAIN_CHILD, files, str(root / "plain.bin"), str(out_bytes)], env)
        print(f"plain read {in_bytes / 1e9:.2f} GB + write {out_bytes / 1e9:.2f} GB: {plain['seconds']:.2f} s "
              f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)", flush=True)
        rows = []
        for name, rec in recipes.items():
            if name not in args.recipes:
                continue
            rfile = root / f"{name}.yaml"
            rfile.write_text(yaml.safe_dump(rec, sort_keys=False))
            fl = {}
            for threads in args.threads:
                out_dir = root / f"fl-{name}-{threads}"
                fl[threads] = best([sys.executable, "-c", FORGETLAB_CHILD, str(rfile), str(out_dir), str(threads)],
                                   env_fl, out_dir)
                print(f"  forgetlab {name}, {threads} thread(s): {fl[threads]['seconds']:.2f} s "
                      f"(cpu {fl[threads]['cpu_seconds']:.2f} s), {fl[threads]['peak_rss_kb'] / 1024:.0f} MB", flush=True)
            mk_out = root / f"mk-{name}"
            mk = best([str(mk_yaml), str(rfile), str(mk_out), "--no-write-model-card", "--no-copy-tokenizer", "--quiet"],
                      env, mk_out)
            print(f"  mergekit  {name}: {mk['seconds']:.2f} s (cpu {mk['cpu_seconds']:.2f} s), "
                  f"{mk['peak_rss_kb'] / 1024:.0f} MB", flush=True)
            rows.append((name, fl, mk))
        print()
        print(f"{'recipe':<16} {'threads':>7} {'forgetlab s':>11} {'mergekit s':>10} {'time ratio':>10} "
              f"{'cpu ratio':>9} {'forgetlab MB':>12} {'mergekit MB':>11} {'RSS ratio':>9} {'vs plain I/O':>12}")
        for name, fl, mk in rows:
            for threads, r in fl.items():
                print(f"{name:<16} {threads:>7} {r['seconds']:>11.2f} {mk['seconds']:>10.2f} "
                      f"{r['seconds'] / mk['seconds']:>10.2f} {r['cpu_seconds'] / mk['cpu_seconds']:>9.2f} "
                      f"{r['peak_rss_kb'] / 1024:>12.0f} {mk['peak_rss_kb'] / 1024:>11.0f} "
                      f"{r['peak_rss_kb'] / mk['peak_rss_kb']:>9.2f} {plain['seconds'] / r['seconds']:>12.2f}")
        print("\ntime/cpu/RSS ratio = forgetlab / mergekit (lower is better; cpu = user + system seconds of the "
              "process, less sensitive to other load on the machine); 'vs plain I/O' = plain read+write wall time "
              "/ forgetlab wall time (1.0 = as fast as copying the bytes). mergekit ran with its defaults "
              f"(torch's default threads). Load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
