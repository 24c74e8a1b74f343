"""Benchmark: every merge method against the read+write limit, at ~27M and at ≥100M parameters (issue 15).

A merge must read every input byte and write the output once, so its floor is a plain read of the input
files plus a write of one output. For each model size this script makes (in a temporary folder, with
bench/merge_vs_mergekit.py's `make_models`) a random float32 Llama base and three fine-tuned variants, then
in ONE child process measures the plain read+write and every method with `forgetlab.merge.run`, interleaved
and repeated (best of --repeats; a first task-arithmetic merge warms the imports up and is not counted), and
reports each method's time as a share of that limit (limit time / method time: 1.0 = as fast as copying the
bytes). Each method then runs once more in its own process for its peak RSS, and mergekit 0.1.5 (its own
venv) runs the methods it has, in its own process, for its wall time (including its start-up) and peak RSS.

    python bench/merge_limit.py [--sizes 27M,100M] [--repeats 3] [--device cuda] [--no-mergekit] [--no-rss] [--keep] [--only ROWS]

Prints one table, the torch threads used and the load average at the start and at the end (the machine is
shared: compare shares, not seconds).
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from merge_vs_mergekit import MK_VENV, make_models, measure  # noqa: E402

# (label, method, params, number of fine-tuned models)
ROWS = [
    ("task_arithmetic", "task_arithmetic", {}, 3),
    ("ties keep 0.2", "ties", {"keep": 0.2}, 3),
    ("ties global", "ties", {"keep": 0.2, "scope": "global"}, 3),
    ("dare_ties drop 0.9", "dare_ties", {"drop": 0.9}, 3),
    ("dare_linear drop 0.9", "dare_linear", {"drop": 0.9}, 3),
    ("breadcrumbs", "breadcrumbs", {"keep": 0.1, "gamma": 0.01}, 3),
    ("consensus", "consensus", {}, 3),
    ("fapm 0.9 fapm", "fapm", {"ratio": 0.9, "score": "fapm"}, 3),
    ("fapm 0.9 magnitude", "fapm", {"ratio": 0.9, "score": "magnitude"}, 3),
    ("fapm 0.9 relative", "fapm", {"ratio": 0.9, "score": "relative"}, 3),
    ("pcb tensor", "pcb", {"scope": "tensor"}, 3),
    ("pcb global", "pcb", {"scope": "global"}, 3),
    ("hma", "hma", {"alphas": [0.1, 0.2, 0.3]}, 1),
    # mergekit 0.1.5's methods (issue 25), with mergekit's defaults unless a knob must be set to do any work
    ("slerp t 0.5", "slerp", {"t": 0.5}, 1),
    ("linear", "linear", {}, 3),
    ("passthrough", "passthrough", {}, 0),
    ("nuslerp", "nuslerp", {}, 2),
    ("multislerp", "multislerp", {}, 3),
    ("karcher", "karcher", {}, 3),
    ("model_stock", "model_stock", {}, 3),
    ("arcee_fusion", "arcee_fusion", {}, 1),
    ("nearswap t 1e-4", "nearswap", {"t": 1e-4}, 1),
    ("ram", "ram", {}, 3),
    ("ramplus_tl", "ramplus_tl", {}, 3),
    ("sce select_topk 0.5", "sce", {"select_topk": 0.5}, 3),
    ("della density 0.5", "della", {"density": 0.5}, 3),
    ("della_linear density 0.5", "della_linear", {"density": 0.5}, 3),
    ("breadcrumbs_ties density 0.3", "breadcrumbs_ties", {"density": 0.3, "gamma": 0.01}, 3),
]
# the closed-form merges of issue 26 (regmean / regmean_pp / fisher need a pool and probe passes, knots LoRA adapters:
# they are not streaming-only merges and are left out here)
CLOSED_FORM_ROWS = [
    ("lines", "lines", {}, 3),
    ("tsv", "tsv", {}, 3),
    ("iso_c", "iso_c", {}, 3),
    ("iso_cts", "iso_cts", {}, 3),
    ("cart", "cart", {}, 3),
    ("localize_stitch global", "localize_stitch", {}, 3),
    ("localize_stitch tensor", "localize_stitch", {"scope": "tensor"}, 3),
]
ROWS = ROWS + CLOSED_FORM_ROWS
GLOBAL = {"ties global", "pcb global", "localize_stitch global"}
# issue 25's aim for mergekit's methods: at least 0.3 of the limit
MERGEKIT_NEW = {label for label, *_ in ROWS[ROWS.index(("slerp t 0.5", "slerp", {"t": 0.5}, 1)):ROWS.index(CLOSED_FORM_ROWS[0])]}

# Model shapes (hidden, layers, vocabulary, intermediate): 27.5M and 106M parameters.
SIZES = {"27M": (256, 14, 32000, 688), "100M": (768, 8, 32000, 2048), "smoke": (64, 3, 4000, 172)}

TIMING_CHILD = r"""
import json, os, shutil, sys, time
import torch
spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
from forgetlab.merge import run
files, out_bytes, rows, work = spec["files"], spec["out_bytes"], spec["rows"], spec["work"]

