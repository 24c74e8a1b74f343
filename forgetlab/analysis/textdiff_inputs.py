"""What a text diff reads (docs/textdiff.md): the two models (a pool model, a WiSE-FT point, a merge or a folder)
and the texts (the lines of a file, or the held-out blocks the scorecard's general loss scores)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

from forgetlab.core.checkpoints import load_model, open_checkpoint
from forgetlab.core.checkpoints.lora import read_adapter_config
from forgetlab.core.data import encode_documents, encode_text
from forgetlab.core.errors import CheckpointError, ForgetlabError, ParameterError, ProbeDataError, check_fraction
from forgetlab.core.evaluate import GENERAL_LOSS_MODES
from forgetlab.core.pool import BASE, check_compatible
from forgetlab.core.workspace import merges_dir
from forgetlab.merge.working_copy import WorkingCopy


# --------------------------------------------------------------------------------------- model references


@dataclass(frozen=True)
class ModelRef:
    """One side of the comparison: what the user named (`ref`), how it is built (`kind`: ``pool`` — a pool
    member or the base, ``sweep`` — the WiSE-FT point θ0 + α(θ1 − θ0) of a pool fine-tune, ``merge`` — a merged
    model under the workspace's merges/, ``path`` — a model folder or adapter), and its label."""

    ref: str
    kind: str
    label: str
    alpha: Optional[float] = None
    path: Optional[str] = None


def _open_outside(pool, ref: str, path: Path, what: str):
    """The checkpoint of a model outside the pool, refused unless it is compatible with the pool's base."""
    adapter = (path / "adapter_config.json").is_file()
    try:
        ckpt = open_checkpoint(str(path))
    except CheckpointError as exc:
        if not adapter:
            raise
        base = read_adapter_config(path).get("base_model_name_or_path")
        raise CheckpointError(f"{ref} is a LoRA adapter whose base model ({base or 'not named'}) cannot be opened "
                              f"({exc}). An adapter is scored on its base: add it to the pool file as "
                              f"`models: {{NAME: {{adapter: {path}}}}}` so it applies to the pool's base, or set "
                              "base_model_name_or_path in its adapter_config.json to the base folder.") from None
    check_compatible(pool.base, ckpt, f"{what} {ref}")
    return ckpt


def resolve_model(pool, ref: Optional[str], *, alpha: Optional[float] = None, home=None,
                  role: str = "--model") -> ModelRef:
    """What `ref` names, checked without loading weights: ``base`` or a model of the pool; with `alpha`, the
    WiSE-FT point of a pool fine-tune; the name of a merge under the workspace's merges/; or a model folder
    (or PEFT adapter whose base can be opened) compatible with the pool's base. Anything else is a
    ForgetlabError listing what exists."""
    if ref is None or not str(ref).strip():
        raise ParameterError(f"{role} is empty; name a model of the pool ({', '.join([BASE, *pool.model_names])}), "
                             "a merge of the workspace or a model folder.")
    ref = str(ref)
    if alpha is not None:
        a = check_fraction("--alpha", alpha)
        if ref not in pool.model_names:
            raise ParameterError(f"--alpha makes a WiSE-FT point θ0 + α(θ1 − θ0) of a fine-tuned model of the pool; "
                                 f"{ref!r} is not one (its fine-tuned models: {', '.join(pool.model_names) or 'none'}"
                                 "). Drop --alpha, or name one of them.")
        return ModelRef(ref, "sweep", f"{ref}@alpha={a:g}", alpha=a)
    if ref == BASE or ref in pool.model_names:
        return ModelRef(ref, "pool", ref)
    merge = merges_dir(home) / ref
    if "/" not in ref and merge.is_dir() and (merge / "config.json").is_file():
        _open_outside(pool, ref, merge, "the merge")
        return ModelRef(ref, "merge", ref, path=str(merge))
    path = Path(ref).expanduser()
    if path.exists():
        _open_outside(pool, ref, path, "the model")
        return ModelRef(ref, "path", path.name or ref, path=str(path.resolve()))
    merges = sorted(p.name for p in merges_dir(home).glob("*") if (p / "config.json").is_file()) \
        if merges_dir(home).is_dir() else []
    raise ForgetlabError(f"{role} {ref!r} is not a model of the pool ({', '.join([BASE, *pool.model_names])}), "
                         f"not a merge in {merges_dir(home)} ({', '.join(merges) or 'none'}) and not a folder. "
                         "Name one of those, or give the path of a model folder.")


def load_scored_model(pool, mref: ModelRef, device: Optional[str], dtype=None):
    """The model for forward passes in `dtype` (None: float32): the pool's cached model, a fresh working copy at
    the WiSE-FT point (built by the registry's wise_ft through forgetlab.merge.working_copy, as the sweeps build
    theirs: θ0 + α(θ1 − θ0) in float32, rounded once to `dtype`), or the folder."""
    dtype = dtype or torch.float32
    if mref.kind == "pool":
        return pool.load(mref.ref, device=device, dtype=dtype)
    if mref.kind == "sweep":
        work = WorkingCopy.load(pool, mref.ref, device=device, dtype=dtype)
        work.lerp(work.tuned, mref.alpha)
        return work.model.eval()
    return load_model(mref.path, device=device, dtype=dtype)


# ------------------------------------------------------------------------------------------------ texts


@dataclass
class Sequence_:
    """One scored sequence: its token ids, a name (``line 3``, ``line 3, piece 2/3``, ``block 0``) and the
    1-based line of the text it comes from (None for a held-out block)."""

    ids: list[int]
    name: str
    line: Optional[int] = None


def read_text_lines(path) -> list[str]:
    """The lines of a UTF-8 text file that hold something besides whitespace; a ProbeDataError for a missing,
    unreadable or empty file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ProbeDataError(f"The text file {p} does not exist; pass a UTF-8 text file (one document per line).")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ProbeDataError(f"{p} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8.") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ProbeDataError(f"{p} is empty: it has no line with text to score. Put one document per line.")
    return lines


def context_length(config) -> Optional[int]:
    """The longest sequence the model takes (max_position_embeddings / n_positions), None when unknown."""
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def line_sequences(tokenizer, lines: Sequence[str], context: Optional[int]) -> tuple[list[Sequence_], list[str]]:
    """Each line tokenized as the tokenizer does by default; a line longer than `context` tokens is split into
    pieces of at most `context` tokens, each scored from its own start (a note says so). Returns the sequences
    and the notes."""
    seqs, notes = [], []
    for i, line in enumerate(lines, 1):
        ids = list(tokenizer(line)["input_ids"])
        if not ids:
            continue
        if context is None or len(ids) <= context:
            seqs.append(Sequence_(ids, f"line {i}", i))
            continue
        pieces = [ids[s:s + context] for s in range(0, len(ids), context)]
        notes.append(f"line {i} has {len(ids)} tokens, more than the model's context of {context}: split into "
                     f"{len(pieces)} pieces, each scored from its own start (the first tokens of pieces 2… are "
                     "predicted without the text before them)")
        seqs += [Sequence_(p, f"line {i}, piece {k}/{len(pieces)}", i) for k, p in enumerate(pieces, 1)]
    if not seqs:
        raise ProbeDataError("The text has no token to score: every line tokenized to nothing.")
    return seqs, notes


def heldout_sequences(pool, *, max_general: Optional[int] = None, block_size: int = 128,
                      general_mode: str = "blocks") -> list[Sequence_]:
    """The blocks the scorecard's general loss scores (`forgetlab.core.evaluate.general_loss` with the same
    block size, limit and mode)."""
    if not pool.probes.general:
        raise ProbeDataError("The pool has no held-out general text: add `probes: general:` to the pool file, or "
                             "pass --text FILE.")
    if general_mode not in GENERAL_LOSS_MODES:
        raise ParameterError(f"Unknown general-loss mode {general_mode!r}; choose one of "
                             f"{', '.join(GENERAL_LOSS_MODES)}.")
    encode = encode_documents if general_mode == "documents" else encode_text
    what = "document" if general_mode == "documents" else "block"
    return [Sequence_(list(e.input_ids), f"{what} {i}")
            for i, e in enumerate(encode(pool.tokenizer, pool.probes.general, block_size, max_general))]


def text_sequences(pool, *, text=None, lines: Optional[Sequence[str]] = None, max_general: Optional[int] = None,
                   block_size: int = 128, general_mode: str = "blocks") -> tuple[list[Sequence_], list[str], str]:
    """(the sequences to score, notes, the source's name): the lines of the file `text` or the strings `lines`
    (split where longer than the model's context), else the scorecard's held-out blocks."""
    if text is not None or lines is not None:
        raw = read_text_lines(text) if text is not None else [str(x) for x in lines if str(x).strip()]
        if not raw:
            raise ProbeDataError("The text is empty: type or paste at least one line to score.")
        seqs, notes = line_sequences(pool.tokenizer, raw, context_length(pool.config))
        return seqs, notes, str(Path(text).expanduser().resolve()) if text is not None else "typed text"
    seqs = heldout_sequences(pool, max_general=max_general, block_size=block_size, general_mode=general_mode)
    return seqs, [], "heldout"
