"""Tiny random checkpoints of every tested decoder family (forgetlab.core.layouts.FAMILIES), each made with the
family's real transformers config class and its own layout quirks switched on: Gemma's tied head and scaled
embeddings, Gemma-2/3's soft-capping and sliding-window layers (a window shorter than the probe samples), Phi-3's
fused projections and partial rotary, GPT-NeoX's parallel residual and partial rotary, OLMo-2's q/k norms and
post-norms, Granite's multipliers, and the experts and routers of Mixtral, Qwen2-MoE and OLMoE."""
from __future__ import annotations

import transformers

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "smollm3", "gpt2", "gemma", "gemma2", "gemma3_text", "phi3",
            "gpt_neox", "olmo", "olmo2", "granite", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
"""Every family the architecture tests run on (its config model_type)."""

MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


def tiny_config(family: str, vocab: int, bos: int = 1, eos: int = 2, pad: int = 0):
    """A 2-layer, hidden-32 (64 for families that need it) config of `family` with its quirks on."""
    ids = dict(vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=256, **ids)
    gqa = dict(num_key_value_heads=2)
    if family == "llama":
        return transformers.LlamaConfig(**common, **gqa, tie_word_embeddings=False)
    if family == "mistral":
        return transformers.MistralConfig(**common, **gqa, head_dim=8, sliding_window=4)
    if family == "smollm3":
        return transformers.SmolLM3Config(**common, **gqa, no_rope_layers=[1, 0])
    if family == "qwen2":
        return transformers.Qwen2Config(**common, **gqa)
    if family == "qwen3":
        return transformers.Qwen3Config(**common, **gqa, head_dim=8)
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=256,
                                       bos_token_id=bos, eos_token_id=eos)
    if family == "gemma":
        return transformers.GemmaConfig(**common, **gqa, head_dim=12)
    if family == "gemma2":
        return transformers.Gemma2Config(**common, **gqa, head_dim=12, sliding_window=4,
                                         attn_logit_softcapping=5.0, final_logit_softcapping=3.0)
    if family == "gemma3_text":
        return transformers.Gemma3TextConfig(**common, **gqa, head_dim=12, sliding_window=4,
                                             layer_types=["sliding_attention", "full_attention"],
                                             final_logit_softcapping=3.0)
    if family == "phi3":
        return transformers.Phi3Config(**common, **gqa, partial_rotary_factor=0.5, tie_word_embeddings=False)
    if family == "gpt_neox":
        return transformers.GPTNeoXConfig(**common, rotary_pct=0.25, use_parallel_residual=True,
                                          tie_word_embeddings=False)
    if family == "olmo":
        return transformers.OlmoConfig(**common, clip_qkv=8.0)
    if family == "olmo2":
        return transformers.Olmo2Config(**common)
    if family == "granite":
        return transformers.GraniteConfig(**common, **gqa, embedding_multiplier=6.0, residual_multiplier=0.5,
                                          attention_multiplier=0.2, logits_scaling=4.0)
    if family == "mixtral":
        return transformers.MixtralConfig(**common, **gqa, num_local_experts=4, num_experts_per_tok=2)
    if family == "qwen2_moe":
        return transformers.Qwen2MoeConfig(**common, **gqa, num_experts=4, num_experts_per_tok=2,
                                           moe_intermediate_size=24, shared_expert_intermediate_size=40,
                                           decoder_sparse_step=1, mlp_only_layers=[])
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**common, **gqa, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                           moe_intermediate_size=24, decoder_sparse_step=1, mlp_only_layers=[])
    if family == "olmoe":
        return transformers.OlmoeConfig(**common, num_experts=4, num_experts_per_tok=2)
    raise ValueError(f"no tiny config for family {family!r}; one of {', '.join(FAMILIES)}")


def tiny_model(family: str, vocab: int, seed: int = 0, **ids):
    """A random `family` causal LM (eval mode) of `tiny_config`, seeded."""
    import torch

    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(tiny_config(family, vocab, **ids)).eval()