def plain():
    buf = bytearray(64 << 20)
    view = memoryview(buf)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
    out = os.path.join(work, "plain.bin")
    with open(out, "wb", buffering=0) as fh:
        left = out_bytes
        while left > 0:
            n = min(left, len(buf))
            fh.write(view[:n])
            left -= n
    os.remove(out)

def python_read():
    # the issue's plain read+write: each file read whole into new bytes (page faults on fresh memory), the
    # output written from one of them; slower than reading into a reused buffer
    data = [open(f, "rb").read() for f in files]
    out = os.path.join(work, "plain.bin")
    with open(out, "wb") as fh:
        fh.write(memoryview(data[0])[:out_bytes])
    os.remove(out)

def merge(recipe):
    out = os.path.join(work, "out")
    shutil.rmtree(out, ignore_errors=True)
    run(recipe, out, threads=spec["threads"], device=spec["device"])
    shutil.rmtree(out, ignore_errors=True)

merge(rows[0][1])  # warm-up: imports, first page-cache fill
times = {"limit": [], "limit_read": []}
for _ in range(spec["repeats"]):
    t = time.perf_counter(); plain(); times["limit"].append(time.perf_counter() - t)
    t = time.perf_counter(); python_read(); times["limit_read"].append(time.perf_counter() - t)
    for label, recipe in rows:
        t = time.perf_counter(); merge(recipe); times.setdefault(label, []).append(time.perf_counter() - t)
