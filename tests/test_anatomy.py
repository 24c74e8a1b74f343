"""forgetlab.core.anatomy: roles, module paths and head slices for the Llama family and GPT-2, on tiny random models."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from forgetlab.core.anatomy import Anatomy, ParamRole, UnsupportedArchitectureError
from forgetlab.core.errors import ForgetlabError

SMALL = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)


def _llama_like(kind):
    torch.manual_seed(0)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**SMALL))
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**SMALL))
    return MistralForCausalLM(MistralConfig(**SMALL, head_dim=8))


def _gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=3, n_head=4, vocab_size=64, n_positions=64,
                                      bos_token_id=0, eos_token_id=0))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_llama_family_numbers_and_roles(kind):
    model = _llama_like(kind)
    a = Anatomy.from_config(model.config)
    assert (a.family, a.num_layers, a.num_heads, a.num_kv_heads, a.head_dim, a.hidden_size) == \
        ("llama", 2, 4, 2, 8, 32)
    # the names derived from the config are exactly the model's parameter names
    assert set(a.names) == set(model.state_dict().keys())
    assert a.role("model.layers.1.self_attn.k_proj.weight") == \
        ParamRole("model.layers.1.self_attn.k_proj.weight", 1, "attn", "k_proj", "weight")
    assert a.role("model.layers.0.mlp.down_proj.weight").module == "mlp"
    r = a.role("model.layers.0.post_attention_layernorm.weight")
    assert (r.layer, r.module, r.part) == (0, "norm", "post_attention_layernorm")
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        assert a.role(name).layer is None and a.role(name).module is None
    assert a.role("lm_head.weight").part == "lm_head"
    if kind == "qwen2":
        assert a.role("model.layers.0.self_attn.q_proj.bias").kind == "bias"
    assert a.layer_path(1) == "model.layers.1"
    assert a.attn_path(0) == "model.layers.0.self_attn"
    assert a.mlp_path(1) == "model.layers.1.mlp"
    modules = dict(model.named_modules())
    for i in range(2):
        assert a.layer_path(i) in modules and a.attn_path(i) in modules and a.mlp_path(i) in modules


def test_gpt2_numbers_roles_and_paths():
    model = _gpt2()
    a = Anatomy.from_model(model)
    assert (a.family, a.num_layers, a.num_heads, a.num_kv_heads, a.head_dim) == ("gpt2", 3, 4, 4, 8)
    assert set(a.names) == set(Anatomy.from_config(model.config).names)
    assert a.role("transformer.h.2.attn.c_attn.bias") == \
        ParamRole("transformer.h.2.attn.c_attn.bias", 2, "attn", "c_attn", "bias")
    assert a.role("transformer.h.0.mlp.c_proj.weight").module == "mlp"
    assert a.role("transformer.h.0.ln_2.weight").module == "norm"
    assert a.role("transformer.wpe.weight").layer is None
    assert a.attn_path(2) == "transformer.h.2.attn"
    assert a.params_of("mlp", layer=1) == ["transformer.h.1.mlp.c_fc.weight", "transformer.h.1.mlp.c_fc.bias",
                                           "transformer.h.1.mlp.c_proj.weight", "transformer.h.1.mlp.c_proj.bias"]


def test_params_of_partitions_the_model():
    model = _llama_like("qwen2")
    a = Anatomy.from_model(model)
    every = set(a.params_of("model"))
    layers = [set(a.params_of("layer", layer=i)) for i in range(a.num_layers)]
    outside = set(a.params_of("none"))
    assert set().union(*layers) | outside == every
    assert not (layers[0] & layers[1]) and not (layers[0] & outside)
    attn, mlp = set(a.params_of("attn", layer=0)), set(a.params_of("mlp", layer=0))
    norms = {n for n in layers[0] if a.role(n).module == "norm"}
    assert attn | mlp | norms == layers[0] and len(norms) == 2
    assert len(a.params_of("attn")) == 2 * len(attn)
    assert outside == {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}


def test_bare_decoder_prefix_is_found():
    model = _llama_like("llama").model  # LlamaModel: layers.{i} without "model."
    a = Anatomy.from_model(model)
    assert a.layer_path(0) == "layers.0"
    assert a.role("layers.1.mlp.up_proj.weight").layer == 1
    assert a.role("embed_tokens.weight").layer is None


def test_gqa_head_to_kv_head_and_slices():
    a = Anatomy.from_config(LlamaConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                                        num_hidden_layers=1))
    assert [a.kv_head(h) for h in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    sl = {s.name.rsplit(".", 2)[-2]: s for s in a.head_slices(0, 5)}
    assert (sl["q_proj"].dim, sl["q_proj"].start, sl["q_proj"].stop) == (0, 40, 48)
    assert (sl["k_proj"].start, sl["k_proj"].stop) == (8, 16)
    assert (sl["v_proj"].start, sl["v_proj"].stop) == (8, 16)
    assert (sl["o_proj"].dim, sl["o_proj"].start, sl["o_proj"].stop) == (1, 40, 48)


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _capture(module, run):
    got = {}

    def pre(mod, args, kwargs):
        got["args"], got["kwargs"] = args, dict(kwargs)

    def post(mod, args, kwargs, out):
        got["out"] = out[0] if isinstance(out, tuple) else out

    h1 = module.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = module.register_forward_hook(post, with_kwargs=True)
    try:
        run()
    finally:
        h1.remove()
        h2.remove()
    return got


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_llama_head_slices_reassemble_attention_output(kind):
    """Σ_h (head h's attention computed from its own slices only) + o bias == the module's output."""
    model = _llama_like(kind).eval()
    a = Anatomy.from_model(model)
    sd = model.state_dict()
    ids = torch.randint(0, 64, (2, 7))
    layer = 1
    attn = dict(model.named_modules())[a.attn_path(layer)]
    got = _capture(attn, lambda: model(ids))
    x = got["kwargs"].get("hidden_states", got["args"][0] if got["args"] else None)
    cos, sin = got["kwargs"]["position_embeddings"]
    total = torch.zeros_like(got["out"])
    seq = x.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    for h in range(a.num_heads):
        parts = {}
        for s in a.head_slices(layer, h):
            key = s.name.rsplit(".", 2)[-2][0] + ("b" if s.name.endswith("bias") else "w")
            parts[key] = s.take(sd[s.name])
        q = x @ parts["qw"].T + parts.get("qb", 0)
        k = x @ parts["kw"].T + parts.get("kb", 0)
        v = x @ parts["vw"].T + parts.get("vb", 0)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(a.head_dim)
        w = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        total += (w @ v) @ parts["ow"].T
    torch.testing.assert_close(total, got["out"], atol=1e-5, rtol=1e-4)


def test_gpt2_head_slices_reassemble_attention_output():
    model = _gpt2().eval()
    a = Anatomy.from_model(model)
    sd = model.state_dict()
    ids = torch.randint(0, 64, (2, 6))
    layer = 2
    attn = dict(model.named_modules())[a.attn_path(layer)]
    got = _capture(attn, lambda: model(ids))
    x = got["args"][0] if got["args"] else got["kwargs"]["hidden_states"]
    seq = x.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    total = sd[f"transformer.h.{layer}.attn.c_proj.bias"].expand_as(got["out"]).clone()
    for h in range(a.num_heads):
        sl = a.head_slices(layer, h)
        qw, kw, vw = (s.take(sd[s.name]) for s in sl[:3])
        qb, kb, vb = (s.take(sd[s.name]) for s in sl[3:6])
        ow = sl[6].take(sd[sl[6].name])
        assert sl[6].dim == 0 and ow.shape == (8, 32)
        q, k, v = x @ qw + qb, x @ kw + kb, x @ vw + vb
        w = ((q @ k.transpose(-1, -2)) / math.sqrt(a.head_dim)).masked_fill(~causal, float("-inf")).softmax(-1)
        total += (w @ v) @ ow
    torch.testing.assert_close(total, got["out"], atol=1e-5, rtol=1e-4)


def test_unknown_architecture_is_a_message():
    from transformers import BertConfig
    with pytest.raises(ForgetlabError) as err:
        Anatomy.from_config(BertConfig())
    msg = str(err.value)
    assert "bert" in msg and "llama" in msg and "gpt2" in msg and "model' level" in msg
    assert isinstance(err.value, UnsupportedArchitectureError)


def test_bad_layer_head_and_level_are_messages():
    a = Anatomy.from_config(LlamaConfig(**SMALL))
    with pytest.raises(ForgetlabError, match="layers 0..1"):
        a.layer_path(2)
    with pytest.raises(ForgetlabError, match="heads 0..3"):
        a.head_slices(0, 4)
    with pytest.raises(ForgetlabError, match="choose one of"):
        a.params_of("block")
    with pytest.raises(ForgetlabError, match="layer= and head="):
        a.params_of("head", layer=0)
    assert a.submodules("head")[-1] == (1, 3) and len(a.submodules("head")) == 8
    assert a.submodules("model") == [(None, None)]


def test_same_structure():
    a = Anatomy.from_config(LlamaConfig(**SMALL))
    b = Anatomy.from_config(Qwen2Config(**SMALL))
    c = Anatomy.from_config(LlamaConfig(**{**SMALL, "num_hidden_layers": 3}))
    assert a.same_structure(b) and not a.same_structure(c)
