"""Mixed vocabularies (a recipe's `tokenizer:`), as mergekit 0.1.5 builds them (mergekit/tokenizer/build.py and
embed.py; docs/merging.md#mixed-vocabularies).

The output vocabulary is the base's (`base`), one model's (`MODEL`) or the `union` of all (the base's tokenizer
with every other model's tokens appended in order, then their added tokens), plus the tokens named under
`tokens:`, its size padded up to `pad_to_multiple_of`. Each input's embedding-like tensors (input embedding,
output head: rows indexed by token) are permuted onto it; a row an input lacks is filled as mergekit fills it:

- a token only one input has: that input's row; a token no input has: zeros;
- a token several inputs have: the base's row when the base is an input and has it, else their mean;
- `tokens: {T: {source: MODEL | {kind: zero} | {kind: model_token, model: M, token: X | token_id: N},
  force: true}}` overrides that (force: every input gets it, even those that have T);
- padding rows: each input's mean over the real rows.

The merge method then runs on the aligned tensors like on any other; the output config's vocab_size is the
new size, and the output tokenizer is written with it.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import transformers

from forgetlab.core.errors import ParameterError
from forgetlab.core.tokenizer_edits import strip_tokens_beyond
from forgetlab.merge.core import Entry

# tensors whose rows are tokens (vocabulary axis 0), by the end of their names, as mergekit's architectures list them
VOCAB_TENSORS = ("embed_tokens.weight", "lm_head.weight", "wte.weight", "embed_out.weight",
                 "word_embeddings.weight", "embed_in.weight")


def is_vocab_tensor(name: str) -> bool:
    """Whether tensor `name` has one row per token (an input embedding or an output head)."""
    return name.endswith(VOCAB_TENSORS)


def _config_vocab(ckpt) -> int | None:
    try:
        return int(ckpt.config.vocab_size)
    except Exception:
        return None


def _tokenizer_dir(ckpt) -> str:
    d = getattr(ckpt, "tokenizer_dir", None) or getattr(ckpt, "config_dir", None) or ckpt.path
    return str(d)


def _load(ckpt):
    return transformers.AutoTokenizer.from_pretrained(_tokenizer_dir(ckpt), use_fast=True)


def _stripped(ckpt):
    """The tokenizer without tokens whose id is ≥ the model's vocab_size (mergekit's get_stripped_tokenizer)."""
    tok = _load(ckpt)
    return strip_tokens_beyond(tok, _config_vocab(ckpt) or len(tok.get_vocab()), f"The tokenizer of {ckpt.path}")


def _union(base_tok, toks: dict[str, Any], sizes: dict[str, int | None]):
    """mergekit's build_union_tokenizer: the base's tokenizer, then every model's plain tokens it lacks, then their
    added tokens (first settings win)."""
    out_vocab: dict[str, int] = {}
    added: dict[str, Any] = {}
    for ref, tok in toks.items():
        size = sizes.get(ref) or tok.vocab_size
        dec = tok.added_tokens_decoder
        names = {info.content for info in dec.values()}
        for t, i in tok.get_vocab().items():
            if i >= size or t in names:
                continue
            out_vocab.setdefault(t, len(out_vocab))
        for i, info in dec.items():
            if i < size:
                added.setdefault(info.content, info)
    with tempfile.TemporaryDirectory() as d:
        base_tok.save_pretrained(d, legacy_format=False)
        res = transformers.AutoTokenizer.from_pretrained(d, use_fast=True)
    base_vocab = base_tok.get_vocab()
    for t in out_vocab:
        if t not in added and t not in base_vocab:
            res.add_tokens(t)
    for info in added.values():
        res.add_tokens(info)
    return res


@dataclass
class VocabularyPlan:
    """The output vocabulary and, per input, where each output token's row comes from (`perms[ref][i]`: the
    input's row of output token i, or −1)."""

    tokenizer: Any
    vocab: dict[str, int]
    size: int
    inputs: list[str]
    base: str | None
    perms: dict[str, list[int]]
    original: dict[str, dict[str, int]]
    tokens: dict[str, dict] = field(default_factory=dict)

    def align(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each input's tensor (rows = its tokens) on the output vocabulary (mergekit's PermutedVocabulary)."""
        models = [r for r in self.inputs if r in tensors]
        first = tensors[models[0]]
        shape, dtype = first.shape[1:], first.dtype
        for r in models:
            if tensors[r].shape[1:] != shape:
                raise ParameterError(f"The token rows of {r} have shape {tuple(tensors[r].shape[1:])}, those of "
                                     f"{models[0]} {tuple(shape)}: the models differ beyond their vocabulary.")
        cfgs = dict(self.tokens)
        average = set()
        for tok, i in self.vocab.items():
            if tok in cfgs:
                continue
            has = [self.perms[r][i] >= 0 for r in models]
            if sum(has) == 1:
                cfgs[tok] = {"source": models[has.index(True)]}
            elif sum(has) == 0:
                cfgs[tok] = {"source": {"kind": "zero"}}
            elif self.base in models and self.perms[self.base][i] >= 0:
                cfgs[tok] = {"source": self.base}
            else:
                average.add(tok)
        default: dict[str, torch.Tensor] = {}
        for tok, i in self.vocab.items():
            cfg = cfgs.get(tok)
            force = bool(cfg and cfg.get("force"))
            if not force and all(self.perms[r][i] >= 0 for r in models):
                continue
            if tok in average:
                rows = [tensors[r][self.perms[r][i]] for r in models if self.perms[r][i] >= 0]
                e = torch.zeros(shape, dtype=dtype)
                for row in rows:
                    e = e + row
                default[tok] = e / len(rows)
            elif cfg is not None:
                default[tok] = self._row(tok, i, cfg, tensors)
        out = {}
        n = len(self.vocab)
        for r in models:
            p = self.perms[r]
            new = torch.zeros((self.size, *shape), dtype=dtype)
            src = torch.tensor([p[i] for i in range(n)], dtype=torch.long)
            keep = src >= 0
            for tok, cfg in self.tokens.items():
                if cfg.get("force"):
                    keep[self.vocab[tok]] = False
            idx = torch.nonzero(keep).squeeze(1)
            new[idx] = tensors[r][src[idx]]
            for tok, row in default.items():
                if not keep[self.vocab[tok]]:
                    new[self.vocab[tok]] = row
            if self.size > n:
                new[n:] = new[:n].mean(dim=0)
            out[r] = new
        return out

    def _row(self, tok: str, i: int, cfg: dict, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        src = cfg.get("source")
        if isinstance(src, dict) and src.get("kind") == "zero":
            return torch.zeros_like(next(iter(tensors.values()))[0])
        model = src.get("model") if isinstance(src, dict) else src
        if model not in tensors:
            raise ParameterError(f"tokenizer token {tok!r} takes its embedding from {model!r}, which is not among "
                                 f"the models merged ({', '.join(tensors)}); name one of them.")
        if isinstance(src, dict):
            j = src.get("token_id")
            if j is None:
                if src.get("token") not in self.original[model]:
                    raise ParameterError(f"tokenizer token {tok!r}: {model} has no token {src.get('token')!r}; name "
                                         "a token of its vocabulary (or give token_id).")
                j = self.original[model][src["token"]]
            if not 0 <= int(j) < tensors[model].shape[0]:
                raise ParameterError(f"tokenizer token {tok!r}: token_id {j} is outside {model}'s "
                                     f"{tensors[model].shape[0]} rows.")
            return tensors[model][int(j)]
        j = self.perms[model][i]
        if j < 0:
            raise ParameterError(f"tokenizer token {tok!r} takes its embedding from {model}, which does not have "
                                 "that token; name a model that has it, or {kind: zero}.")
        return tensors[model][j]

    def tokenizer_files(self) -> dict[str, bytes]:
        """The output tokenizer's files (tokenizer.save_pretrained), by name."""
        with tempfile.TemporaryDirectory() as d:
            self.tokenizer.save_pretrained(d)
            return {p.name: p.read_bytes() for p in Path(d).iterdir() if p.is_file()}


