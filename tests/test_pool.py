"""ModelPool: YAML, compatibility checks with exact messages, caching, NaN warnings."""
from __future__ import annotations

import shutil

import pytest
import yaml

from forgetlab.core.checkpoints import load_model, open_checkpoint, write_hf_folder
from forgetlab.core.errors import ForgetlabError, IncompatibleModelsError, ProbeDataError
from forgetlab.core.pool import ModelPool, NonFiniteWeightsWarning


def test_pool_from_yaml_reads_models_and_probes(tiny_llama):
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    assert pool.model_names == ["ft0", "ft1"]
    assert pool.task_names == ["math", "copy"]
    assert pool.probes.task("math").eval[0].prompt == "1+2="
    assert len(pool.probes.general) == 6
    assert pool.load("ft0") is pool.load("ft0"), "a loaded model must be cached, never reloaded"
    with pytest.raises(ForgetlabError, match="its models are: base, ft0, ft1"):
        pool.checkpoint("nope")
    with pytest.raises(ProbeDataError, match="its tasks are: math, copy"):
        pool.probes.task("nope")


def test_pool_round_trips_through_yaml(tiny_llama, tmp_path):
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    out = pool.to_yaml(tmp_path / "pool.yaml")
    again = ModelPool.from_yaml(out)
    assert again.model_names == pool.model_names
    assert again.probes.task("copy").eval == pool.probes.task("copy").eval


def test_different_architectures_are_refused(tiny_llama, tiny_gpt2):
    with pytest.raises(IncompatibleModelsError, match="is a gpt2 model but the base is a llama model"):
        ModelPool(tiny_llama.base, {"g": tiny_gpt2.base})


def test_different_shapes_name_the_tensor(tiny_llama, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = open_checkpoint(tiny_llama.base).config.to_dict()
    cfg["intermediate_size"] = 48
    LlamaForCausalLM(LlamaConfig(**cfg)).save_pretrained(str(tmp_path / "wide"))
    with pytest.raises(IncompatibleModelsError, match=r"mlp\.(gate|up|down)_proj\.weight has shape .* but"):
        ModelPool(tiny_llama.base, {"wide": tmp_path / "wide"})


def test_vocabulary_mismatch_is_explained(tiny_llama, tmp_path):
    model = load_model(tiny_llama.base, device="cpu")
    model.resize_token_embeddings(model.config.vocab_size + 8)
    model.save_pretrained(str(tmp_path / "bigvocab"))
    with pytest.raises(IncompatibleModelsError, match="vocabulary of .* tokens but the base has"):
        ModelPool(tiny_llama.base, {"big": tmp_path / "bigvocab"})


def test_nan_weights_warn_naming_the_tensor(tiny_llama, tmp_path):
    ckpt = open_checkpoint(tiny_llama.finetuned["ft0"])
    sd = ckpt.state_dict()
    sd["model.layers.1.mlp.up_proj.weight"][0, 0] = float("nan")
    write_hf_folder(tmp_path / "nan", sd, ckpt.config)
    with pytest.warns(NonFiniteWeightsWarning, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        pool = ModelPool(tiny_llama.base, {"nan": tmp_path / "nan"})
    assert "up_proj" in pool.warnings[0]


def test_malformed_pool_files(tmp_path, tiny_llama):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: [unclosed")
    with pytest.raises(ForgetlabError, match="not valid YAML"):
        ModelPool.from_yaml(bad)
    bad.write_text("models: {}")
    with pytest.raises(ForgetlabError, match="at least `base:`"):
        ModelPool.from_yaml(bad)
    with pytest.raises(ForgetlabError, match="does not exist"):
        ModelPool.from_yaml(tmp_path / "missing.yaml")


def test_model_deleted_from_disk_is_reported(tiny_llama, tmp_path):
    shutil.copytree(tiny_llama.finetuned["ft1"], tmp_path / "ft")
    pool = ModelPool(tiny_llama.base, {"ft": tmp_path / "ft"})
    shutil.rmtree(tmp_path / "ft")
    with pytest.raises(ForgetlabError, match="no longer on disk"):
        pool.load("ft")


def test_adapter_in_pool_yaml(tiny_llama, tmp_path):
    from tests.test_checkpoints import _make_lora

    _make_lora(tiny_llama.base, tmp_path / "lora")
    spec = {"base": str(tiny_llama.base), "models": {"l": {"adapter": str(tmp_path / "lora")}}}
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(spec))
    pool = ModelPool.from_yaml(tmp_path / "pool.yaml")
    assert pool.entries["l"].adapter
    name = pool.checkpoint("l").delta_names()[0]
    assert float(pool.checkpoint("l").delta(name).abs().sum()) > 0