print(json.dumps(times))
"""

FORGETLAB_CHILD = r"""
import sys, torch
torch.set_num_threads(int(sys.argv[3]))
from forgetlab.merge import run
run(sys.argv[1], sys.argv[2], threads=int(sys.argv[3]))
"""


def _recipe(method, params, base, fts, n):
    return {"method": method, "base": str(base), "models": [{"model": str(p)} for p in fts[:n]], "params": params}


def bench_size(size: str, root: Path, args, env_fl: dict, env: dict) -> list[dict]:
    import yaml
    from forgetlab.merge.mergekit_export import to_mergekit
    from forgetlab.merge.mergekit_params import mergekit_methods
    from forgetlab.merge.recipe_io import load_recipe

    hidden, layers, vocab, inter = SIZES[size]
    t = time.perf_counter()
    base, fts, n_params = make_models(root / f"models-{size}", hidden, layers, vocab, inter)
    print(f"[{size}] Llama, {n_params / 1e6:.1f}M parameters, float32, base + {len(fts)} variants "
          f"({time.perf_counter() - t:.0f} s to create); load average {os.getloadavg()[0]:.1f}", flush=True)
    files = [str(p / "model.safetensors") for p in [base, *fts]]
    rows = [(label, _recipe(m, p, base, fts, n)) for label, m, p, n in ROWS
            if not args.only or any(label.startswith(o) for o in args.only) or label == "task_arithmetic"]
    spec = {"files": files, "out_bytes": (base / "model.safetensors").stat().st_size, "rows": rows,
            "work": str(root), "repeats": args.repeats, "threads": args.threads, "device": args.device}
    p = subprocess.run([sys.executable, "-c", TIMING_CHILD, json.dumps(spec)], env=env_fl, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"timing child failed:\n{p.stderr[-4000:]}")
    times = json.loads(p.stdout.strip().splitlines()[-1])
    limit, limit_read = min(times["limit"]), min(times["limit_read"])
    print(f"[{size}] read+write limit {limit:.3f} s into a reused buffer, {limit_read:.3f} s by Python read() "
          f"(best of {args.repeats})", flush=True)
    out = []
    for label, recipe in rows:
        r = {"size": size, "params_m": n_params / 1e6, "label": label, "seconds": min(times[label]), "limit": limit,
             "limit_read": limit_read}
        rfile = root / f"{size}-{label.replace(' ', '_')}.yaml"
        rfile.write_text(yaml.safe_dump(recipe, sort_keys=False))
        if args.rss:
            out_dir = root / "rss-out"
            shutil.rmtree(out_dir, ignore_errors=True)
            fl = measure([sys.executable, "-c", FORGETLAB_CHILD, str(rfile), str(out_dir), str(args.threads)], env_fl)
            shutil.rmtree(out_dir, ignore_errors=True)
            r["fl_process_s"], r["fl_rss_mb"] = fl["seconds"], fl["peak_rss_kb"] / 1024
        rec = load_recipe(recipe)
        if args.mergekit and rec.method in mergekit_methods() and rec.validated_params().get("scope", "tensor") == "tensor":
            mk_file = root / f"mk-{rfile.name}"
            mk_file.write_text(yaml.safe_dump(to_mergekit(rec), sort_keys=False))
            mk_out = root / "mk-out"
            shutil.rmtree(mk_out, ignore_errors=True)
            mk = measure([str(MK_VENV / "bin" / "mergekit-yaml"), str(mk_file), str(mk_out), "--no-write-model-card",
                          "--no-copy-tokenizer", "--quiet"], env)
            shutil.rmtree(mk_out, ignore_errors=True)
            r["mk_s"], r["mk_rss_mb"] = mk["seconds"], mk["peak_rss_kb"] / 1024
        print(f"[{size}] {label}: {r['seconds']:.3f} s, share {limit / r['seconds']:.2f} "
              f"(of the read() limit {limit_read / r['seconds']:.2f})"
              + (f", own process {r['fl_process_s']:.1f} s / {r['fl_rss_mb']:.0f} MB" if "fl_rss_mb" in r else "")
              + (f", mergekit {r['mk_s']:.1f} s / {r['mk_rss_mb']:.0f} MB" if "mk_s" in r else ""), flush=True)
        out.append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=lambda t: t.split(","), default=["27M", "100M"], help="27M and/or 100M.")
    ap.add_argument("--repeats", type=int, default=3, help="Interleaved repeats in the timing process (best kept).")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for forgetlab (the engine's default: 1).")
    ap.add_argument("--device", default="cpu", help="Where forgetlab merges (e.g. cuda; the limit is the files' "
                    "read+write either way).")
    ap.add_argument("--no-mergekit", dest="mergekit", action="store_false")
    ap.add_argument("--no-rss", dest="rss", action="store_false", help="Skip the per-method processes (peak RSS).")
    ap.add_argument("--workdir", help="Folder for the models (default: a temporary folder, removed at the end).")
    ap.add_argument("--keep", action="store_true", help="Keep the generated models.")
    ap.add_argument("--only", type=lambda t: [x.strip() for x in t.split(",") if x.strip()], default=None,
                    help="Run only the rows whose labels start with one of these (comma separated), e.g. slerp,della; "
                         "task_arithmetic always runs (the multiples use it).")
    args = ap.parse_args()
    if args.mergekit and not (MK_VENV / "bin" / "mergekit-yaml").exists():
        raise SystemExit(f"mergekit venv missing at {MK_VENV}: run `bash tools/mergekit_env.sh` or pass --no-mergekit.")
    load0 = os.getloadavg()
    print(f"torch threads: {args.threads} (forgetlab; mergekit with its defaults); load average at start "
          f"{load0[0]:.1f} / {load0[1]:.1f} / {load0[2]:.1f} on {os.cpu_count()} CPUs", flush=True)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="forgetlab-merge-limit-"))
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env_fl = dict(env, PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    env.pop("PYTHONPATH", None)
    results = []
    try:
        for size in args.sizes:
            results += bench_size(size, root, args, env_fl, env)
            if not args.keep:
                shutil.rmtree(root / f"models-{size}", ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print("| method | size | forgetlab s | share of limit (reused buffer) | share of limit (Python read()) | aim | "
          "mergekit s (own process) | mergekit share | forgetlab s (own process) | peak RSS forgetlab / mergekit MB "
          "| RSS ratio | × task_arithmetic time | × task_arithmetic peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ta = {r["size"]: r for r in results if r["label"] == "task_arithmetic"}
    for r in results:
        share = r["limit"] / r["seconds"]
        aim = 0.2 if r["label"] in GLOBAL else 0.3 if r["label"] in MERGEKIT_NEW else 0.4
        mk = f"{r['mk_s']:.1f}" if "mk_s" in r else "—"
        mk_share = f"{r['limit'] / r['mk_s']:.3f}" if "mk_s" in r else "—"
        fl_p = f"{r['fl_process_s']:.1f}" if "fl_process_s" in r else "—"
        rss = (f"{r['fl_rss_mb']:.0f} / {r['mk_rss_mb']:.0f}" if "mk_rss_mb" in r and "fl_rss_mb" in r else
               f"— / {r['mk_rss_mb']:.0f}" if "mk_rss_mb" in r else
               (f"{r['fl_rss_mb']:.0f} / —" if "fl_rss_mb" in r else "—"))
        ratio = f"{r['fl_rss_mb'] / r['mk_rss_mb']:.2f}" if "mk_rss_mb" in r and "fl_rss_mb" in r else "—"
        print(f"| {r['label']} | {r['params_m']:.0f}M | {r['seconds']:.2f} | **{share:.2f}** | "
              f"{r['limit_read'] / r['seconds']:.2f} | {aim} | {mk} | {mk_share} | "
              f"{fl_p} | {rss} | {ratio} | {r['seconds'] / ta[r['size']]['seconds']:.2f} | "
              + (f"{r['fl_rss_mb'] / ta[r['size']]['fl_rss_mb']:.2f} |" if "fl_rss_mb" in r else "— |"))
    load1 = os.getloadavg()
    print(f"\nshare of limit = (plain read of the 4 input files + write of one output, best of {args.repeats}, in the "
          "same process) / (forgetlab.merge.run, best of the same interleaved repeats); 1.0 = as fast as copying the "
          "bytes. Two plain reads: into one reused 64 MiB buffer (the tightest floor), and each file by Python "
          "read() into new bytes (the issue's measurement, which pays a page fault per 4 KiB). mergekit s and the own-process columns include interpreter start-up (mergekit ~10 s of imports). "
          f"torch threads {args.threads}. Load average at the end {load1[0]:.1f} / {load1[1]:.1f} / {load1[2]:.1f} "
          f"on {os.cpu_count()} CPUs.")


if __name__ == "__main__":
    main()
