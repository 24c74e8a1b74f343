"""features, textdiff and the merge search: their dtype, --dry-run, and memory estimates against measured peaks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from forgetlab.analysis.features import capture_features
from forgetlab.analysis.features_memory import MAPPED, unmapped
from forgetlab.analysis.search import resident_dtype, search
from forgetlab.analysis.textdiff import textdiff
from forgetlab.cli import main
from forgetlab.core.memory import ModelSize, estimate
from tests.test_linearity_memory import _random_pool


def _recipe(pool, models=("ft0",)):
    return {"method": "task_arithmetic", "base": pool.resolve_ref("base"),
            "models": [{"model": pool.resolve_ref(m), "weight": 1.0} for m in models], "params": {"lam": 1.0}}


# ------------------------------------------------------------------------------------------ the dtype


def test_features_run_in_the_dtype_one_model_at_a_time_and_float32_is_unchanged(pool):
    """bfloat16 features come from bfloat16 forward passes, close to float32's; float32 (the CPU's default)
    gives bit for bit what the default gives; the pool's models are released after their features."""
    seen = []
    pool._loaded.clear()
    model = pool.load("ft0", dtype=torch.bfloat16)            # the job takes the pool's model in its dtype
    hook = model.model.layers[1].mlp.register_forward_hook(lambda m, a, o: seen.append(o.dtype))
    bf = capture_features(pool, ["math"], ["base", "ft0"], level="mlp", layer=1, samples=4, dtype="bfloat16")
    hook.remove()
    assert seen == [torch.bfloat16] and not pool._loaded      # released: the job held one model at a time
    f32 = capture_features(pool, ["math"], ["base", "ft0"], level="mlp", layer=1, samples=4, dtype="float32")
    default = capture_features(pool, ["math"], ["base", "ft0"], level="mlp", layer=1, samples=4)
    np.testing.assert_array_equal(default.X, f32.X)
    assert bf.X.dtype == np.float64 and np.abs(bf.X - f32.X).max() < 0.05 * np.abs(f32.X).max()


def test_textdiff_in_bfloat16_is_close_to_float32_and_says_its_dtype(pool, tmp_path):
    kw = dict(lines=["The river flows past the mill.", "Ships carried 42 sacks of salt."], home=tmp_path)
    a = textdiff(pool, "ft0", dtype="float32", **kw)
    b = textdiff(pool, "ft0", dtype="bfloat16", **kw)
    default = textdiff(pool, "ft0", **kw)
    assert a.recipe["dtype"] == "float32" and b.recipe["dtype"] == "bfloat16" and default.recipe["dtype"] == "float32"
    np.testing.assert_array_equal(default.tokens["rise"].to_numpy(), a.tokens["rise"].to_numpy())
    s = a.scored()
    np.testing.assert_allclose(b.scored()["logp_model"], s["logp_model"], atol=0.05)
    assert (b.scored()["kl"] >= 0).all()


def test_search_in_bfloat16_evaluates_a_bfloat16_copy_close_to_float32(pool):
    kw = dict(budget=2, measure="answer_loss", max_general=2, max_task=4, device="cpu")
    a = search(_recipe(pool), pool, dtype="float32", **kw)
    b = search(_recipe(pool), pool, dtype="bfloat16", **kw)
    assert a.settings["dtype"] == "float32" and b.settings["dtype"] == "bfloat16"
    assert b.base_general_loss == pytest.approx(a.base_general_loss, rel=0.02)
    assert b.points[0].general_loss == pytest.approx(a.points[0].general_loss, rel=0.02)


