"""Wrong without an error (issue 17): NaN/Inf weights are refused by every merge and shown as NaN in the
task-vector norms; a checkpoint with no tensors is refused instead of merging into an empty folder."""
from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from forgetlab.core.errors import CheckpointError
from forgetlab.merge import merge_state_dicts, run


def _poisoned_copy(src: Path, dst: Path, name: str, value: float) -> Path:
    """A copy of the HF folder `src` whose tensor `name` holds `value` (NaN or Inf) in two entries."""
    shutil.copytree(src, dst)
    sd = load_file(str(dst / "model.safetensors"))
    t = sd[name].clone()
    t.view(-1)[:2] = value
    sd[name] = t
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


NAME = "model.layers.1.mlp.down_proj.weight"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("method", ["task_arithmetic", "ties", "fapm"])
def test_merging_a_non_finite_finetune_is_refused_and_writes_nothing(tiny_llama, tmp_path, value, method):
    bad = _poisoned_copy(tiny_llama.finetuned["ft0"], tmp_path / "bad", NAME, value)
    recipe = {"method": method, "base": str(tiny_llama.base), "models": [str(bad), str(tiny_llama.finetuned["ft1"])]}
    if method == "fapm":
        recipe["models"] = recipe["models"][:1]
    with pytest.raises(CheckpointError, match=rf"holds NaN/Inf in tensor {NAME} \(2 of 2048 entries\).*nothing "
                                              "was written"):
        run(recipe, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]  # no temporary folder left either


def test_cli_merge_of_a_nan_finetune_exits_2_with_a_message(tiny_llama, tmp_path):
    bad = _poisoned_copy(tiny_llama.finetuned["ft0"], tmp_path / "bad", NAME, float("nan"))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"method": "task_arithmetic", "base": str(tiny_llama.base),
                                      "models": [str(bad)]}))
    proc = subprocess.run([sys.executable, "-m", "forgetlab.cli", "merge", str(recipe), str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "NaN/Inf" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_merge_that_overflows_the_output_dtype_is_refused():
    base = {"w": torch.full((2, 2), 60000.0, dtype=torch.float16)}  # outputs keep the base's dtype
    ft = {"w": torch.full((2, 2), 65000.0, dtype=torch.float16)}
    with pytest.raises(CheckpointError, match="produced NaN/Inf in w .*float16"):
        merge_state_dicts("task_arithmetic", base, [ft], lam=3.0)


def test_task_vector_norms_show_nan_as_nan(tiny_llama, tmp_path):
    from forgetlab.core.taskvectors import task_vector_norms
    from forgetlab.core.pool import ModelPool

    bad = _poisoned_copy(tiny_llama.finetuned["ft0"], tmp_path / "bad", NAME, float("nan"))
    with pytest.warns(UserWarning, match="NaN/Inf"):
        pool = ModelPool(tiny_llama.base, {"bad": str(bad)})
    norms = task_vector_norms(pool, "bad")
    level = norms.by_level()
    row = level[(level["layer"] == 1) & (level["module"] == "mlp")]
    assert len(row) == 1 and math.isnan(float(row["norm"].iloc[0]))
    others = level[~((level["layer"] == 1) & (level["module"] == "mlp"))]
    assert others["norm"].notna().all() and (others["norm"] > 0).all()
    assert math.isnan(norms.total)
    from forgetlab.core.taskvectors import cosine_matrix
    cos = cosine_matrix(pool)
    assert math.isnan(cos.values[0][0]) and math.isnan(cos.norms[0])


def test_a_checkpoint_with_no_tensors_is_refused(tiny_llama, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    save_file({}, str(empty / "model.safetensors"))
    shutil.copy(tiny_llama.base / "config.json", empty / "config.json")
    with pytest.raises(CheckpointError, match="holds no tensors"):
        run({"method": "task_arithmetic", "base": str(empty), "models": [str(empty)]}, tmp_path / "out")
    with pytest.raises(CheckpointError, match="holds no tensors"):
        run({"method": "task_arithmetic", "base": str(tiny_llama.base), "models": [str(empty)]}, tmp_path / "out")
    assert not (tmp_path / "out").exists()
