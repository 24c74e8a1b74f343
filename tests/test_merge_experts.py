"""Issue 46: a mixture of experts' expert tensors are merged as the fused tensor transformers loads
(forgetlab.merge.experts), so a sweep point (forgetlab.merge.working_copy.TensorMerger on the loaded models' fused
tensors) equals the streaming merge (`forgetlab.merge.run` on the checkpoints, which store one tensor per expert),
and a dense model's merge takes no detour."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from forgetlab.core.checkpoints import TensorInfo
from forgetlab.core.errors import CheckpointError
from forgetlab.merge import merge_state_dicts, run
from forgetlab.merge import experts as ex
from forgetlab.merge.working_copy import TensorMerger
from tests.conftest import make_tiny_pool

FAMILIES = ("mixtral", "olmoe")


@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    root = tmp_path_factory.mktemp("expert-pools")
    return {f: make_tiny_pool(root / f, f) for f in FAMILIES}


def _loaded(folder) -> dict[str, torch.Tensor]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return {k: v.detach().float().clone() for k, v in model.state_dict().items()}


def _ties(paths):
    return {"merge_method": "ties", "base_model": paths[0],
            "models": [{"model": paths[1], "parameters": {"weight": 1.0, "density": 0.3}},
                       {"model": paths[2], "parameters": {"weight": 0.5, "density": 0.3}}],
            "parameters": {"normalize": True}, "dtype": "float32"}


@pytest.mark.parametrize("family", FAMILIES)
def test_sweep_point_equals_the_merge(pools, tmp_path, family):
    """TensorMerger("ties") applied to the loaded base's and fine-tunes' fused expert tensors (what a sweep or an
    attribution merges in memory) equals the fused tensor of the model loaded from forgetlab's merged folder, and
    so do the router and the attention."""
    pool = pools[family]
    paths = [str(p.resolve()) for p in (pool.base, *pool.finetuned.values())]
    result = run(_ties(paths), tmp_path / "merged")
    merged = _loaded(result.out_dir)
    models = [_loaded(p) for p in paths]
    merger = TensorMerger("ties", result.params, n_models=2)
    names = [k for k in merged if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj",
                                              "mlp.gate.weight", "self_attn.q_proj.weight"))]
    assert sum(k.endswith("experts.gate_up_proj") for k in names) == 2 and merged[names[0]].dim() >= 2
    for name in names:
        want = merger(name, *(m[name].clone() for m in models))
        assert float((merged[name] - want).abs().max()) <= 1e-6, name
        assert float((merged[name] - models[0][name]).abs().max()) > 1e-4, name   # the merge moved it


@pytest.mark.parametrize("family", FAMILIES)
def test_global_ties_reads_the_fused_experts(pools, tmp_path, family):
    """TIES with scope: global (one top-k over the whole model, from the statistics pass, which reads the fused
    experts) equals the in-memory merge of the loaded models' state dicts (fused names), and keeps the
    checkpoint's names on disk."""
    pool = pools[family]
    paths = [str(p.resolve()) for p in (pool.base, *pool.finetuned.values())]
    result = run({"method": "ties", "base": paths[0], "models": paths[1:],
                  "params": {"scope": "global", "keep": 0.3}}, tmp_path / "global")
    out = result.out_dir
    assert set(load_file(str(out / "model.safetensors"))) == set(load_file(str(Path(paths[0]) / "model.safetensors")))
    merged, models = _loaded(out), [_loaded(p) for p in paths]
    want = merge_state_dicts("ties", models[0], models[1:], **result.params)
    gate_up = [k for k in merged if k.endswith("experts.gate_up_proj")]
    assert gate_up and float((merged[gate_up[0]] - models[0][gate_up[0]]).abs().max()) > 1e-4
    for name in merged:
        assert float((merged[name] - want[name].float()).abs().max()) <= 1e-6, name


