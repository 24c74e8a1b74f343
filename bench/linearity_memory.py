"""Linearity's peak memory on a 134M random Llama as a multiple of the model's bytes, and estimate / measured.

    python bench/linearity_memory.py [--before MAIN_CHECKOUT]

Each run is a fresh process (glibc's mmap threshold fixed at 128 KiB so freed tensors leave the RSS; see
tests/test_linearity_memory.py::measured_peak); peak = anonymous RSS above entry (core.memory.PeakMeter).
With --before, the same job is also run from another checkout (float32, its own code) for comparison.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.test_linearity_memory import _random_pool  # noqa: E402

CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from forgetlab.analysis.linearity import nonlinearity_scores
from forgetlab.core.memory import PeakMeter, ModelSize
from forgetlab.core.pool import ModelPool
import transformers.models.llama.modeling_llama
pool = ModelPool.from_yaml(sys.argv[1]); job = json.loads(sys.argv[2])
est = None
try:
    from forgetlab.core.memory import estimate
    est = estimate("linearity", pool=pool, task="math", **job).total
except Exception:  # a checkout without the linearity estimate
    pass
with PeakMeter("cpu") as m:
    nonlinearity_scores(pool, "math", alphas=(0.0, 0.5), **job)
print(json.dumps({"peak": m.peak, "est": est, "params": ModelSize.of(pool.checkpoint("ft")).parameters, "s": m.seconds}))
"""


def main() -> None:
    """Build the pool in a temporary folder, run each job in a fresh process and print one line per run."""
    import shutil

    tmp = Path(tempfile.mkdtemp(prefix="forgetlab-linmem-"))
    path = _random_pool(tmp, hidden=768, layers=12, inter=2048, heads=12)
    RUNS = [("now", str(ROOT), "float32"), ("now", str(ROOT), "bfloat16")]
    if "--before" in sys.argv:
        RUNS.insert(0, ("before", sys.argv[sys.argv.index("--before") + 1], None))
    for label, root, dtype in RUNS:
        job = dict(model="ft", levels=["model", "layer", "attn", "mlp"], samples=4, batch_size=4)
        if dtype:
            job["dtype"] = dtype
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONPATH": root}
        out = subprocess.run([sys.executable, "-c", CHILD, str(path), json.dumps(job)], capture_output=True, text=True, env=env, cwd=root)
        if out.returncode: print(label, out.stderr[-800:]); continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        p = r["params"]; pk = r["peak"]
        print(f"{label:14s} {dtype or 'float32':9s} peak {pk/2**30:.3f} GiB = {pk/(4*p):.2f}x fp32 bytes = {pk/(2*p):.2f}x bf16 bytes;"
              f" est/meas {r['est']/pk if r['est'] else float('nan'):.2f}; {r['s']:.1f}s; params {p/1e6:.1f}M", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
