"""Whether two checkpoints share a tokenizer: the one check behind every job that scores or merges a model with the
base's token ids (the pool, and through it the scorecards, sweeps and searches; textdiff; a merge without a
recipe `tokenizer:`; the merge's evaluation).

A vocabulary of the same size is not the same tokenizer: two BPEs trained on different text both have 1000 tokens,
and a model scored with the other's ids reads a different text. Two tokenizers are the same here when

- every token of the base's vocabulary (its BPE / WordPiece / Unigram pieces; the added and special tokens aside)
  has the same id in the other's (the other may have more: tokens added after the base's),
- their BPE merges are the same list, and
- a sample of mixed text (`SAMPLE`: prose, digits, code, accents, CJK, whitespace runs) encodes to the same ids
  (the normaliser and pre-tokenizer agree).

Added and special tokens are left out on purpose: fine-tunes rename reserved tokens (`<|reserved_5|>` →
`<|im_start|>`) or add a pad token, which changes nothing for text without them.

A tokenizer is read from its `tokenizer.json` with the `tokenizers` library (no transformers tokenizer is built);
one without (vocab.json/merges.txt, sentencepiece, a GGUF file) through transformers. A model
stored without tokenizer files is taken to use the base's (nothing to compare).
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tokenizers import Tokenizer

from forgetlab.core.checkpoints import load_tokenizer
from forgetlab.core.errors import IncompatibleModelsError

SAMPLE = ("The quick brown fox jumps over the lazy dog. In 1998, 3.14159 × 42 = 131.95!\n"
          "def f(x):\n    return {'a': x ** 2}  # code\t\ttabs   spaces\n"
          "Àl'été, naïve café — «quotes» “curly” 東京 Ελληνικά Привет 🙂 www.example.org/path?q=1&r=2")


@dataclass(frozen=True)
class TokenizerSignature:
    """What a tokenizer maps text to: its vocabulary pieces (token → id, added tokens aside), its BPE merges (None
    for other models), the ids of `SAMPLE`, and where it was read from (`source`)."""

    vocab: dict
    merges: Optional[tuple]
    sample: tuple
    source: str
    digest: str


def _merge_text(m: Any) -> str:
    """A BPE merge as "a b" (tokenizers writes "a b" strings before 0.20, ["a", "b"] pairs after)."""
    return " ".join(m) if isinstance(m, (list, tuple)) else str(m)


def _from_json(text: str, source: str) -> TokenizerSignature:
    data = json.loads(text)
    model = data.get("model") or {}
    added = {a.get("content") for a in data.get("added_tokens") or [] if isinstance(a, dict)}
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):              # Unigram: [[piece, score], …], ids in order
        vocab = {v[0]: i for i, v in enumerate(vocab)}
    pieces = {t: int(i) for t, i in vocab.items() if t not in added}
    merges = model.get("merges")
    tok = Tokenizer.from_str(text)
    tok.no_padding()
    tok.no_truncation()
    sample = tuple(tok.encode(SAMPLE, add_special_tokens=False).ids)
    return TokenizerSignature(pieces, None if merges is None else tuple(_merge_text(m) for m in merges), sample,
                              source, hashlib.sha256(text.encode("utf-8")).hexdigest())


@functools.lru_cache(maxsize=32)
def _json_signature(file: str, mtime_ns: int, size: int) -> TokenizerSignature:
    return _from_json(Path(file).read_text(encoding="utf-8"), str(Path(file).parent))


@functools.lru_cache(maxsize=8)
def _loaded_signature(ref: str, stamp: tuple) -> TokenizerSignature:
    tok = load_tokenizer(ref)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        return _from_json(backend.to_str(), ref)
    added = {str(t) for t in tok.added_tokens_decoder.values()}
    vocab = {t: i for t, i in tok.get_vocab().items() if t not in added}
    sample = tuple(tok(SAMPLE, add_special_tokens=False)["input_ids"])
    return TokenizerSignature(vocab, None, sample, ref, "")


def _stamp(path: Path) -> tuple:
    try:
        st = path.stat()
        return (st.st_mtime_ns, st.st_size)
    except OSError:
        return (0, 0)


def tokenizer_signature(ckpt) -> Optional[TokenizerSignature]:
    """The `TokenizerSignature` of a checkpoint's tokenizer (cached per file), or None when it stores none (it is
    then taken to use its base's)."""
    folder = getattr(ckpt, "tokenizer_dir", None)
    gguf = getattr(ckpt, "gguf_file", None) or getattr(getattr(ckpt, "base", None), "gguf_file", None)
    if folder is None and gguf is None:
        return None
    try:
        if folder is not None and (Path(folder) / "tokenizer.json").is_file():
            f = Path(folder) / "tokenizer.json"
            return _json_signature(str(f.resolve()), *_stamp(f))
        where = Path(folder) if folder is not None else Path(gguf)
        return _loaded_signature(str(ckpt.ref if folder is None else folder), (str(where), *_stamp(where)))
    except Exception:   # an unreadable tokenizer is left to the job that loads it, which says what is wrong
        return None


def tokenizer_difference(base, other) -> Optional[str]:
    """How the tokenizer of checkpoint `other` differs from the base's (`module docstring`), in words, or None when
    they are the same for scoring with the base's ids (or either has none to compare)."""
    a, b = tokenizer_signature(base), tokenizer_signature(other)
    if a is None or b is None or (a.digest and a.digest == b.digest):
        return None
    moved = [(t, i, b.vocab.get(t)) for t, i in a.vocab.items() if b.vocab.get(t) != i]
    if moved:
        t, i, j = moved[0]
        there = "lacks it" if j is None else f"gives it id {j}"
        return (f"{len(moved)} of the base's {len(a.vocab)} vocabulary tokens are missing there or have another id "
                f"(e.g. {t!r}: id {i} in the base's, while it {there})")
    if a.merges is not None and b.merges is not None and a.merges != b.merges:
        k = next((i for i, (x, y) in enumerate(zip(a.merges, b.merges)) if x != y), min(len(a.merges), len(b.merges)))
        first = f"merge {k}: {a.merges[k]!r} in the base's" if k < len(a.merges) else f"merge {k} is extra there"
        return f"the BPE merges differ ({len(a.merges)} in the base's, {len(b.merges)} there; first at {first})"
    if a.sample != b.sample:
        k = next((i for i, (x, y) in enumerate(zip(a.sample, b.sample)) if x != y), min(len(a.sample), len(b.sample)))
        return (f"the same text encodes to other ids (normaliser or pre-tokenizer): a sample sentence gives "
                f"{len(a.sample)} tokens with the base's and {len(b.sample)} with it, differing from token {k}")
    return None


def check_same_tokenizer(base, other, other_name: str) -> None:
    """Raise IncompatibleModelsError when `other`'s tokenizer differs from `base`'s (`tokenizer_difference`): the job
    would score or merge it with the base's token ids, silently reading another text. The message names both
    tokenizers, the difference and the fixes."""
    diff = tokenizer_difference(base, other)
    if diff is None:
        return
    a, b = tokenizer_signature(base), tokenizer_signature(other)
    raise IncompatibleModelsError(
        f"{other_name} has another tokenizer than the base: {diff}. Base's tokenizer: {a.source}; {other_name}'s: "
        f"{b.source}. Scoring or merging it with the base's token ids would read another text. Use a model "
        "fine-tuned from this base with its tokenizer; to merge it anyway, give the recipe a tokenizer "
        "(mergekit's `tokenizer_source: union`, `base` or the model's path), which aligns the embedding rows token "
        "by token; to score it, score it with its own tokenizer in a pool of its own base.")
