"""The memory estimate of `forgetlab.analysis.textdiff.textdiff` (registered as job "textdiff").

The job holds both models (the model and its reference) in its dtype for the whole run. Per batch of B
sequences of at most S tokens it keeps both models' final hidden states and, for the logit lens, the residual
stream after every layer (L + 1 tensors of B·S·H per model), while a forward pass makes a layer's
activations. Then, one sequence at a time, both models' logits in float32 (S·V·4 each, made from S·V in the
dtype) and the vocabulary-chunked log-softmax and KL (`VOCAB_CHUNK` columns, five float32 temporaries of
S × chunk). With P the larger model's parameters, b the dtype's bytes, H, I, A, V, L the hidden width, MLP
width, heads, vocabulary and layers:

    2·P·b
    + 2·B·S·H·b·(L + 2 with the lens, else 1)                                    (held outputs)
    + max(B·S·(4H + 3I)·b + B·A·S²·4,  S·V·(8 + b) + 5·S·min(V, chunk)·4)       (forward | scoring)
    + the token table (`TABLE_BYTES_PER_TOKEN` per scored token: the sequences' ids, the score columns, the
      table's strings; measured on the pico zoo's BPE: 324 B on 40000 short lines, 335 B on one 1 MB line)

Before the models are loaded, the text is tokenized one line at a time: the fast tokenizer's encoding of the
longest line (its ids, token strings and offsets) and the id lists made from it take `TOKENIZE_BYTES_PER_TOKEN`
per token of that line (402 B measured); on a text of one long line that phase is the peak. The estimate is the
larger phase, shown with its parts.

A WiSE-FT point (`--alpha`) is built before the scoring by rewriting a fresh copy tensor by tensor: θ0, θ1 and
the result of the largest tensor in float32 (3·E·4, `forgetlab.analysis.sweep_memory`); the peak takes the
larger of that and the scoring's extra. A side loaded in the dtype its safetensors checkpoint stores is held as
memory-mapped file pages on the CPU (`features_memory.mapped_weights`): counted, under its own name.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from forgetlab.analysis.features_memory import MAPPED, mapped_weights
from forgetlab.analysis.textdiff_inputs import resolve_model, text_sequences
from forgetlab.core.checkpoints import open_checkpoint
from forgetlab.core.memory import (MemoryEstimate, ModelSize, dtype_bytes, dtype_fixes, dtype_name, job_dtype,
                                   register_estimator)

F32 = 4
TABLE_BYTES_PER_TOKEN = 360
TOKENIZE_BYTES_PER_TOKEN = 420


def textdiff_parts(size: ModelSize, *, dtype, batch: int, seq: int, longest: int, tokens: int, lens: bool = True,
                   chunk: int = 32768, wise_ft: bool = False, mapped: int = 0, longest_line: int = 0) -> dict[str, int]:
    """The parts of the textdiff job's peak in bytes (module docstring): `batch` sequences of at most `seq`
    tokens in the largest batch, `longest` tokens in the longest sequence, `tokens` tokens scored in all;
    `mapped` of the two models (0, 1 or 2) held as memory-mapped checkpoint pages; `longest_line` tokens in the
    longest line of a text (0 for held-out blocks), whose tokenization is a phase of its own. Returns the parts
    of the larger phase."""
    b = dtype_bytes(dtype)
    V, H = max(size.vocab, 1), max(size.hidden, 1)
    held = 2 * batch * seq * H * b * ((size.layers + 2) if lens else 1)
    forward = batch * seq * (4 * H + 3 * size.intermediate) * b + batch * max(size.heads, 1) * seq * seq * F32
    scoring = longest * V * (2 * F32 + b) + 5 * longest * min(V, int(chunk)) * F32
    extra = held + max(forward, scoring)
    if wise_ft:
        extra = max(extra, 3 * max(V * H, size.layer_parameters // 3) * F32)
    parts = {"weights": (2 - mapped) * size.bytes(dtype), "weights" + MAPPED: mapped * size.bytes(dtype),
             "one batch's outputs and scores": extra, "token table": tokens * TABLE_BYTES_PER_TOKEN}
    tokenizing = {"tokenizing the longest line": longest_line * TOKENIZE_BYTES_PER_TOKEN}
    if sum(tokenizing.values()) > sum(parts.values()):
        return tokenizing
    return {k: v for k, v in parts.items() if v or k == "weights"}


def _checkpoint(pool, mref):
    """The checkpoint whose sizes a side of the comparison has (a WiSE-FT point has its fine-tune's)."""
    if mref.kind in ("pool", "sweep"):
        return pool.checkpoint(mref.ref)
    return open_checkpoint(mref.path)


def _largest_batch(lengths: Sequence[int], batch_size: int) -> tuple[int, int]:
    """(rows, tokens of the longest) of the largest batch, sequences sorted by length as `_score` batches them."""
    order = sorted(lengths)
    best = (1, 1)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        if len(rows) * rows[-1] > best[0] * best[1]:
            best = (len(rows), rows[-1])
    return best


@register_estimator("textdiff")
def estimate_textdiff(pool, model: str, *, against: str = "base", alpha: Optional[float] = None, text=None,
                      lines: Optional[Sequence[str]] = None, split: Optional[str] = None,
                      max_general: Optional[int] = None, block_size: int = 128, general_mode: str = "blocks",
                      batch_size: int = 16, device: Optional[str] = None, dtype=None, lens: bool = True,
                      vocab_chunk: int = 32768, home=None, **_: Any) -> MemoryEstimate:
    """The peak of `textdiff` (module docstring), with the flags that shrink it in the order they help most.
    Reads headers and tokenizes the text; loads no weights."""
    dt = job_dtype(dtype, device)
    refs = [resolve_model(pool, model, alpha=alpha, home=home), resolve_model(pool, against, home=home,
                                                                               role="--against")]
    size = max((ModelSize.of(_checkpoint(pool, r)) for r in refs), key=lambda s: s.parameters)
    # a WiSE-FT point is a rewritten copy: its pages are the job's own, never the file's
    mapped = sum(r.kind != "sweep" and mapped_weights(_checkpoint(pool, r), dt, device) for r in refs)
    seqs = text_sequences(pool, text=text, lines=lines, max_general=max_general, block_size=block_size,
                          general_mode=general_mode)[0]
    lengths = [len(s.ids) for s in seqs]
    per_line: dict[int, int] = {}
    for s in seqs:
        if s.line is not None:
            per_line[s.line] = per_line.get(s.line, 0) + len(s.ids)
    rows, seq = _largest_batch(lengths, int(batch_size))
    parts = textdiff_parts(size, dtype=dt, batch=rows, seq=seq, longest=max(lengths), tokens=sum(lengths),
                           lens=lens, chunk=vocab_chunk, wise_ft=alpha is not None, mapped=mapped,
                           longest_line=max(per_line.values(), default=0))
    text_bound = parts.get("tokenizing the longest line", 0) + parts.get("token table", 0) >= sum(parts.values()) / 2
    fixes = (["a shorter text (fewer or shorter lines, or --max-general)"] if text_bound else []) + dtype_fixes(dt) + (
        ["--no-lens"] if lens else []) + (["a smaller --batch-size"] if rows > 1 else [])
    return MemoryEstimate("textdiff", str(device or "cpu"), dtype_name(dt), parts, fixes=fixes)
