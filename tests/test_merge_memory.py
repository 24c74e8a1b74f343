"""The merge's and PCB λ search's memory: their estimates (against measured peaks), --dry-run, the dtype their
evaluations run in, and one model held at a time while a merge is scored."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from forgetlab.cli import main
from forgetlab.core.memory import ModelSize, estimate
from forgetlab.merge.memory import merge_parts, working_units
from forgetlab.merge.registry import METHODS
from tests.test_linearity_memory import _random_pool


def _recipe_file(tmp_path, pool_like, method="ties", models=("ft0", "ft1")) -> Path:
    path = tmp_path / f"{method}.yaml"
    lines = "".join(f"  - model: {pool_like.finetuned[m]}\n" for m in models)
    path.write_text(f"method: {method}\nbase: {pool_like.base}\nmodels:\n{lines}")
    return path


# ------------------------------------------------------------------------------------------ the estimate's parts


def test_merge_parts_are_the_tensors_read_plus_the_methods_working_set():
    E = 1000
    f32 = merge_parts(E, 4, 3, "ties")
    assert f32["tensors read (base + fine-tunes)"] == 4 * E * 4           # a float32 tensor is read in place
    a, b = METHODS["ties"].memory.fast                                   # as ties declares it
    assert f32["ties's working tensors"] == int((a + 3 * b) * E * 4)
    bf16 = merge_parts(E, 2, 3, "ties")
    assert bf16["tensors read (base + fine-tunes)"] == 4 * E * (2 + 4)    # raw bf16 bytes + their float32 copy
    gpu = merge_parts(E, 2, 3, "ties", on_gpu=True)
    assert gpu["tensors read (base + fine-tunes)"] == 4 * E * 4           # on the device: the float32 copies
    assert gpu["ties's working tensors"] == int(working_units("ties", 3, reference=True) * E * 4)
    assert working_units("pcb", 3) > working_units("pcb", 2)               # PCB's statistics grow with N
    unknown = merge_parts(E, 4, 3, "a_plugin")
    assert unknown["a_plugin's working tensors"] >= max(working_units(m, 3) for m in METHODS) * E * 4
    kept = merge_parts(E, 4, 3, "ties", resident=123)
    assert kept["inputs kept on the device (global pass)"] == 123


def test_merge_estimate_grows_with_the_models_and_its_evaluation_phase_follows_the_dtype(tiny_llama, tmp_path):
    from forgetlab.core.pool import ModelPool

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    one = estimate("merge", recipe=_recipe_file(tmp_path, tiny_llama, models=("ft0",)))
    two = estimate("merge", recipe=_recipe_file(tmp_path, tiny_llama))
    assert two.total > one.total and all(k.startswith("merging: ") for k in two.parts)
    size = ModelSize.of(pool.checkpoint("base"))
    kw = dict(recipe=_recipe_file(tmp_path, tiny_llama), pool=pool, evaluate=True, max_general=4, max_task=4)
    f32 = estimate("merge", dtype="float32", **kw)
    bf = estimate("merge", dtype="bfloat16", **kw)
    # the tiny model's scoring outweighs its merge: the estimate is the evaluating phase, in the job's dtype
    assert f32.parts["evaluating: weights"] == size.bytes(torch.float32)
    assert bf.parts["evaluating: weights"] == size.bytes(torch.bfloat16) and bf.dtype == "bfloat16"
    assert f32.fixes[0].startswith("--dtype bfloat16")
    with pytest.raises(Exception, match="pool"):
        estimate("merge", recipe=_recipe_file(tmp_path, tiny_llama), evaluate=True)


CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from forgetlab.core.memory import PeakMeter, estimate
import forgetlab.merge.engine, forgetlab.merge.memory  # noqa: F401  (the merge code, before the meter starts)
from forgetlab.merge import METHODS, run
METHODS.discover()  # every method's module, imported before the meter starts
recipe, out = sys.argv[1], sys.argv[2]
est = estimate("merge", recipe=recipe).total
with PeakMeter("cpu") as meter:
    run(recipe, out)
print(json.dumps({"peak": meter.peak, "estimate": est}))
"""


@pytest.fixture(scope="module")
def pool_10m(tmp_path_factory):
    """A random Llama whose untied embedding and head (32000 × 256) are most of its weights, and two fine-tunes."""
    root = tmp_path_factory.mktemp("merge10m")
    pool_yaml = _random_pool(root, hidden=256, layers=2, inter=688, heads=4)
    from safetensors.torch import load_file, save_file

    ft = root / "ft"
    (root / "ft2").mkdir()
    for f in ft.iterdir():                         # a second fine-tune: the first one's weights, flipped noise
        if f.suffix == ".safetensors":
            base = load_file(str(root / "base" / f.name))
            save_file({k: 2 * base[k] - v for k, v in load_file(str(f)).items()}, str(root / "ft2" / f.name),
                      metadata={"format": "pt"})
        else:
            (root / "ft2" / f.name).write_bytes(f.read_bytes())
    return root, pool_yaml


@pytest.mark.parametrize("method", ["task_arithmetic", "ties", "linear", "pcb"])
def test_merge_estimate_matches_the_measured_peak(pool_10m, method, tmp_path):
    """Estimate within ±35 % of the merge's peak (anonymous RSS above the imported merge code, glibc's mmap
    threshold fixed as tests/test_linearity_memory.py::measured_peak does) on a random Llama whose largest tensors
    are 8.2M entries."""
    root, _ = pool_10m
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"method: {method}\nbase: {root / 'base'}\nmodels:\n  - model: {root / 'ft'}\n"
                      f"  - model: {root / 'ft2'}\n")
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONPATH": repo}
    out = subprocess.run([sys.executable, "-c", CHILD, str(recipe), str(tmp_path / "out")], capture_output=True,
                         text=True, env=env, check=True, cwd=repo)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0.65 <= d["estimate"] / d["peak"] <= 1.35, d


