"""Checkpoints: opening every kind of reference, lazy reads, LoRA deltas, atomic sharded writes, bad input."""
from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import pytest
import torch

from forgetlab.core.checkpoints import (LoraCheckpoint, TensorInfo, load_model, load_tokenizer, open_checkpoint,
                                        write_hf_folder)
from forgetlab.core.errors import CheckpointError, IncompatibleModelsError, OfflineError, OutputExistsError


def test_listing_matches_the_model_and_reads_one_tensor(tiny_llama):
    ckpt = open_checkpoint(tiny_llama.base)
    model = load_model(tiny_llama.base, device="cpu")
    sd = model.state_dict()
    assert set(ckpt.names()) == set(sd)
    for name, t in sd.items():
        assert ckpt.info(name).shape == tuple(t.shape)
        torch.testing.assert_close(ckpt.read(name), t.float(), rtol=0, atol=0)
    assert ckpt.config.model_type == "llama"
    assert ckpt.num_parameters == sum(t.numel() for t in sd.values())


def test_sharded_write_round_trips_and_loads_in_transformers(tiny_llama, tmp_path):
    ckpt = open_checkpoint(tiny_llama.base)
    plan = list(ckpt.infos().values())
    out = write_hf_folder(tmp_path / "copy", ckpt.iter_tensors(dtype=None), ckpt.config, plan=plan,
                          tokenizer_from=ckpt, max_shard_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and all((out / s).exists() for s in shards)
    assert index["metadata"]["total_size"] == sum(i.nbytes for i in plan)
    again = open_checkpoint(out)
    for name in ckpt.names():
        assert torch.equal(again.read(name, None), ckpt.read(name, None))
    ids = torch.tensor([[1, 5, 9, 12]])
    a = load_model(tiny_llama.base, device="cpu")(ids).logits
    b = load_model(out, device="cpu")(ids).logits
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert load_tokenizer(out).eos_token == "</s>"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary folder left behind"


def test_existing_output_is_refused_and_overwrite_replaces_it(tmp_path):
    sd = {"w": torch.ones(2, 2)}
    out = write_hf_folder(tmp_path / "o", sd)
    with pytest.raises(OutputExistsError, match="exists already"):
        write_hf_folder(tmp_path / "o", {"w": torch.zeros(2, 2)})
    assert torch.equal(open_checkpoint(out).read("w"), torch.ones(2, 2))
    write_hf_folder(tmp_path / "o", {"w": torch.zeros(2, 2)}, overwrite=True)
    assert torch.equal(open_checkpoint(out).read("w"), torch.zeros(2, 2))


def test_failure_half_way_leaves_nothing(tmp_path):
    plan = [TensorInfo("a", (2,), torch.float32), TensorInfo("b", (2,), torch.float32)]

    def stream():
        yield "a", torch.ones(2)
        raise OSError("disk full (simulated)")

    with pytest.raises(OSError, match="simulated"):
        write_hf_folder(tmp_path / "out", stream(), plan=plan)
    assert list(tmp_path.iterdir()) == []


def test_bad_paths_give_clear_messages(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        open_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no model weights"):
        open_checkpoint(tmp_path / "empty")


def test_truncated_safetensors_is_reported(tiny_llama, tmp_path):
    folder = tmp_path / "trunc"
    folder.mkdir()
    raw = (tiny_llama.base / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        open_checkpoint(folder).names()
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        open_checkpoint(folder).names()


MEMORY_LIMIT_CHILD = r"""
import re, resource, sys
from forgetlab.core.checkpoints import open_checkpoint
from forgetlab.core.errors import CheckpointError
data = int(re.search(r"VmData:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
resource.setrlimit(resource.RLIMIT_DATA, (data + (32 << 20), resource.RLIM_INFINITY))  # a cluster's job limit
try:
    open_checkpoint(sys.argv[1]).names()
except CheckpointError as exc:
    print(exc)
    sys.exit(3)
print("opened")
"""


def test_a_memory_limit_is_reported_as_one_not_as_a_corrupt_file(tmp_path):
    """Under a limit such as `prlimit --data` (clusters set one per job), mapping a safetensors file larger than what
    is left fails with ENOMEM; that was reported as "not a readable safetensors file … corrupt or truncated:
    re-download it". Now the message names the limit (read with `resource`) and how to raise it."""
    import subprocess
    import sys

    from safetensors.torch import save_file

    folder = tmp_path / "big"
    folder.mkdir()
    save_file({"w": torch.zeros(24 << 20)}, str(folder / "model.safetensors"))        # 96 MiB
    (folder / "config.json").write_text("{}")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", MEMORY_LIMIT_CHILD, str(folder)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr[-2000:]
    assert "RLIMIT_DATA" in r.stdout and "ulimit -d unlimited" in r.stdout and "not damaged" in r.stdout
    assert "corrupt" not in r.stdout


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_bin_is_never_executed(tmp_path):
    folder = tmp_path / "evil"
    folder.mkdir()
    marker = tmp_path / "pwned"
    evil = _Evil()
    evil.marker = marker
    torch.save({"w": evil}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="never runs code"):
        open_checkpoint(folder).names()
    assert not marker.exists()
    with open(folder / "pytorch_model.bin", "wb") as fh:  # a raw pickle, not torch's zip format
        pickle.dump(evil, fh)
    with pytest.raises(CheckpointError, match="never runs code"):
        open_checkpoint(folder).names()
    assert not marker.exists()


def test_plain_bin_checkpoint_reads(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    torch.save({"w": torch.arange(4.0)}, folder / "pytorch_model.bin")
    assert torch.equal(open_checkpoint(folder).read("w"), torch.arange(4.0))


def test_hub_id_offline_says_to_pass_a_folder(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError, match="pass a local HF folder"):
        open_checkpoint("someone/not-a-cached-model")


def _make_lora(base: Path, out: Path, r=4, alpha=8, seed=0, targets=("q_proj", "v_proj")):
    from peft import LoraConfig, get_peft_model

    model = load_model(base, device="cpu")
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    peft_model.save_pretrained(str(out))
    return peft_model


def test_lora_delta_equals_peft_merge(tiny_llama, tmp_path):
    peft_model = _make_lora(tiny_llama.base, tmp_path / "lora")
    merged = peft_model.merge_and_unload().state_dict()
    ckpt = open_checkpoint(tmp_path / "lora", base=tiny_llama.base)
    assert isinstance(ckpt, LoraCheckpoint)
    assert sorted(ckpt.delta_names()) == sorted(n for n in merged if "q_proj" in n or "v_proj" in n)
    base = open_checkpoint(tiny_llama.base)
    for name in ckpt.names():
        torch.testing.assert_close(ckpt.read(name), merged[name].float(), rtol=1e-5, atol=1e-6)
    name = ckpt.delta_names()[0]
    torch.testing.assert_close(ckpt.delta(name), merged[name] - base.read(name), rtol=1e-4, atol=1e-6)
    ids = torch.tensor([[1, 7, 3]])
    torch.testing.assert_close(load_model(ckpt, device="cpu")(ids).logits, peft_model(ids).logits,
                               rtol=1e-4, atol=1e-5)


def test_lora_on_the_wrong_base_is_refused(tiny_llama, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    _make_lora(tiny_llama.base, tmp_path / "lora")
    cfg = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    LlamaForCausalLM(cfg).save_pretrained(str(tmp_path / "other"))
    with pytest.raises(IncompatibleModelsError, match="another base"):
        open_checkpoint(tmp_path / "lora", base=tmp_path / "other")


# ------------------------------------------------------------------ LoRA variants (issue 17): DoRA, embeddings,
# modules_to_save, lora_bias — every read equals PEFT's merge_and_unload(), every delta merged − base


def _make_peft(base: Path, out: Path, seed=0, family_fan=False, **lora_kwargs):
    """A PEFT adapter with every trainable tensor randomised (B, A, magnitudes, saved modules), saved to `out`;
    returns PEFT's merge_and_unload() state dict as the reference."""
    from peft import LoraConfig, get_peft_model

    model = load_model(base, device="cpu")
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, **lora_kwargs))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if p.requires_grad:  # lora factors, magnitudes, modules_to_save copies, lora biases
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    peft_model.save_pretrained(str(out))
    return {k: v.detach().clone() for k, v in peft_model.merge_and_unload().state_dict().items()}


def _max_error_vs_peft(ckpt, merged, base) -> tuple[float, float]:
    read_err = max(float((ckpt.read(n) - merged[n].float()).abs().max()) for n in ckpt.names())
    delta_err = max(float((ckpt.delta(n) - (merged[n].float() - base.read(n))).abs().max()) for n in ckpt.names())
    return read_err, delta_err


@pytest.mark.parametrize("family, kind, kwargs, changed", [
    ("llama", "dora", dict(use_dora=True, target_modules=["q_proj", "v_proj", "down_proj"]),
     ("q_proj", "v_proj", "down_proj")),
    ("llama", "modules_to_save", dict(target_modules=["q_proj"], modules_to_save=["lm_head"]),
     ("q_proj", "lm_head")),
    ("llama", "embedding", dict(target_modules=["embed_tokens", "k_proj"]), ("embed_tokens", "k_proj")),
    ("llama", "embedding_dora", dict(target_modules=["embed_tokens", "o_proj"], use_dora=True),
     ("embed_tokens", "o_proj")),
    ("llama", "rank_pattern", dict(target_modules=["q_proj", "v_proj"], rank_pattern={"v_proj": 2},
                                   alpha_pattern={"layers.1.self_attn.q_proj": 32}, use_rslora=True),
     ("q_proj", "v_proj")),
    # GPT-2: Conv1D weights are [in, out] (fan_in_fan_out), biases exist, embeddings are tied to lm_head
    ("gpt2", "dora_fan_in_fan_out", dict(target_modules=["c_attn", "c_fc"], fan_in_fan_out=True, use_dora=True),
     ("c_attn", "c_fc")),
    ("gpt2", "lora_bias", dict(target_modules=["c_proj"], fan_in_fan_out=True, lora_bias=True),
     ("c_proj.weight", "c_proj.bias")),
    ("gpt2", "tied_embedding_and_ln", dict(target_modules=["wte", "c_attn"], fan_in_fan_out=True,
                                           modules_to_save=["ln_f"]), ("wte", "c_attn", "ln_f")),
])
def test_lora_variants_equal_peft_merge_and_unload(tiny_llama, tiny_gpt2, tmp_path, family, kind, kwargs, changed):
    pool = tiny_llama if family == "llama" else tiny_gpt2
    merged = _make_peft(pool.base, tmp_path / kind, **kwargs)
    ckpt = open_checkpoint(tmp_path / kind, base=pool.base)
    base = open_checkpoint(pool.base)
    read_err, delta_err = _max_error_vs_peft(ckpt, merged, base)
    assert read_err < 1e-5 and delta_err < 1e-5, (kind, read_err, delta_err)
    really_changed = {n for n in base.names() if not torch.equal(merged[n].float(), base.read(n))}
    assert set(ckpt.delta_names()) == really_changed
    for part in changed:
        assert any(part in n for n in really_changed), part
    ids = torch.tensor([[1, 7, 3, 9]])
    from peft import PeftModel
    # merged, not PEFT's unmerged forward: with tied embeddings that forward leaves lm_head unchanged while
    # merge_and_unload() changes the shared tensor (and so lm_head) — the merged model is the reference
    ref = PeftModel.from_pretrained(load_model(pool.base, device="cpu"), str(tmp_path / kind)).merge_and_unload()
    torch.testing.assert_close(load_model(ckpt, device="cpu")(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-5)


def test_lora_bias_on_a_layer_without_bias_is_refused_by_name(tiny_llama, tmp_path):
    """PEFT cannot merge lora_bias into a bias-less layer (Llama's q_proj); the message must say lora_bias, not
    'trained on another base'."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from peft import LoraConfig, get_peft_model

        peft_model = get_peft_model(load_model(tiny_llama.base, device="cpu"),
                                    LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], lora_bias=True))
    peft_model.save_pretrained(str(tmp_path / "adp"))
    with pytest.raises(CheckpointError, match="lora_bias=True.*no bias") as info:
        open_checkpoint(tmp_path / "adp", base=tiny_llama.base).names()
    assert "another base" not in str(info.value)


def test_dora_delta_depends_on_the_base_hand_computed(tmp_path):
    """DoRA by hand on a 2×2 weight: W' = m ⊙ (W0 + s·BA) / ‖W0 + s·BA‖ per row (output feature)."""
    from safetensors.torch import save_file

    base = tmp_path / "base"
    base.mkdir()
    save_file({"lin.weight": torch.tensor([[3.0, 0.0], [0.0, 1.0]])}, str(base / "model.safetensors"))
    ad = tmp_path / "dora"
    ad.mkdir()
    (ad / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 1, "lora_alpha": 2, "use_dora": True, "base_model_name_or_path": str(base)}))
    save_file({"base_model.model.lin.lora_A.weight": torch.tensor([[1.0, 0.0]]),
               "base_model.model.lin.lora_B.weight": torch.tensor([[0.5], [0.0]]),
               "base_model.model.lin.lora_magnitude_vector": torch.tensor([10.0, 2.0])},
              str(ad / "adapter_model.safetensors"))
    ckpt = open_checkpoint(ad)
    # s·BA = 2·[[0.5,0],[0,0]] = [[1,0],[0,0]]; V = [[4,0],[0,1]]; row norms 4, 1 → W' = [[10,0],[0,2]]
    torch.testing.assert_close(ckpt.read("lin.weight"), torch.tensor([[10.0, 0.0], [0.0, 2.0]]))
    torch.testing.assert_close(ckpt.delta("lin.weight"), torch.tensor([[7.0, 0.0], [0.0, 1.0]]))


def _write_adapter(folder: Path, config: dict, tensors: dict | None = None) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors or {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(2, 32),
                          "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.ones(32, 2)},
              str(folder / "adapter_model.safetensors"))
    return folder


@pytest.mark.parametrize("config, message", [
    ({"r": 0}, r"r is 0, but it must be a positive whole number"),
    ({"r": "8"}, r"r is '8', but it must be a positive whole number"),
    ({"r": 2, "lora_alpha": "16"}, r"lora_alpha is '16', but it must be a finite number"),
    ({"r": 2, "rank_pattern": {"q_proj": 0}}, r"rank_pattern\['q_proj'\] is 0"),
    ({"r": 2, "peft_type": "IA3"}, r"is a PEFT IA3 adapter; forgetlab reads LoRA and DoRA adapters only"),
    ({"r": 2, "use_qalora": True}, r"QA-LoRA .* which forgetlab does not support"),
    ({"r": 2, "alora_invocation_tokens": [1, 2]}, r"activated LoRA"),
    ({"r": 2, "use_dora": True}, r"says use_dora but stores no magnitude vector"),
    ({"r": 2, "init_lora_weights": "pissa_niter_4"}, r"init_lora_weights='pissa_niter_4', which rewrites the base"),
    ({"r": 2, "init_lora_weights": "olora"}, r"rewrites the base weights"),
])
def test_bad_adapter_configs_are_refused_with_a_message(tiny_llama, tmp_path, config, message):
    ad = _write_adapter(tmp_path / "ad", config)
    with pytest.raises(CheckpointError, match=message):
        open_checkpoint(ad, base=tiny_llama.base)


def test_adapter_with_unknown_tensors_is_refused(tiny_llama, tmp_path):
    ad = _write_adapter(tmp_path / "ad", {"r": 2}, {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(2, 32),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.ones(32, 2),
        "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta": torch.ones(3, 32)})
    with pytest.raises(CheckpointError, match="not LoRA factors forgetlab knows: .*trainable_tokens_delta"):
        open_checkpoint(ad, base=tiny_llama.base)


def test_malformed_adapter_config_is_a_message_even_without_a_base(tmp_path):
    ad = _write_adapter(tmp_path / "ad", {"r": 2})
    (ad / "adapter_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="adapter_config.json is unreadable"):
        open_checkpoint(ad)
    (ad / "adapter_config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="not a JSON object"):
        open_checkpoint(ad)


def test_adapters_naming_themselves_or_each_other_are_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _write_adapter(a, {"r": 2, "base_model_name_or_path": str(a)})
    with pytest.raises(CheckpointError, match="leads back to an adapter already being opened"):
        open_checkpoint(a)
    _write_adapter(a, {"r": 2, "base_model_name_or_path": str(b)})
    _write_adapter(b, {"r": 2, "base_model_name_or_path": str(a)})
    with pytest.raises(CheckpointError, match="leads back to an adapter already being opened"):
        open_checkpoint(a)


@pytest.mark.parametrize("index", ["{oops", "[]", '{"weight_map": 3}', '{"weight_map": {"w": 5}}'])
def test_malformed_bin_index_is_a_message(tmp_path, index):
    folder = tmp_path / "m"
    folder.mkdir()
    torch.save({"w": torch.ones(2)}, folder / "pytorch_model-00001-of-00001.bin")
    (folder / "pytorch_model.bin.index.json").write_text(index)
    with pytest.raises(CheckpointError, match="pytorch_model.bin.index.json is malformed"):
        open_checkpoint(folder)


@pytest.mark.parametrize("config_text, message", [
    ('{"r": 0, "lora_alpha": 8}', "r is 0, but it must be a positive whole number"),
    ('{"r": "8", "lora_alpha": 8}', "r is '8', but it must be a positive whole number"),
    ("{broken", "adapter_config.json is unreadable"),
])
def test_cli_inspect_and_merge_of_bad_adapters_exit_2_writing_nothing(tiny_llama, tmp_path, capsys, monkeypatch,
                                                                      config_text, message):
    import yaml

    from forgetlab.cli import main

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    ad = _write_adapter(tmp_path / "ad", {"r": 2})
    cfg = json.loads(config_text) if config_text.startswith('{"') else None
    if cfg is not None:
        cfg["base_model_name_or_path"] = str(tiny_llama.base)
        (ad / "adapter_config.json").write_text(json.dumps(cfg))
    else:
        (ad / "adapter_config.json").write_text(config_text)
    assert main(["inspect", str(ad)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"method": "task_arithmetic", "base": str(tiny_llama.base), "models": [str(ad)]}))
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["merge", str(recipe), str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_modules_to_save_lm_head_on_a_tied_base_is_refused(tiny_gpt2, tmp_path):
    _make_peft(tiny_gpt2.base, tmp_path / "ad", target_modules=["c_attn"], fan_in_fan_out=True,
               modules_to_save=["lm_head"])
    with pytest.raises(CheckpointError, match="ties lm_head to the embeddings .* does not untie"):
        open_checkpoint(tmp_path / "ad", base=tiny_gpt2.base)


def test_nan_in_an_adapter_factor_warns_naming_the_factor_without_a_product_per_module(tiny_llama, tmp_path,
                                                                                        monkeypatch):
    from safetensors.torch import load_file, save_file

    from forgetlab.core.checkpoints import LoraCheckpoint
    from forgetlab.core.pool import ModelPool, NonFiniteWeightsWarning

    _make_lora(tiny_llama.base, tmp_path / "lora")
    clean = ModelPool(tiny_llama.base, {"lora": {"adapter": tmp_path / "lora"}})
    assert clean.warnings == []
    file = tmp_path / "lora" / "adapter_model.safetensors"
    tensors = load_file(str(file))
    bad = next(n for n in tensors if "layers.1" in n and "lora_B" in n)
    tensors[bad][0, 0] = float("inf")
    save_file(tensors, str(file))
    monkeypatch.setattr(LoraCheckpoint, "delta", lambda *a, **k: pytest.fail("the scan computed a ΔW"))
    with pytest.warns(NonFiniteWeightsWarning, match=re.escape(bad)):
        pool = ModelPool(tiny_llama.base, {"lora": {"adapter": tmp_path / "lora"}})
    assert "lora has NaN/Inf values in 1 tensor(s)" in pool.warnings[0]


def test_a_folder_is_read_as_transformers_reads_it_and_extra_weight_files_are_named(tiny_llama, tmp_path):
    """Shards + index beside a stale model.safetensors: transformers loads the single file, so forgetlab reads it
    too (merge, taskvec and eval agree) and warns about the shards; a backup copy beside model.safetensors is
    never read."""
    import shutil

    from safetensors.torch import load_file, save_file

    from forgetlab.core.checkpoints.opening import ExtraWeightFilesWarning

    ckpt = open_checkpoint(tiny_llama.base)
    out = write_hf_folder(tmp_path / "sharded", ckpt.iter_tensors(dtype=None), ckpt.config,
                          plan=list(ckpt.infos().values()), tokenizer_from=ckpt, max_shard_bytes=20_000)
    stale = {n: t + 0.5 for n, t in load_file(tiny_llama.base / "model.safetensors").items()}
    save_file(stale, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.warns(ExtraWeightFilesWarning, match=r"model-00001-of-\d+\.safetensors.*not read.*model\.safetensors"):
        again = open_checkpoint(out)
    name = "model.layers.0.mlp.up_proj.weight"
    loaded = dict(load_model(out, device="cpu").named_parameters())[name].detach()
    assert torch.equal(again.read(name), loaded) and torch.equal(loaded, stale[name])

    backup = tmp_path / "backup"
    shutil.copytree(tiny_llama.base, backup)
    save_file(stale, str(backup / "model_backup.safetensors"), metadata={"format": "pt"})   # sorts before model.
    with pytest.warns(ExtraWeightFilesWarning, match="model_backup.safetensors"):
        b = open_checkpoint(backup)
    assert torch.equal(b.read(name), ckpt.read(name))

    ambiguous = tmp_path / "ambiguous"
    ambiguous.mkdir()
    shutil.copy(tiny_llama.base / "config.json", ambiguous)
    save_file(stale, str(ambiguous / "a.safetensors"), metadata={"format": "pt"})
    save_file(stale, str(ambiguous / "b.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="neither model.safetensors nor model.safetensors.index.json"):
        open_checkpoint(ambiguous)


def test_loads_in_several_threads_keep_tied_embeddings(tmp_path):
    """The app loads models from background jobs at once; transformers' from_pretrained racing in threads loses the
    tie of lm_head to the embeddings (reports it missing, re-initialises it). load_model serialises the loads."""
    import threading

    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
    folders = []
    for i in range(3):
        torch.manual_seed(i)
        LlamaForCausalLM(cfg).save_pretrained(tmp_path / f"m{i}")
        folders.append(tmp_path / f"m{i}")
    errors, models = [], []

    def load(folder):
        try:
            for _ in range(4):
                models.append((folder, load_model(folder)))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=load, args=(f,)) for f in folders]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors
    for folder, model in models:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), folder
