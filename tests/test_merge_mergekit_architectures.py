"""Issue 46: mergekit 0.1.5 parity on every tested decoder family (tests/architectures.FAMILIES), and the
mixture-of-experts router merged like any other tensor.

For each family, a tiny random base and two fine-tunes (tests/conftest.make_tiny_pool) are merged by a TIES and a
SLERP recipe written as mergekit YAML, once by mergekit (ONE `mergekit-multi` call over every family and method, in
its own venv: most of its time is interpreter start-up) and once by `forgetlab.merge.run` from the same YAML; the
outputs must hold the same tensors, equal entry by entry (TIES within 1e-6 as tests/test_merge_mergekit_parity.py,
SLERP within 1e-5 as tests/test_merge_mergekit_yaml_methods.py).

How mergekit 0.1.5 reads each family (docs/methods.md#architectures, "mergekit"): from its JSON architecture
definitions (mergekit/_data/architectures/*.json) for llama, qwen2, qwen3, gpt2, gemma, gemma2, gemma3_text, phi3,
olmo2, granite, mixtral and gpt_neox; by inferring the layout from the transformers model for olmo, qwen2_moe and
olmoe (no JSON definition). Its gpt-neox.json requires the attention buffers that original Pythia checkpoints
carry (attention.bias, attention.masked_bias, attention.rotary_emb.inv_freq) and that transformers 5 no longer
saves, so mergekit is given copies of the GPT-NeoX checkpoints with those buffers added (as in a Pythia file) and
the comparison is over forgetlab's tensors (mergekit's extra ones are exactly those buffers).

Mixtures of experts (docs/methods.md#architectures, "mergekit"): mergekit reads a checkpoint's per-expert tensors
through transformers 5's conversion and merges and writes each layer's experts as ONE fused tensor [E, …];
forgetlab merges the same fused tensor (forgetlab.merge.experts) and writes it back per expert as the checkpoint
stores them, so the outputs are compared as the models transformers loads from them, every tensor within the
tolerances (TIES's top-k and SLERP's angle span all experts of a layer in both).
`test_experts_are_merged_as_the_fused_tensor` checks forgetlab's experts against TIES applied by hand to the fused
tensor, and the output's per-expert names and shapes. SLERP's `mlp` filter reaches Mixtral's router
(`block_sparse_moe.gate` in the file, `mlp.gate` loaded) in both, as mergekit matches filters against transformers
5's names (forgetlab.merge.layers.filter_names).
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from forgetlab.merge import run
from tests.architectures import FAMILIES, MOE_FAMILIES
from tests.conftest import make_tiny_pool
from tests.reference_tools import MERGEKIT_MULTI, reference_env, skip_without_mergekit

pytestmark = skip_without_mergekit(MERGEKIT_MULTI)

INFERRED = ("olmo", "qwen2_moe", "olmoe")
"""Families without a JSON definition in mergekit 0.1.5: it infers their layout from the transformers model."""
NEOX_BUFFERS = ("attention.bias", "attention.masked_bias", "attention.rotary_emb.inv_freq")
# LazyMergekit's SLERP: t by filter, a gradient over the layers for attention and MLP (GPT-NeoX's attention is
# "attention", so it takes the default t: the filters are matched on names, per family)
SLERP_T = [{"filter": "self_attn", "value": [0.2, 0.9]}, {"filter": "mlp", "value": [0.8, 0.3]}, {"value": 0.4}]
TOL = {"ties": 1e-6, "slerp": 1e-5}
METHODS = ("ties", "slerp", "ties_dense")


def _recipes(base: str, a: str, b: str) -> dict[str, dict]:
    return {
        "ties": {"merge_method": "ties", "base_model": base,
                 "models": [{"model": a, "parameters": {"weight": 1.0, "density": 0.3}},
                            {"model": b, "parameters": {"weight": 0.5, "density": 0.3}}],
                 "parameters": {"normalize": True}, "dtype": "float32"},
        "ties_dense": {"merge_method": "ties", "base_model": base,
                       "models": [{"model": a, "parameters": {"weight": 1.0, "density": 1.0}},
                                  {"model": b, "parameters": {"weight": 0.5, "density": 1.0}}],
                       "parameters": {"normalize": True}, "dtype": "float32"},
        "slerp": {"merge_method": "slerp", "base_model": base, "models": [{"model": base}, {"model": a}],
                  "parameters": {"t": SLERP_T}, "dtype": "float32"},
    }


def _with_neox_buffers(src: Path, dst: Path) -> Path:
    """A copy of a GPT-NeoX checkpoint with the attention buffers an original Pythia file carries."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    sd = load_file(str(dst / "model.safetensors"))
    n = cfg["max_position_embeddings"]
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    rot = int(head_dim * cfg.get("rotary_pct", cfg.get("partial_rotary_factor", 1.0)))
    for i in range(cfg["num_hidden_layers"]):
        p = f"gpt_neox.layers.{i}."
        sd[p + NEOX_BUFFERS[0]] = torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n)
        sd[p + NEOX_BUFFERS[1]] = torch.tensor(-1e9)
        sd[p + NEOX_BUFFERS[2]] = 1.0 / 10000 ** (torch.arange(0, rot, 2).float() / rot)
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst



