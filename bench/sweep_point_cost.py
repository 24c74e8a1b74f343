"""Time per point of a FAPM pruning sweep against a WiSE-FT α sweep: same model, same number of points, same
evaluation budget (issue 28: the FAPM point should cost ≤ 1.5× a WiSE-FT point; measured on the GPU: 2.8×).

    python bench/sweep_point_cost.py [--size 20M|100M] [--points 3] [--zoo DIR] [--device cuda]

Builds the random Llama pool of bench/memory.py (a base and a second random model as the fine-tune, the pico
zoo's tokenizer and probes), runs `alpha_curve` and `pruning_curve(scores=["fapm"])` in this process with one
thread, each once to warm up and once timed, and prints seconds per point and their ratio. Also times the
weight writing alone (`WorkingCopy.set` with each point's merger) to separate it from the evaluation.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="20M", choices=["20M", "100M"])
    ap.add_argument("--points", type=int, default=3)
    ap.add_argument("--zoo", default=str(Path(os.environ.get("FORGETLAB_HOME", Path.home() / ".forgetlab"))
                                         / "zoo" / "pico"), help="a pool folder whose base tokenizer, data/ and "
                    "pool.yaml probes (with a task named math) the random pool borrows (default: the pico zoo)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda: where the sweeps run (in float32)")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from memory import make_pool

    from forgetlab.analysis.sweeps import _pruned, wise_ft_at, alpha_curve, pruning_curve
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.working_copy import WorkingCopy

    with tempfile.TemporaryDirectory(prefix="forgetlab-cost-") as tmp:
        os.environ["FORGETLAB_HOME"] = tmp
        pool = ModelPool.from_yaml(make_pool(Path(tmp), a.size, Path(a.zoo)))
        xs = [(i + 1) / (a.points + 1) for i in range(a.points)]
        budget = dict(task="math", max_general=4, max_task=4, device=a.device, dtype="float32")
        sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
        runs = {"wise-ft (alpha)": lambda: alpha_curve(pool, "math", alphas=xs, **budget),
                "fapm (pruning)": lambda: pruning_curve(pool, "math", ratios=xs, scores=["fapm"], **budget)}
        per_point = {}
        for name, fn in runs.items():
            fn()
            sync()
            t0 = time.perf_counter()
            res = fn()
            sync()
            per_point[name] = (time.perf_counter() - t0) / len(res.points)
        work = WorkingCopy.load(pool, "math", device=a.device)
        writes = {}
        for name, make in (("wise-ft (alpha)", wise_ft_at), ("fapm (pruning)", lambda x: _pruned(x, "fapm"))):
            t0 = time.perf_counter()
            for x in xs:
                work.set(make(x), [work.tuned])
            sync()
            writes[name] = (time.perf_counter() - t0) / len(xs)
    print(f"{a.size} random Llama on {a.device}, {a.points} points, 4 held-out blocks + 4 pairs per task, 1 thread")
    for name in runs:
        print(f"{name:18s} {per_point[name]:7.2f} s/point (writing the weights {writes[name]:6.2f} s)")
    w, f = per_point["wise-ft (alpha)"], per_point["fapm (pruning)"]
    print(f"FAPM point / WiSE-FT point: {f / w:.2f} (writes alone: {writes['fapm (pruning)'] / writes['wise-ft (alpha)']:.2f})")


if __name__ == "__main__":
    main()
