"""What the lm-eval bridge adds over `lm_eval` itself, on the same model folder, task and limit.

Runs, each in a fresh process (imports, task indexing and model loading included, as a user pays them):
  1. the `lm_eval` command: `lm_eval --model hf --model_args pretrained=FOLDER --tasks T --include_path DIR`
  2. `forgetlab eval POOL --models M --lm-eval T --lm-eval-include DIR` (also scores the pool's own probes:
     reported separately with --max-general/--max-task 1 to keep that part small)
and prints both metric tables (they must be equal), the wall times and their ratio.

    .venv/bin/python bench/lm_eval_bridge.py [--pool ~/.forgetlab/zoo/pico/pool.yaml] [--model math]
        [--task zoo_wiki_cloze] [--limit 200]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

BIN = Path(sys.executable).parent


def run(cmd: list[str]) -> tuple[float, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return seconds, out.stdout


def lm_eval_metrics(table: str, task: str) -> dict[str, float]:
    """Metric values from lm_eval's markdown table."""
    metrics, current = {}, None
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 7:
            continue
        if cells[0]:
            current = cells[0]
        if current == task and cells[4] and cells[4] != "Metric" and not set(cells[4]) <= {"-"}:
            metrics[cells[4]] = float(cells[6])
    return metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    home = Path(os.environ.get("FORGETLAB_HOME", "~/.forgetlab")).expanduser()
    ap.add_argument("--pool", default=str(home / "zoo" / "pico" / "pool.yaml"))
    ap.add_argument("--model", default="math", help="pool model name")
    ap.add_argument("--task", default="zoo_wiki_cloze")
    ap.add_argument("--limit", type=int, default=200)
    args = ap.parse_args()
    pool_file = Path(args.pool).expanduser()
    spec = yaml.safe_load(pool_file.read_text())
    include = (pool_file.parent / spec["probes"]["benchmarks"]["include"]).resolve()
    folder = (pool_file.parent / spec["models"][args.model]).resolve()
    print(f"model {folder}, task {args.task}, limit {args.limit}, load average {os.getloadavg()[0]:.2f}")

    t_lm, out_lm = run([str(BIN / "lm_eval"), "--model", "hf", "--model_args", f"pretrained={folder}",
                        "--tasks", args.task, "--include_path", str(include), "--limit", str(args.limit),
                        "--device", "cpu", "--batch_size", "1"])
    ref = lm_eval_metrics(out_lm, args.task)
    with tempfile.TemporaryDirectory() as tmp:
        cards = Path(tmp) / "cards.json"
        t_fl, _ = run([str(BIN / "forgetlab"), "eval", str(pool_file), "--models", args.model, "--lm-eval",
                       args.task, "--lm-eval-include", str(include), "--limit", str(args.limit),
                       "--max-general", "1", "--max-task", "1", "--device", "cpu", "--out", str(cards)])
        ours = json.loads(cards.read_text())[0]["benchmarks"][args.task]
    print(f"lm_eval   : {ref}  ({t_lm:.1f} s)")
    print(f"forgetlab : { {k: round(v, 4) for k, v in ours.items()} }  ({t_fl:.1f} s)")
    same = all(abs(ours[k] - v) < 5e-5 for k, v in ref.items())   # lm_eval prints 4 decimals
    print(f"equal to lm_eval's printed values: {same}")
    print(f"forgetlab eval / lm_eval wall time: {t_fl / t_lm:.2f}×")


if __name__ == "__main__":
    main()