@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    """{family: TinyPool} for every tested family."""
    root = tmp_path_factory.mktemp("arch-pools")
    return {f: make_tiny_pool(root / f, f) for f in FAMILIES}


@pytest.fixture(scope="module")
def mergekit_out(pools, tmp_path_factory):
    """{(family, method): (mergekit output folder, the YAML dict forgetlab merges)}: one mergekit-multi call."""
    root = tmp_path_factory.mktemp("arch-mk")
    docs, ours = [], {}
    for fam, pool in pools.items():
        paths = [pool.base.resolve(), *(p.resolve() for p in pool.finetuned.values())]
        mk_paths = paths
        if fam == "gpt_neox":
            mk_paths = [_with_neox_buffers(p, root / "neox-pythia" / p.name) for p in paths]
        ours_rec = _recipes(*(str(p) for p in paths))
        for method, rec in _recipes(*(str(p) for p in mk_paths)).items():
            if method == "ties_dense" and fam not in MOE_FAMILIES:
                continue
            docs.append({**rec, "name": f"out-{fam}-{method}"})
            ours[fam, method] = ours_rec[method]
    multi = root / "multi.yaml"
    multi.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    proc = subprocess.run([str(MERGEKIT_MULTI), str(multi), "-I", str(root / "mk"), "--no-lazy", "--no-write-model-card",
                           "--no-copy-tokenizer", "--quiet"], env=reference_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"mergekit-multi failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return {key: (root / "mk" / f"out-{key[0]}-{key[1]}", rec) for key, rec in ours.items()}


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    t = {}
    for f in sorted(folder.glob("*.safetensors")):
        t.update({k: v.float() for k, v in load_file(str(f)).items()})
    return t


def _loaded(folder: Path) -> dict[str, torch.Tensor]:
    """The state dict of the model transformers loads from `folder` (a MoE's experts fused into [E, …] tensors,
    whichever way the file stores them)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return {k: v.detach().float() for k, v in model.state_dict().items()}


def _worst(theirs: dict, mine: dict, names) -> tuple[float, str]:
    return max((float((theirs[k] - mine[k]).abs().max()), k) for k in names)


CASES = [(f, m) for f in FAMILIES for m in METHODS if m != "ties_dense" or f in MOE_FAMILIES]


@pytest.mark.parametrize("family,method", CASES)
def test_same_tensors_as_mergekit(pools, mergekit_out, tmp_path, family, method):
    mk_dir, rec = mergekit_out[family, method]
    ours = run(rec, tmp_path / "ours")
    tol = TOL[method.split("_")[0]]
    if family in MOE_FAMILIES:
        # mergekit (on transformers 5) reads the experts fused and writes them fused: compare the loaded models
        theirs, mine = _loaded(mk_dir), _loaded(ours.out_dir)
        assert set(theirs) == set(mine)
        names = list(mine)
        assert any(".mlp.gate." in k for k in names)   # the router is compared
        assert any(k.endswith("mlp.experts.gate_up_proj") for k in names)   # and the fused experts
    else:
        theirs, mine = _tensors(mk_dir), _tensors(ours.out_dir)
        extra = set(theirs) - set(mine)
        if family == "gpt_neox":   # the buffers added to mergekit's copies only
            assert extra == {f"gpt_neox.layers.{i}.{b}" for i in range(2) for b in NEOX_BUFFERS}
        else:
            assert not extra, f"{family}: mergekit wrote tensors forgetlab did not: {sorted(extra)}"
        assert set(mine) <= set(theirs), f"{family}: forgetlab wrote tensors mergekit did not: {set(mine) - set(theirs)}"
        names = list(mine)
    worst = _worst(theirs, mine, names)
    assert worst[0] <= tol, f"{family} {method}: max |mergekit − forgetlab| = {worst[0]} at {worst[1]}"
    # the merge moved every layer's weights away from the base, so equality with mergekit is meaningful
    base = _tensors(pools[family].base)
    mine_file = _tensors(ours.out_dir)
    moved = {k for k in mine_file if k in base and float((mine_file[k] - base[k]).abs().max()) > 1e-4}
    for layer in (0, 1):
        assert any(f".layers.{layer}." in k or f".h.{layer}." in k for k in moved), (family, layer)
    assert json.loads((ours.out_dir / "config.json").read_text())["model_type"] == family


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_experts_are_merged_as_the_fused_tensor(pools, tmp_path, family):
    """forgetlab's merged experts are TIES (`_ties_reference`) applied to each layer's fused tensor as transformers
    loads it — the members stacked over the experts, gate and up rows concatenated — split back per expert, and
    differ from TIES applied expert by expert (so the fusion matters); the output file holds exactly the input
    checkpoint's per-expert names, shapes and dtypes."""
    pool = pools[family]
    paths = [str(p.resolve()) for p in (pool.base, *pool.finetuned.values())]
    files = [_tensors(Path(p)) for p in paths]
    ours = run(_recipes(*paths)["ties"], tmp_path / "ours").out_dir
    merged = _tensors(ours)
    raw_in, raw_out = load_file(str(Path(paths[0]) / "model.safetensors")), load_file(str(ours / "model.safetensors"))
    assert {k: (tuple(v.shape), v.dtype) for k, v in raw_in.items()} == \
        {k: (tuple(v.shape), v.dtype) for k, v in raw_out.items()}
    w1, w2, w3 = ("w1", "w2", "w3") if family == "mixtral" else ("gate_proj", "down_proj", "up_proj")
    n_exp, per_expert_gap = 4, 0.0
    for layer in (0, 1):
        prefix = next(k for k in merged if f"layers.{layer}." in k and ".experts.0." in k).split(".experts.0.")[0]
        name = lambda e, w: f"{prefix}.experts.{e}.{w}.weight"   # noqa: E731
        for parts in ((w1, w3), (w2,)):
            fused = [torch.stack([torch.cat([f[name(e, w)] for w in parts]) for e in range(n_exp)]) for f in files]
            want = _ties_reference(fused[0], fused[1:], [1.0, 0.5], 0.3)
            off = 0
            for w in parts:
                rows = files[0][name(0, w)].shape[0]
                for e in range(n_exp):
                    got = merged[name(e, w)]
                    assert float((got - want[e, off:off + rows]).abs().max()) <= 1e-6, name(e, w)
                    alone = _ties_reference(files[0][name(e, w)], [files[1][name(e, w)], files[2][name(e, w)]],
                                            [1.0, 0.5], 0.3)
                    per_expert_gap = max(per_expert_gap, float((got - alone).abs().max()))
                off += rows
    assert per_expert_gap > 1e-4   # expert-by-expert TIES is a different merge


def _router_names(folder: Path) -> list[str]:
    names = [k for k in _tensors(folder) if k.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight"))]
    assert len(names) == 2, names   # one router per layer
    return names


def _ties_reference(base: torch.Tensor, fts: list[torch.Tensor], weights: list[float], density: float):
    """TIES (Yadav et al. 2023) as mergekit computes it, written out for one tensor: keep each task vector's
    top-`density` entries by magnitude, elect the sign of the weighted sum, average the agreeing entries by their
    weights (normalize: true)."""
    taus = []
    for ft, w in zip(fts, weights):
        tau = (ft - base).reshape(-1)
        k = int(density * tau.numel())
        keep = torch.zeros_like(tau, dtype=torch.bool)
        keep[tau.abs().topk(k).indices] = True
        taus.append((tau * keep * w).reshape(base.shape))
    stacked = torch.stack(taus)
    sign = torch.sign(stacked.sum(0))
    agree = (torch.sign(stacked) == sign) & (stacked != 0)
    w = torch.tensor(weights).view(-1, *[1] * base.dim())
    num = (stacked * agree).sum(0)
    den = (w * agree).sum(0).clamp(min=1e-8)
    return base + num / den


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_router_is_merged_like_any_other_tensor(pools, tmp_path, family):
    """The router (`gate.weight`, [experts, hidden]) of a TIES and a linear merge equals the method applied to
    the three routers alone, computed here by hand."""
    pool = pools[family]
    paths = [str(p.resolve()) for p in (pool.base, *pool.finetuned.values())]
    tensors = [_tensors(Path(p)) for p in paths]
    ties = run(_recipes(*paths)["ties"], tmp_path / "ties").out_dir
    linear = run({"merge_method": "linear", "models": [{"model": paths[1], "parameters": {"weight": 2.0}},
                                                       {"model": paths[2], "parameters": {"weight": 1.0}}],
                  "parameters": {"normalize": True}, "dtype": "float32"}, tmp_path / "linear").out_dir
    merged_ties, merged_linear = _tensors(ties), _tensors(linear)
    for name in _router_names(ties):
        base, a, b = (t[name] for t in tensors)
        assert base.shape[0] == 4   # one row per expert
        want = _ties_reference(base, [a, b], [1.0, 0.5], 0.3)
        assert float((merged_ties[name] - want).abs().max()) <= 1e-6, name
        assert float((merged_ties[name] - base).abs().max()) > 1e-3   # the TIES merge changed the router
        assert float((merged_linear[name] - (2 * a + b) / 3).abs().max()) <= 1e-6, name


def test_filters_match_the_checkpoint_name_and_the_loaded_one():
    """A filter is matched against a tensor's checkpoint name and the name transformers 5 loads it under (what
    mergekit 0.1.5 matches): Mixtral's router and experts are `mlp` tensors once loaded."""
    from forgetlab.merge import settings
    from forgetlab.merge.layers import filter_names
    from tests.architectures import tiny_config

    names = filter_names(tiny_config("mixtral", 300))
    assert names("model.layers.0.block_sparse_moe.gate.weight") == (
        "model.layers.0.block_sparse_moe.gate.weight", "model.layers.0.mlp.gate.weight")
    assert "model.layers.1.mlp.experts.gate_up_proj" in names("model.layers.1.block_sparse_moe.experts.2.w3.weight")
    assert names("model.layers.0.self_attn.q_proj.weight") == ("model.layers.0.self_attn.q_proj.weight",)
    assert filter_names(tiny_config("llama", 300))("model.layers.0.mlp.up_proj.weight") == (
        "model.layers.0.mlp.up_proj.weight",)
    value = [{"filter": "mlp", "value": 1.0}, {"filter": "block_sparse_moe", "value": 2.0}, {"value": 0.0}]
    assert settings.evaluate(value, names("model.layers.0.block_sparse_moe.gate.weight"), 0.0) == 1.0
    assert settings.evaluate(value[1:], names("model.layers.0.block_sparse_moe.gate.weight"), 0.0) == 2.0
    assert settings.evaluate(value, names("model.norm.weight"), 0.0) == 0.0