def _check_tokens(tokens: dict, refs: Sequence[str]) -> dict[str, dict]:
    out = {}
    for tok, cfg in (tokens or {}).items():
        cfg = dict(cfg or {})
        extra = [k for k in cfg if k not in ("source", "force")]
        if extra:
            raise ParameterError(f"tokenizer token {tok!r} has unknown key(s) {', '.join(map(repr, extra))}; a token "
                                 "is {source: MODEL | {kind: zero} | {kind: model_token, model: M, token: T}, force: "
                                 "false}.")
        src = cfg.get("source")
        if src is None:
            raise ParameterError(f"tokenizer token {tok!r} has no source (mergekit then stops); give source: MODEL, "
                                 "{kind: zero} or {kind: model_token, model: M, token: T}.")
        if isinstance(src, dict):
            kind = src.get("kind")
            if kind == "model_token":
                if (src.get("token") is None) == (src.get("token_id") is None):
                    raise ParameterError(f"tokenizer token {tok!r}: a model_token source gives exactly one of token "
                                         "and token_id.")
                model = src.get("model")
            elif kind == "zero":
                model = None
            else:
                raise ParameterError(f"tokenizer token {tok!r}: source kind {kind!r} is not zero or model_token.")
        else:
            model = str(src)
        if model is not None and model not in refs:
            raise ParameterError(f"tokenizer token {tok!r} takes its embedding from {model!r}, which is not among the "
                                 f"recipe's models ({', '.join(refs)}); write one of those paths as written under "
                                 "models.")
        out[str(tok)] = cfg
    return out


