"""Checkpoints: opening every kind of reference, lazy reads, LoRA deltas, atomic sharded writes, bad input."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from forgetlab.checkpoints import (
    LoraCheckpoint,
    TensorInfo,
    load_model,
    load_tokenizer,
    open_checkpoint,
    write_hf_folder,
)
from forgetlab.errors import CheckpointError, IncompatibleModelsError, OfflineError, OutputExistsError


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
