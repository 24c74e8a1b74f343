"""Attribution's dtype, --dry-run and memory estimate against the peak measured in a fresh process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from forgetlab.analysis.attribution import attribute
from forgetlab.cli import main
from forgetlab.core.memory import ModelSize, estimate
from tests.test_linearity_memory import _random_pool

CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from forgetlab.analysis.attribution import attribute
from forgetlab.core.memory import PeakMeter
from forgetlab.core.pool import ModelPool
import transformers.models.llama.modeling_llama  # noqa: F401
pool = ModelPool.from_yaml(sys.argv[1])
with PeakMeter("cpu") as meter:
    attribute(pool, "ft", task="math", level="layer", select=["0"], **json.loads(sys.argv[2]))
print(json.dumps({"peak": meter.peak}))
"""


def test_bfloat16_map_is_close_to_float32(pool):
    kw = dict(task="math", level="layer", max_general=4, max_task=4)
    a = attribute(pool, "ft0", dtype="float32", **kw).to_frame()
    b = attribute(pool, "ft0", dtype="bfloat16", **kw).to_frame()
    np.testing.assert_allclose(b["general_loss"], a["general_loss"], rtol=0.02)


def test_cli_dry_run_prints_the_estimate(tiny_llama, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    assert main(["attribution", str(tiny_llama.pool_yaml), "--model", "ft0", "--task", "math", "--dtype", "bfloat16",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16" in out and "weights" in out
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_estimate_matches_measured_peak_on_a_20M_llama(tmp_path, dtype):
    """Estimate within ±35 % of the peak (anonymous RSS above entry; fresh process, fixed mmap threshold as in
    tests/test_linearity_memory.py::measured_peak) on a ~20M random Llama, vocab 32000."""
    from forgetlab.core.pool import ModelPool

    path = _random_pool(tmp_path, hidden=256, layers=4, inter=688, heads=4)
    pool = ModelPool.from_yaml(path)
    job = dict(dtype=dtype, batch_size=8, max_general=8, max_task=8)
    est = estimate("attribution", pool=pool, model="ft", task="math", level="layer", select=["0"], **job)
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), json.dumps(job)], capture_output=True, text=True,
                         env=env, check=True, cwd=root)
    peak = json.loads(out.stdout.strip().splitlines()[-1])["peak"]
    own = ModelSize.of(pool.checkpoint("ft")).bytes(dtype)
    print(f"attribution {dtype}: peak {peak / own:.2f}× model, estimate/measured {est.total / peak:.2f}")
    assert 0.65 <= est.total / peak <= 1.35


@pytest.mark.parametrize("batch_size,max_general,max_task", [(4, 3, 5), (16, None, None), (1, 2, 2)])
def test_largest_eval_batch_is_the_largest_batch_evaluate_feeds_the_model(pool, batch_size, max_general, max_task):
    from forgetlab.core.evaluate import evaluate, largest_eval_batch

    model = pool.load("base")
    seen = []
    handle = model.register_forward_pre_hook(lambda mod, args, kw: seen.append(tuple(kw["input_ids"].shape)),
                                             with_kwargs=True)
    try:
        evaluate(model, pool.tokenizer, pool.probes, tasks=["math"], batch_size=batch_size, max_general=max_general,
                 max_task=max_task)
    finally:
        handle.remove()
    rows, seq = largest_eval_batch(pool.tokenizer, pool.probes, tasks=["math"], batch_size=batch_size,
                                   max_general=max_general, max_task=max_task)
    assert rows * seq == max(r * s for r, s in seen)


def test_eval_dtype_and_dry_run(tiny_llama, capsys):
    """`forgetlab eval --dry-run` prints the estimate and evaluates nothing; --dtype bfloat16 evaluates in bf16
    with losses close to float32's."""
    import pandas as pd

    assert main(["eval", str(tiny_llama.pool_yaml), "--models", "base", "--dtype", "bfloat16", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16" in out and "largest batch" in out and "weights" in out
    frames = {}
    for dt in ("float32", "bfloat16"):
        path = Path(str(tiny_llama.root)) / f"eval-{dt}.csv"
        assert main(["eval", str(tiny_llama.pool_yaml), "--models", "base", "--dtype", dt, "--max-general", "4",
                     "--max-task", "4", "--out", str(path)]) == 0
        frames[dt] = pd.read_csv(path)
        path.unlink()
    a, b = frames["float32"], frames["bfloat16"]
    np.testing.assert_allclose(b["general_loss"], a["general_loss"], rtol=0.02)
