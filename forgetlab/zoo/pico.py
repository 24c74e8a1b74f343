"""The pico preset's models: a small LlamaForCausalLM with a tokenizer trained on the zoo's own text."""
from __future__ import annotations

from typing import Sequence

import torch
import transformers

from forgetlab.core.data import TaskPair
from forgetlab.core.errors import ParameterError
from forgetlab.zoo.presets import ModelShape, ZooSpec
from forgetlab.zoo.tasks import DOCUMENT_FORMS, mix_paragraphs, skill_paragraphs, task_forms
from forgetlab.zoo.tokenizer import train_bpe_tokenizer


def tokenizer_texts(general: Sequence[str], tasks: dict[str, Sequence[TaskPair]]) -> list[str]:
    """Text the pico tokenizer is trained on: the Wikipedia train part plus every task's train pairs."""
    texts = list(general)
    for pairs in tasks.values():
        texts.extend(f"{p.prompt}{p.answer}" for p in pairs)
    return texts


def pretraining_texts(spec: ZooSpec, general: Sequence[str], tasks: dict[str, Sequence[TaskPair]]) -> list[str]:
    """The pico pretraining text: Wikipedia paragraphs with the tasks' train facts in general-text form spread
    through them, so that they make `spec.data.skill_share` of the characters (none when the share is 0).

    Like a real corpus, it holds a little of every skill the fine-tunes later sharpen, but not their prompt
    format: `47 + 8 = 55`, never `Compute: 47+8=`.
    """
    share = float(spec.data.skill_share)
    if not 0.0 <= share < 1.0:
        raise ParameterError(f"skill_share must be in [0, 1); got {share}.")
    general = list(general)
    if share == 0.0:
        return general
    chars = int(sum(map(len, general)) * share / (1.0 - share))
    forms = task_forms(spec.data.skill_form, list(tasks))
    extra: list[str] = []
    # one group of paragraphs per form (one form for every task: exactly the single-form text of before)
    for i, form in enumerate(dict.fromkeys(forms.values())):
        group = {t: list(p) for t, p in tasks.items() if forms[t] == form}
        part = skill_paragraphs(group, chars * len(group) // len(forms), seed=spec.seed + 10 * i, form=form,
                                per_paragraph=1 if form in DOCUMENT_FORMS else 8)
        extra = mix_paragraphs(extra, part) if extra else part
    return mix_paragraphs(general, extra)


def make_tokenizer(spec: ZooSpec, general: Sequence[str], tasks: dict[str, Sequence[TaskPair]]):
    """Train the pico tokenizer (byte-level BPE of `spec.vocab_size` tokens) on `tokenizer_texts` of the
    pretraining text (`pretraining_texts`) and the task train pairs."""
    return train_bpe_tokenizer(tokenizer_texts(pretraining_texts(spec, general, tasks), tasks),
                               vocab_size=spec.vocab_size)


def llama_config(shape: ModelShape, tokenizer):
    """A transformers.LlamaConfig of `shape` with tied embeddings, sized to the tokenizer and using its special ids."""
    return transformers.LlamaConfig(
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
    """A freshly initialised transformers.LlamaForCausalLM (weights drawn with `torch.manual_seed(seed)`), float32."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = transformers.LlamaForCausalLM(llama_config(shape, tokenizer))
    return model.float()