def test_groups_follow_transformers_conversion():
    """Mixtral's w1/w3 (and Qwen2-MoE's gate/up) of expert e fuse, in that order, into expert e's rows of
    gate_up_proj; w2 into down_proj; a dense model has no group; an expert missing is refused."""
    rows, hid = 6, 4
    infos = [TensorInfo(f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight",
                        (hid, rows) if w == "w2" else (rows, hid), torch.float32)
             for e in (1, 0) for w in ("w2", "w3", "w1")]
    groups = ex.expert_groups("mixtral", infos)
    assert set(groups) == {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"}
    g = groups["model.layers.0.mlp.experts.gate_up_proj"]
    assert g.shape == (2, 2 * rows, hid)
    assert g.member_names() == [f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight"
                                for e in (0, 1) for w in ("w1", "w3")]
    fused = torch.arange(2 * 2 * rows * hid, dtype=torch.float32).reshape(g.shape)
    parts = dict(g.split(fused))
    assert torch.equal(parts["model.layers.0.block_sparse_moe.experts.1.w3.weight"], fused[1, rows:])
    assert torch.equal(g.assemble(parts.__getitem__, torch.float32), fused)
    assert [e.name for e in ex.fused_entries(infos, groups)] == ["model.layers.0.mlp.experts.down_proj",
                                                                 "model.layers.0.mlp.experts.gate_up_proj"]
    qwen = ex.expert_groups("qwen2_moe", [TensorInfo(f"model.layers.1.mlp.experts.{e}.{w}.weight", (rows, hid),
                                                     torch.float32) for e in (0, 1) for w in ("up_proj", "gate_proj")])
    assert qwen["model.layers.1.mlp.experts.gate_up_proj"].members[1] == (
        "model.layers.1.mlp.experts.1.gate_proj.weight", "model.layers.1.mlp.experts.1.up_proj.weight")
    assert ex.expert_groups("llama", [TensorInfo("model.layers.0.mlp.up_proj.weight", (rows, hid),
                                                 torch.float32)]) == {}
    with pytest.raises(CheckpointError, match="missing"):
        ex.expert_groups("mixtral", infos[:-1])


def test_dense_merge_is_untouched(tmp_path, monkeypatch):
    """A dense model's merge never wraps its sources (no expert group) and writes the checkpoint's tensors under their
    own names."""
    pool = make_tiny_pool(tmp_path / "llama", "llama")
    paths = [str(p.resolve()) for p in (pool.base, *pool.finetuned.values())]
    monkeypatch.setattr(ex.FusedSource, "__init__", lambda *a, **k: pytest.fail("dense model wrapped"))
    out = run(_ties(paths), tmp_path / "out").out_dir
    assert list(load_file(str(out / "model.safetensors"))) == list(load_file(str(Path(paths[0]) /
                                                                                  "model.safetensors")))


def test_sliced_merge_fuses_the_experts_too(pools, tmp_path):
    """A recipe with slices (layers 0–1 of the three models, then layer 1 again) merges each output layer's experts
    as the fused tensor too: every output tensor equals the plain merge's tensor of its input layer, the repeated
    layer's experts written under layer 2's per-expert names."""
    pool = pools["mixtral"]
    paths = [str(p.resolve()) for p in (pool.base, *pool.finetuned.values())]
    plain = load_file(str(run(_ties(paths), tmp_path / "plain").out_dir / "model.safetensors"))

    def sources(lo):
        return [{"model": paths[0], "layer_range": [lo, 2]},
                {"model": paths[1], "layer_range": [lo, 2], "parameters": {"weight": 1.0, "density": 0.3}},
                {"model": paths[2], "layer_range": [lo, 2], "parameters": {"weight": 0.5, "density": 0.3}}]
    rec = {"merge_method": "ties", "base_model": paths[0], "slices": [{"sources": sources(0)}, {"sources": sources(1)}],
           "parameters": {"normalize": True}, "dtype": "float32"}
    sliced = load_file(str(run(rec, tmp_path / "sliced").out_dir / "model.safetensors"))
    want = {**plain, **{n.replace("layers.1.", "layers.2."): t for n, t in plain.items() if "layers.1." in n}}
    assert set(sliced) == set(want)
    assert any("layers.2.block_sparse_moe.experts.3.w1" in n for n in sliced)
    for name, t in want.items():
        assert float((sliced[name] - t).abs().max()) <= 1e-6, name
