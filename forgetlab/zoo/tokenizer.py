"""The pico zoo's tokenizer: a byte-level BPE trained offline with `tokenizers`, wrapped for transformers.

Digits are split into single-digit tokens before BPE (so arithmetic answers are written digit by digit), the
byte-level alphabet guarantees that any text can be encoded without an unknown token, and the special tokens
are `<pad>` (id 0), `<s>` (BOS, id 1) and `</s>` (EOS, id 2). Encoding with special tokens prepends `<s>`.
"""
from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
import transformers

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
SPECIAL_TOKENS = (PAD, BOS, EOS)


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2):
    """Train a byte-level BPE of `vocab_size` tokens on `texts`; return a `transformers.PreTrainedTokenizerFast`.

    The result has bos/eos/pad set, prepends BOS when `add_special_tokens=True`, and saves/loads with
    `save_pretrained` / `AutoTokenizer.from_pretrained`. Training is deterministic for the same texts.
    """
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size),
        min_frequency=int(min_frequency),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)],
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=None,
        model_max_length=1024, clean_up_tokenization_spaces=False,
    )