def test_resident_dtype_is_the_jobs_only_where_nothing_is_lost(pool, tmp_path):
    from forgetlab.core.checkpoints import open_checkpoint

    model = pool.load("base", dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    bf16, f32 = open_checkpoint(str(tmp_path / "bf16")), pool.checkpoint("base")
    assert resident_dtype(torch.bfloat16, [bf16, bf16]) == torch.bfloat16     # stored in bf16: kept so
    assert resident_dtype(torch.bfloat16, [bf16, f32]) == torch.float32       # τ of a float32 file needs float32
    assert resident_dtype(torch.float32, [bf16]) == torch.float32


# ------------------------------------------------------------------------------------------ the CLI


@pytest.mark.parametrize("job", ["features", "textdiff", "search"])
def test_cli_dry_run_prints_the_estimate_and_a_job_that_does_not_fit_stops(job, tiny_llama, capsys, tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    pool_yaml = str(tiny_llama.pool_yaml)
    if job == "search":
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(f"method: task_arithmetic\nbase: {tiny_llama.base}\nmodels:\n"
                          f"  - model: {tiny_llama.finetuned['ft0']}\n    weight: 1.0\n")
        args = ["search", str(recipe), "--pool", pool_yaml, "--budget", "2", "--max-general", "2"]
    elif job == "textdiff":
        args = ["textdiff", pool_yaml, "--model", "ft0", "--max-general", "2"]
    else:
        args = ["features", pool_yaml, "--samples", "4"]
    assert main([*args, "--dtype", "bfloat16", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{job} in bfloat16 needs ≈" in out and "free on cpu" in out and "fits" in out
    assert not (tmp_path / "runs").exists()
    import forgetlab.core.memory as memory

    monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1024)
    assert main([*args, "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert "will not fit" in err and "--dtype bfloat16" in err
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------ the estimates


def test_estimate_parts_follow_dtype_batch_models_and_lens(pool):
    size = ModelSize.of(pool.checkpoint("base"))
    f32 = estimate("features", pool=pool, samples=4, dtype="float32")
    bf = estimate("features", pool=pool, samples=4, dtype="bfloat16")
    # float32 weights of a float32 checkpoint stay mapped file pages on the CPU; bfloat16 ones are a copy
    assert f32.parts["weights (one model at a time)" + MAPPED] == size.bytes(torch.float32)
    assert bf.parts["weights (one model at a time)"] == size.bytes(torch.bfloat16)
    assert f32.fixes[0].startswith("--dtype bfloat16") and not bf.fixes
    head = estimate("features", pool=pool, samples=4, dtype="bfloat16", level="head", layer=0, head=0)
    assert head.parts["one batch's forward pass"] > bf.parts["one batch's forward pass"] and head.fixes

    td = dict(lines=["a b c d e f g h"] * 5)
    lens = estimate("textdiff", pool=pool, model="ft0", dtype="bfloat16", **td)
    flat = estimate("textdiff", pool=pool, model="ft0", dtype="bfloat16", lens=False, **td)
    wise = estimate("textdiff", pool=pool, model="ft0", dtype="bfloat16", alpha=0.5, **td)
    assert lens.parts["weights"] == 2 * size.bytes(torch.bfloat16)
    assert flat.parts["one batch's outputs and scores"] < lens.parts["one batch's outputs and scores"]
    assert "--no-lens" in lens.fixes and "--no-lens" not in flat.fixes
    assert wise.parts["weights"] == 2 * size.bytes(torch.bfloat16)       # the WiSE-FT copy is the job's own

    one = estimate("search", recipe=_recipe(pool), pool=pool, dtype="float32", max_general=2, max_task=4)
    two = estimate("search", recipe=_recipe(pool, ("ft0", "ft1")), pool=pool, dtype="float32", max_general=2,
                   max_task=4)
    mapped = "resident base + fine-tunes" + MAPPED
    assert one.parts[mapped] == 2 * size.bytes(torch.float32) and two.parts[mapped] == 3 * size.bytes(torch.float32)
    assert one.parts["working copy"] == size.bytes(torch.float32)
    gpu = estimate("search", recipe=_recipe(pool), pool=pool, device="cuda", dtype="bfloat16", max_general=2,
                   max_task=4)
    assert set(gpu.parts) == {"working copy", "largest evaluation batch"}   # the resident dicts stay on the host
    assert gpu.parts["working copy"] == size.bytes(torch.bfloat16)


CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from forgetlab.core.memory import PeakMeter
from forgetlab.core.pool import ModelPool
import transformers.models.llama.modeling_llama  # noqa: F401  (code and tables of any size of model)
job, kw = sys.argv[2], json.loads(sys.argv[3])
pool = ModelPool.from_yaml(sys.argv[1])
if job == "features":
    from forgetlab.analysis.features import feature_map
    run = lambda: feature_map(pool, perplexity=5, **kw)
elif job == "textdiff":
    from forgetlab.analysis.textdiff import textdiff
    run = lambda: textdiff(pool, "ft", **kw)
else:
    from forgetlab.analysis.search import search
    rec = {"method": "task_arithmetic", "base": pool.resolve_ref("base"),
           "models": [{"model": pool.resolve_ref("ft"), "weight": 1.0}], "params": {"lam": 1.0}}
    run = lambda: search(rec, pool, budget=2, measure="answer_loss", **kw)
with PeakMeter("cpu") as meter:
    run()
print(json.dumps({"peak": meter.peak}))
"""


def _peak(pool_yaml, job: str, kw: dict) -> int:
    """The job's peak (anonymous RSS above entry) in a fresh process with glibc's mmap threshold fixed at
    128 KiB (tests/test_linearity_memory.py::measured_peak says why)."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", CHILD, str(pool_yaml), job, json.dumps(kw)], capture_output=True,
                         text=True, env=env, check=True, cwd=root)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak"]


@pytest.fixture(scope="module")
def pool_20m(tmp_path_factory):
    return _random_pool(tmp_path_factory.mktemp("mem20m"), hidden=256, layers=4, inter=688, heads=4)


@pytest.mark.parametrize("job,dtype", [("features", "bfloat16"), ("textdiff", "float32"), ("textdiff", "bfloat16"),
                                       ("search", "float32"), ("search", "bfloat16")])
def test_estimate_matches_the_measured_peak_on_a_20M_llama(pool_20m, job, dtype):
    """Estimate within ±35 % of the peak on a ~20M random Llama (vocab 32000, float32 checkpoints). What a job
    holds as memory-mapped checkpoint pages (float32 weights read from float32 files) is not in the measured
    RSS, so it is left out of the comparison (`unmapped`). features in float32 is left out: its weights are
    all mapped pages and what remains (one batch of short probe texts, the t-SNE libraries) is a few MiB."""
    from forgetlab.core.pool import ModelPool

    pool = ModelPool.from_yaml(pool_20m)
    kw = {"features": dict(samples=8), "textdiff": dict(max_general=8),
          "search": dict(max_general=4, max_task=4, batch_size=8)}[job]
    kw = dict(kw, dtype=dtype)
    if job == "search":
        est = estimate("search", recipe=_recipe(pool, ("ft",)), pool=pool, **kw)
    else:
        est = estimate(job, pool=pool, **({"model": "ft"} if job == "textdiff" else {}), **kw)
    peak = _peak(pool_20m, job, kw)
    ratio = unmapped(est.parts) / peak
    print(f"{job} {dtype}: peak {peak / 2**20:.1f} MiB, estimate/measured {ratio:.2f}")
    assert 0.65 <= ratio <= 1.35


@pytest.fixture(scope="module")
def pool_small_vocab(tmp_path_factory):
    return _random_pool(tmp_path_factory.mktemp("memtext"), hidden=32, layers=2, inter=64, heads=4, vocab=300)


@pytest.mark.parametrize("shape", ["one line", "many lines"])
def test_textdiff_estimate_matches_the_peak_on_a_long_text(pool_small_vocab, tmp_path, shape):
    """A long text on a tiny model: the token table and the tokenization of the longest line are the peak, not the
    weights. On a 5 MB one-line text the estimate said 845 MiB and the run (its per-token lists, a second copy of
    the scores, the table built from Python lists) held 1.26 GiB beyond its start; the scores now go straight into
    the table's columns, and tokenizing the longest line is a phase of the estimate. Within ±35 %."""
    from tests.conftest import GENERAL

    words = " ".join(GENERAL * (900 if shape == "one line" else 300)).split()     # 330 / 110 thousand tokens
    text = tmp_path / "text.txt"
    if shape == "one line":
        text.write_text(" ".join(words) + "\n")
    else:
        text.write_text("\n".join(" ".join(words[i:i + 12]) for i in range(0, len(words), 12)) + "\n")
    from forgetlab.core.pool import ModelPool

    pool = ModelPool.from_yaml(pool_small_vocab)
    kw = dict(text=str(text), dtype="float32", batch_size=2)      # the batch's activations: a few MiB
    est = estimate("textdiff", pool=pool, model="ft", **kw)
    peak = _peak(pool_small_vocab, "textdiff", kw)
    ratio = unmapped(est.parts) / peak
    print(f"textdiff {shape}: peak {peak / 2**20:.1f} MiB, estimate/measured {ratio:.2f}, parts {est.parts}")
    assert 0.65 <= ratio <= 1.35