# ------------------------------------------------------------------------------------------ the CLI


def test_merge_dry_run_prints_the_estimate_writes_nothing_and_a_merge_that_does_not_fit_stops(
        tiny_llama, tmp_path, capsys, monkeypatch):
    recipe = _recipe_file(tmp_path, tiny_llama)
    out = tmp_path / "merged"
    assert main(["merge", str(recipe), str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "merge in float32 needs ≈" in text and "merging: tensors read" in text and "fits" in text
    assert not out.exists()
    assert main(["merge", str(recipe), str(out), "--eval", "--pool", str(tiny_llama.pool_yaml), "--dtype",
                 "bfloat16", "--max-general", "2", "--max-task", "2", "--dry-run"]) == 0
    assert "merge in bfloat16 needs ≈" in capsys.readouterr().out and not out.exists()
    assert main(["merge", str(recipe), str(out), "--dtype", "bfloat16"]) == 2
    assert "--dtype sets the precision the merge is scored in" in capsys.readouterr().err
    import forgetlab.core.memory as memory

    monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1024)
    assert main(["merge", str(recipe), str(out)]) == 2
    assert "will not fit" in capsys.readouterr().err and not out.exists()


def test_pcb_search_dry_run_and_its_dtype(tiny_llama, tmp_path, capsys, monkeypatch):
    recipe = _recipe_file(tmp_path, tiny_llama, method="pcb")
    args = ["pcb-search", str(recipe), "--pool", str(tiny_llama.pool_yaml), "--budget", "2"]
    assert main([*args, "--dtype", "bfloat16", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "pcb_search in bfloat16 needs ≈" in text and "PCB components" in text
    import forgetlab.analysis.lambda_search as lambda_search       # loads its working copy with load_model

    seen = []
    real = lambda_search.load_model
    monkeypatch.setattr(lambda_search, "load_model", lambda *a, **k: seen.append(k.get("dtype")) or real(*a, **k))
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))      # the command saves its run (issue 42)
    assert main([*args, "--dtype", "bfloat16"]) == 0
    assert seen == [torch.bfloat16]                       # the working copy that scores each λ
    import forgetlab.core.memory as memory

    monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1024)
    assert main(args) == 2
    assert "will not fit" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ scoring a merge


def test_merge_is_scored_in_the_jobs_dtype_one_model_at_a_time(tiny_llama, tmp_path):
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.workflow import merge_and_evaluate

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    kept = pool.load("ft0")                               # loaded by the caller: stays loaded
    held = []
    real = pool.load

    def load(name, device=None, dtype=torch.float32):
        held.append((len(pool._loaded), dtype))
        return real(name, device=device, dtype=dtype)

    pool.load = load
    kw = dict(max_general=2, max_task=3)
    _, bf = merge_and_evaluate(_recipe_file(tmp_path, tiny_llama), tmp_path / "bf", pool, dtype="bfloat16", **kw)
    assert {d for _, d in held} == {torch.bfloat16}
    assert max(n for n, _ in held) <= 1                  # the caller's model only, never another one the job loaded
    assert list(pool._loaded) == [("ft0", "cpu", torch.float32)] and pool._loaded[("ft0", "cpu", torch.float32)] is kept
    _, f32 = merge_and_evaluate(_recipe_file(tmp_path, tiny_llama), tmp_path / "f32", pool, **kw)
    for a, b in zip(bf, f32):
        assert a.general_loss == pytest.approx(b.general_loss, rel=0.02)
    assert f32[-1].general_loss != bf[-1].general_loss     # two precisions, two sets of numbers


def test_slwm_weights_dry_run_prints_its_estimate(tiny_llama, capsys, monkeypatch):
    from forgetlab.core.pool import ModelPool

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    est = estimate("slwm_weights", pool=pool)
    assert est.total == int(2.4 * ModelSize.of(pool.checkpoint("base")).bytes("float32"))
    assert main(["slwm-weights", str(tiny_llama.pool_yaml), "--dry-run"]) == 0
    assert "slwm_weights in float32 needs ≈" in capsys.readouterr().out
    import forgetlab.core.memory as memory

    monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1024)
    assert main(["slwm-weights", str(tiny_llama.pool_yaml)]) == 2
    assert "will not fit" in capsys.readouterr().err


def test_a_gpu_job_whose_host_cannot_hold_its_part_does_not_fit(tiny_llama, tmp_path, monkeypatch):
    """On cuda, PCB's λ search keeps its state dicts and a pool merge its statistics on the host: a host too small
    for them shows as a part of its own (`core.memory.host_shortfall`), so the estimate does not fit."""
    import forgetlab.analysis.lambda_search  # noqa: F401  (registers the "pcb_search" estimate)
    import forgetlab.core.memory as memory
    from forgetlab.core.pool import ModelPool

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    pcb = _recipe_file(tmp_path, tiny_llama, method="pcb")
    fisher = tmp_path / "fisher.yaml"
    fisher.write_text(pcb.read_text().replace("method: pcb", "method: fisher") + f"pool: {tiny_llama.pool_yaml}\n")
    for job, kw in (("pcb_search", dict(pool=pool, recipe=pcb)), ("merge", dict(recipe=fisher))):
        roomy = estimate(job, device="cuda", **kw)
        assert not any(k.startswith(("host memory short", "merging: host memory short")) for k in roomy.parts)
        monkeypatch.setattr(memory, "free_bytes", lambda device="cpu": 1024)
        short = estimate(job, device="cuda", **kw)
        monkeypatch.undo()
        [part] = [k for k in short.parts if "host memory short" in k]
        assert "needs" in part and "free)" in part and not short.fits
