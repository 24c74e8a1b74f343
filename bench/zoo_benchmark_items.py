"""The zoo's lm-eval tasks as its build wrote them beside the same eval pairs written by today's `choice_items`:
lm-eval accuracy of every model of the pool on both (issue 43: `zoo_code` gave every model the same accuracy).

    python bench/zoo_benchmark_items.py [--pool ~/.forgetlab/zoo/pico/pool.yaml] [--limit 20] [--out DIR]

Prints one table per item set (model × task/metric) and the tasks on which every model scores the same. The
items of a zoo built before issue 43 are the old ones; `--out` (default: a temporary folder) receives the new.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from forgetlab.core.benchmarks import benchmark_pool  # noqa: E402
from forgetlab.core.data import read_task_pairs  # noqa: E402
from forgetlab.core.pool import ModelPool  # noqa: E402
from forgetlab.core.workspace import zoo_dir  # noqa: E402
from forgetlab.zoo.lmtasks import write_lm_tasks  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", default=str(zoo_dir() / "pico" / "pool.yaml"), help="A zoo's pool.yaml.")
    ap.add_argument("--limit", type=int, default=None, help="Items per task (default: all).")
    ap.add_argument("--out", default=None, help="Folder for the items written today (default: a temporary one).")
    args = ap.parse_args()
    pool = ModelPool.from_yaml(args.pool)
    spec = pool.probes.benchmarks
    data = Path(args.pool).parent / "data"
    out = Path(args.out or tempfile.mkdtemp(prefix="zoo-lm-items-"))
    heldout = [p for p in (data / "general_heldout.txt").read_text(encoding="utf-8").split("\n\n") if p.strip()]
    tasks = {t: read_task_pairs(data / f"{t}_eval.jsonl") for t in pool.task_names}
    write_lm_tasks(out, out, heldout, tasks)
    for label, include in (("as built", spec.include), ("written today", str(out))):
        t0 = time.perf_counter()
        table = benchmark_pool(pool, ["base", *pool.model_names], replace(spec, include=include), limit=args.limit,
                               device="cpu", threads=1)
        print(f"\n{label} ({include}; limit {args.limit or 'all'}; {time.perf_counter() - t0:.0f} s, 1 thread)")
        print(table.to_frame().round(3).to_string(index=False))
        print("every model the same on:", ", ".join(table.uniform_tasks()) or "none")


if __name__ == "__main__":
    main()