def build_plan(tokenizer: dict, base_ref: str | None, refs: dict[str, Any]) -> VocabularyPlan:
    """The output vocabulary of a recipe's `tokenizer` over its inputs `refs` ({ref: checkpoint}, in input order)
    with mergekit's `base_model` `base_ref` (None: no base, the first input's tokenizer is the reference)."""
    names = list(refs)
    ref0 = base_ref if base_ref is not None else names[0]
    base_tok = _stripped(refs[ref0])
    toks = {ref0: base_tok}
    for r in names:
        if r != ref0:
            toks[r] = _load(refs[r])
    sizes = {r: _config_vocab(c) for r, c in refs.items()}
    src = tokenizer["source"]
    if src == "base":
        out = base_tok
    elif src == "union":
        out = _union(base_tok, toks, sizes)
    else:
        if src not in refs:
            raise ParameterError(f"tokenizer source {src!r} is not among the recipe's models ({', '.join(names)}); "
                                 "write base, union, or one of those paths as written under models.")
        out = _load(refs[src])
    tokens = _check_tokens(tokenizer.get("tokens") or {}, names)
    have = set(out.get_vocab())
    for t in tokens:
        if t not in have:
            out.add_tokens(t)
            have.add(t)
    vocab = out.get_vocab()
    size = len(vocab)
    pad = tokenizer.get("pad_to_multiple_of")
    if pad and size % pad:
        size = (size // pad + 1) * pad
    perms = {}
    for r in names:
        mv = toks.get(r, base_tok).get_vocab()
        limit = sizes.get(r) or len(mv)
        row = [-1] * len(vocab)
        for t, i in vocab.items():
            j = mv.get(t, -1)
            row[i] = j if 0 <= j < limit else -1
        perms[r] = row
    return VocabularyPlan(out, vocab, size, names, base_ref, perms, {r: t.get_vocab() for r, t in toks.items()},
                          tokens)


class AlignedSource:
    """A merge source whose token-row tensors are read on the output vocabulary (the other tensors as stored).
    Every input's aligned rows are computed together on the first read of a tensor (they depend on each other)
    and kept until each input has read its own."""

    vocab_aligned = True

    def __init__(self, inner, ref: str, plan: VocabularyPlan, group: list["AlignedSource"], alias: str | None = None):
        """`alias`: the input whose rows this source reads (itself, or for a base that is no input of the
        method, such as linear's config donor, the first input)."""
        self.inner, self.ref, self.plan, self.group, self.alias = inner, ref, plan, group, alias or ref
        self._cache: dict[str, torch.Tensor] = {}
        group.append(self)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def entries(self):
        ent = self.inner.entries()
        for n, e in list(ent.items()):
            if is_vocab_tensor(n):
                ent[n] = Entry(n, (self.plan.size, *e.shape[1:]), e.dtype)
        return ent

    def nbytes(self, name: str) -> int:
        return 0 if is_vocab_tensor(name) else self.inner.nbytes(name)

    def _aligned(self, name: str) -> torch.Tensor:
        if name not in self._cache:
            readers: dict[str, AlignedSource] = {}
            for s in self.group:
                if s.alias == s.ref:
                    readers.setdefault(s.ref, s)
            tensors = {r: s.inner.read(name) for r, s in readers.items()}
            for r, t in self.plan.align(tensors).items():
                for s in self.group:
                    if s.alias == r:
                        s._cache[name] = t
        return self._cache.pop(name)

    def read(self, name: str, device: str = "cpu", buffer=None) -> torch.Tensor:
        if is_vocab_tensor(name):
            return self._aligned(name).to(device=device, dtype=torch.float32, copy=True)
        return self.inner.read(name, device, buffer)

    def read_raw(self, name: str) -> torch.Tensor:
        return self._aligned(name) if is_vocab_tensor(name) else self.inner.read_raw(name)
