"""Device maps (forgetlab.core.devicemap): a sweep on a working copy that accelerate partly offloads to disk (a small
CPU max_memory) gives the same points as on one device, and never touches the checkpoint."""
from __future__ import annotations

import hashlib

import pytest

from forgetlab.analysis.sweeps import wise_ft_at, alpha_curve
from forgetlab.core.devicemap import ParamAccess, Placement, parse_max_memory
from forgetlab.core.errors import ParameterError
from forgetlab.merge.working_copy import WorkingCopy


def test_offloaded_working_copy_sweeps_like_one_device(pool, tiny_llama):
    stored = (tiny_llama.base / "model.safetensors").read_bytes()
    place = Placement("auto", {"cpu": 90_000})          # ~half of the tiny model: the rest goes to disk
    work = WorkingCopy.load(pool, "ft0", device=place)
    where = set(work.model.hf_device_map.values())
    assert "disk" in where and "cpu" in where            # really split between memory and disk
    assert ParamAccess(work.model).offloaded
    work.set(wise_ft_at(1.0), [work.tuned])                    # writes reach offloaded weights
    ft = pool.checkpoint("ft0")
    for name in ("lm_head.weight", "model.layers.1.mlp.down_proj.weight", "model.embed_tokens.weight"):
        assert work.access[name].equal(ft.read(name))
    del work
    kw = dict(alphas=[0.0, 0.6, 1.0], max_general=3, max_task=4)
    one = alpha_curve(pool, "ft0", device="cpu", **kw)
    split = alpha_curve(pool, "ft0", device=place, **kw)
    for a, b in zip(one.points, split.points):
        assert b.general_loss == pytest.approx(a.general_loss, abs=1e-6)
        assert b.distance == pytest.approx(a.distance, abs=1e-6)
        for t in a.scorecard.tasks:
            assert b.scorecard.tasks[t].answer_loss == pytest.approx(a.scorecard.tasks[t].answer_loss, abs=1e-6)
    assert hashlib.sha256((tiny_llama.base / "model.safetensors").read_bytes()).digest() == \
        hashlib.sha256(stored).digest()                  # the offload never wrote into the checkpoint


def test_parse_max_memory():
    assert parse_max_memory("0=20GiB, 1=20GiB,cpu=64GiB") == {0: "20GiB", 1: "20GiB", "cpu": "64GiB"}
    assert parse_max_memory("cpu=1000") == {"cpu": 1000}
    with pytest.raises(ParameterError, match="DEVICE=SIZE"):
        parse_max_memory("20GiB")


def test_eval_cli_with_a_device_map_matches_one_device(tiny_llama, tmp_path):
    import json

    from forgetlab.cli import main

    one, split = tmp_path / "one.json", tmp_path / "split.json"
    common = ["eval", str(tiny_llama.pool_yaml), "--models", "ft1", "--max-general", "3", "--max-task", "4"]
    assert main(common + ["--device", "cpu", "--out", str(one)]) == 0
    assert main(common + ["--device-map", "auto", "--max-memory", "cpu=90000", "--out", str(split)]) == 0
    a, b = json.loads(one.read_text())[0], json.loads(split.read_text())[0]
    assert b["general_loss"] == pytest.approx(a["general_loss"], abs=1e-6)
    for t in a["tasks"]:
        assert b["tasks"][t]["answer_loss"] == pytest.approx(a["tasks"][t]["answer_loss"], abs=1e-6)
    with pytest.raises(SystemExit):
        main(common + ["--device-map", "everywhere"])


def test_bfloat16_working_copy_close_to_float32(pool):
    import torch

    kw = dict(alphas=[0.0, 0.5], device="cpu", max_general=3, max_task=4)
    full = alpha_curve(pool, "ft0", **kw)
    half = alpha_curve(pool, "ft0", dtype=torch.bfloat16, **kw)
    work = WorkingCopy.load(pool, "ft0", device="cpu", dtype=torch.bfloat16)
    assert {p.dtype for p in work.model.parameters()} == {torch.bfloat16}
    for a, b in zip(full.points, half.points):
        assert b.general_loss == pytest.approx(a.general_loss, rel=2e-2)
        assert b.answer_loss() == pytest.approx(a.answer_loss(), rel=2e-2)
    assert any(b.answer_loss() != a.answer_loss() for a, b in zip(full.points, half.points))   # really bfloat16
