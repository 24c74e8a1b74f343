"""The pico preset's models: a small LlamaForCausalLM with a tokenizer trained on the zoo's own text."""
from __future__ import annotations

from typing import Sequence

import torch

from forgetlab.data import TaskPair
from forgetlab.zoo.presets import ModelShape, ZooSpec
from forgetlab.zoo.tokenizer import train_bpe_tokenizer


def tokenizer_texts(general: Sequence[str], tasks: dict[str, Sequence[TaskPair]]) -> list[str]:
    """Text the pico tokenizer is trained on: the Wikipedia train part plus every task's train pairs."""
    texts = list(general)
    for pairs in tasks.values():
        texts.extend(f"{p.prompt}{p.answer}" for p in pairs)
    return texts


def make_tokenizer(spec: ZooSpec, general: Sequence[str], tasks: dict[str, Sequence[TaskPair]]):
    """Train the pico tokenizer (byte-level BPE of `spec.vocab_size` tokens) on `tokenizer_texts`."""
    return train_bpe_tokenizer(tokenizer_texts(general, tasks), vocab_size=spec.vocab_size)


def llama_config(shape: ModelShape, tokenizer):
    """A LlamaConfig of `shape` with tied embeddings, sized to the tokenizer and using its special ids."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=max(shape.vocab_size, len(tokenizer)),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
    )


def init_model(shape: ModelShape, tokenizer, seed: int):
    """A freshly initialised LlamaForCausalLM (weights drawn with `torch.manual_seed(seed)`), float32."""
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = LlamaForCausalLM(llama_config(shape, tokenizer))
    return model.float()
