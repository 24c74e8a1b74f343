"""Edits to a loaded tokenizer: the tokens beyond a model's embedding rows stripped (a GGUF file's tokenizer, with
the token the GPT-2 builder appends; a mergekit-style merge of a model whose tokenizer outgrew its embeddings)."""
from __future__ import annotations

import json

import tokenizers

from forgetlab.core.errors import ParameterError


def strip_tokens_beyond(tok, size: int, what: str = "the tokenizer"):
    """`tok` (a transformers fast tokenizer) without the tokens whose id is ≥ `size`, the model's embedding rows (a
    token there makes the model index past its embeddings): added tokens are dropped, and vocabulary tokens of a BPE
    with the merges that use them (mergekit's get_stripped_tokenizer). Returns `tok`, changed in place.
    ParameterError for other models (a Unigram or WordPiece vocabulary cannot lose tokens in the middle)."""
    beyond = {t for t, i in tok.get_vocab().items() if i >= size}
    if not beyond:
        return tok
    d = json.loads(tok._tokenizer.to_str())
    d["added_tokens"] = [e for e in d.get("added_tokens") or [] if e["id"] < size]
    vocab = d["model"].get("vocab")
    in_model = beyond & set(vocab) if isinstance(vocab, dict) else {v[0] for v in vocab or []} & beyond
    if in_model:
        if d["model"]["type"] != "BPE":
            raise ParameterError(f"{what} has tokens beyond its {size} embedding rows in its {d['model']['type']} "
                                 "vocabulary; like mergekit, forgetlab strips such tokens only from BPE tokenizers. "
                                 "Remove those tokens from the tokenizer, or resize the embeddings.")
        for t in in_model:
            vocab.pop(t, None)
        d["model"]["merges"] = [m for m in d["model"].get("merges") or []
                                if not in_model & set(m.split(" ") if isinstance(m, str) else m)]
    tok._tokenizer = tokenizers.Tokenizer.from_str(json.dumps(d))
    return tok
