"""The scoring of a text diff (docs/textdiff.md): each token's class, and every token of a batch of sequences
scored under two models — log-probabilities, rise, KL(p_base ‖ p_model) over the vocabulary in `VOCAB_CHUNK`-column
chunks, top-k — one sequence's logits at a time (`forgetlab.analysis.textdiff` runs it)."""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from forgetlab.analysis.textdiff_inputs import Sequence_
from forgetlab.analysis.textdiff_results import COLUMNS, TOP_K
from forgetlab.core.anatomy import Anatomy
from forgetlab.core.data import EncodedExample, collate
from forgetlab.core.errors import ForgetlabError
from forgetlab.core.progress import Progress, report
from forgetlab.core.submodules import first_tensor

VOCAB_CHUNK = 32768


# ------------------------------------------------------------------------------------------ token classes


def token_class(text: str, special: bool = False) -> str:
    """The class of a token from its decoded text: ``special`` (one of the tokenizer's special tokens),
    ``whitespace`` (only spaces, tabs and newlines, or nothing), ``word`` (holds a letter), ``number`` (holds a
    digit and no letter), else ``punctuation`` (punctuation, symbols, and the replacement character a lone
    byte of a multi-byte character decodes to)."""
    if special:
        return "special"
    s = text.strip()
    if not s:
        return "whitespace"
    if any(ch.isalpha() for ch in s):
        return "word"
    if any(unicodedata.category(ch) == "Nd" for ch in s):
        return "number"
    return "punctuation"


def shown(text: str) -> str:
    """A decoded token as the token table stores it: control characters other than newline and tab written as
    escapes (``\\r``, ``\\x1c``), so that a CSV of the table reads back row for row (a bare carriage return
    is a line break to CSV readers)."""
    if not any(unicodedata.category(ch) == "Cc" and ch not in "\n\t" for ch in text):
        return text
    return "".join(repr(ch)[1:-1] if unicodedata.category(ch) == "Cc" and ch not in "\n\t" else ch for ch in text)


# ------------------------------------------------------------------------------------------ the scoring


def _lse(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """logsumexp over the last dimension, over `chunk` columns at a time."""
    if x.shape[-1] <= chunk:
        return torch.logsumexp(x, -1)
    parts = [torch.logsumexp(x[:, s:s + chunk], -1) for s in range(0, x.shape[-1], chunk)]
    return torch.logsumexp(torch.stack(parts, -1), -1)


def token_scores(logits_base: torch.Tensor, logits_model: torch.Tensor, targets: torch.Tensor,
                 chunk: int = VOCAB_CHUNK, k: int = TOP_K) -> dict[str, torch.Tensor]:
    """Per row of two [n, V] logit matrices and the n target ids: logp of the target under each, the KL
    divergence KL(p_base ‖ p_model) over the vocabulary, and each side's top-k ids and probabilities, computed
    over `chunk` vocabulary columns at a time."""
    lb, lm = logits_base.float(), logits_model.float()
    lse_b, lse_m = _lse(lb, chunk), _lse(lm, chunk)
    t = targets.view(-1, 1)
    out = {"logp_base": lb.gather(1, t).squeeze(1) - lse_b, "logp_model": lm.gather(1, t).squeeze(1) - lse_m}
    kl = torch.zeros_like(lse_b)
    for s in range(0, lb.shape[-1], chunk):
        a = lb[:, s:s + chunk] - lse_b[:, None]
        b = lm[:, s:s + chunk] - lse_m[:, None]
        kl += (a.exp() * (a - b)).sum(-1)
    out["kl"] = kl.clamp_min(0.0)      # ≥ 0 in exact arithmetic; rounding can leave −1e-9
    kk = min(k, lb.shape[-1])
    for side, x, lse in (("base", lb, lse_b), ("model", lm, lse_m)):
        vals, ids = torch.topk(x, kk, dim=-1)
        out[f"top_{side}"] = ids
        out[f"p_{side}"] = (vals - lse[:, None]).exp()
    return out


def final_norm(decoder) -> Optional[torch.nn.Module]:
    """The decoder stack's final norm: its one direct child that is a norm module (``norm``, GPT-2's ``ln_f``,
    GPT-NeoX's ``final_layer_norm``, …); None when there is none or more than one (then no logit lens)."""
    norms = [m for n, m in decoder.named_children() if "norm" in type(m).__name__.lower()
             or n.startswith("ln_") or "norm" in n]
    return norms[0] if len(norms) == 1 else None


class LogitReader:
    """How one model's hidden states become logits: the decoder's final hidden states through the head (and
    the residual stream after each layer through the final norm and the head, for the logit lens), then the
    model's own output transforms: Cohere's ``logit_scale`` multiplies, Granite's ``logits_scaling`` divides,
    Gemma-2/3's ``final_logit_softcapping`` caps (in that order, as the models compute them)."""

    def __init__(self, model, lens: bool):
        self.model = model
        self.head = model.get_output_embeddings()
        config = model.config
        self.cap = getattr(config, "final_logit_softcapping", None)
        self.scale = getattr(config, "logit_scale", None)
        self.divide = getattr(config, "logits_scaling", None)
        mods = dict(model.named_modules())
        try:
            self.anatomy = Anatomy.from_model(model)
        except ForgetlabError:
            self.anatomy = None
        self.decoder = mods.get(self.anatomy.prefix.rstrip(".")) if self.anatomy is not None else None
        self.norm = final_norm(self.decoder) if self.decoder is not None else None
        self.layers = [mods[self.anatomy.layer_path(i)] for i in range(self.anatomy.num_layers)] \
            if self.anatomy is not None else []
        self.lens = bool(lens and self.norm is not None and self.layers and self.head is not None)

    @property
    def plain(self) -> bool:
        return self.decoder is None or self.head is None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits the model computes from final hidden states `hidden` (head, then its output transforms)."""
        out = self.head(hidden).float()
        if isinstance(self.scale, (int, float)) and self.scale not in (0, 1):
            out = out * self.scale
        if isinstance(self.divide, (int, float)) and self.divide not in (0, 1):
            out = out / self.divide
        if self.cap:
            out = torch.tanh(out / self.cap) * self.cap
        return out

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor):
        """(final hidden states or, without a decoder/head, the logits; the residual stream per depth or None)."""
        if self.plain:
            return self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float(), None
        residual: list[Optional[torch.Tensor]] = [None] * (len(self.layers) + 1)
        handles = []
        if self.lens:
            def pre(mod, args, kwargs):
                residual[0] = args[0] if args else kwargs["hidden_states"]

            def post(i):
                def hook(mod, args, out):
                    residual[i + 1] = first_tensor(out)
                return hook

            handles.append(self.layers[0].register_forward_pre_hook(pre, with_kwargs=True))
            handles += [layer.register_forward_hook(post(i)) for i, layer in enumerate(self.layers)]
        try:
            hidden = self.decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        finally:
            for h in handles:
                h.remove()
        return hidden, (residual if self.lens else None)


def _device_of(model) -> torch.device:
    return next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))


@dataclass
class ScoreColumns:
    """The token table's columns as they are scored, one array per column, rows in sequence order (sequence d's
    positions at `offsets[d]`…): ids and positions int64, scores float64, each side's top-k ids and probabilities
    k-major ([TOP_K, n]: column k is contiguous), so that the table takes them without a copy."""

    n: int = 0
    offsets: Optional[np.ndarray] = None
    rows: dict[str, np.ndarray] = field(default_factory=dict)
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    lens_base: Optional[torch.Tensor] = None
    lens_model: Optional[torch.Tensor] = None
    lens_tokens: int = 0

    @classmethod
    def empty(cls, seqs: Sequence[Sequence_]) -> "ScoreColumns":
        lengths = np.fromiter((len(s.ids) for s in seqs), dtype=np.int64, count=len(seqs))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        n = int(offsets[-1])
        acc = cls(n, offsets)
        acc.rows = {"doc": np.repeat(np.arange(len(seqs), dtype=np.int64), lengths),
                    "position": np.arange(n, dtype=np.int64) - np.repeat(offsets[:-1], lengths),
                    "token_id": np.empty(n, dtype=np.int64)}
        for d, seq in enumerate(seqs):
            acc.rows["token_id"][offsets[d]:offsets[d + 1]] = seq.ids
        for name in ("logp_base", "logp_model", "kl"):
            acc.scores[name] = np.full(n, np.nan)
        for side in ("base", "model"):
            acc.scores[f"top_{side}"] = np.full((TOP_K, n), -1, dtype=np.int64)
            acc.scores[f"p_{side}"] = np.full((TOP_K, n), np.nan)
        return acc

    def put(self, d: int, res: dict[str, torch.Tensor]) -> None:
        """Sequence d's scores (rows 1… of it; row 0 predicts nothing and stays NaN / −1)."""
        a, b = int(self.offsets[d]) + 1, int(self.offsets[d + 1])
        for name in ("logp_base", "logp_model", "kl"):
            self.scores[name][a:b] = res[name].cpu().double().numpy()
        for side in ("base", "model"):
            ids, ps = res[f"top_{side}"].cpu(), res[f"p_{side}"].cpu().double()
            self.scores[f"top_{side}"][:ids.shape[1], a:b] = ids.T.numpy()
            self.scores[f"p_{side}"][:ps.shape[1], a:b] = ps.T.numpy()


@torch.no_grad()
def score_sequences(readers: tuple[LogitReader, LogitReader], seqs: Sequence[Sequence_], batch_size: int, pad_id: int,
           chunk: int, progress: Progress, lens_blocks: Optional[int] = None) -> ScoreColumns:
    """Forward both models over the sequences in batches (sorted by length, as the scorecard batches them) and
    score every position of each sequence; positions of a sequence come out in order, sequences in input order.
    Each sequence's scores go straight into the table's columns (`ScoreColumns`). The logit lens reads the first
    `lens_blocks` sequences (all when None)."""
    acc = ScoreColumns.empty(seqs)
    lens = all(r.lens for r in readers)
    n_depth = len(readers[0].layers) + 1 if lens else 0
    if lens:
        acc.lens_base = torch.zeros(n_depth, dtype=torch.float64)
        acc.lens_model = torch.zeros(n_depth, dtype=torch.float64)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].ids))
    done = 0
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        batch = collate([EncodedExample(seqs[i].ids, seqs[i].ids) for i in idx], pad_id)
        outs = []
        for r in readers:
            dev = _device_of(r.model)
            outs.append(r.forward(batch["input_ids"].to(dev), batch["attention_mask"].to(dev)))
        for row, i in enumerate(idx):
            n = len(seqs[i].ids)
            if n < 2:
                continue
            dev = outs[0][0].device
            targets = torch.tensor(seqs[i].ids[1:], device=dev)
            logits = [r.logits(o[0][row, :n - 1]) if not r.plain else o[0][row, :n - 1]
                      for r, o in zip(readers, outs)]
            acc.put(i, token_scores(logits[0], logits[1].to(dev), targets, chunk))
            del logits
            if lens and (lens_blocks is None or i < lens_blocks):
                for d in range(n_depth):
                    for r, o, tot in zip(readers, outs, (acc.lens_base, acc.lens_model)):
                        h = o[1][d][row, :n - 1]
                        lg = r.logits(r.norm(h)) if d < n_depth - 1 else r.logits(o[0][row, :n - 1])
                        tot[d] += float(F.cross_entropy(lg, targets.to(lg.device), reduction="sum"))
                acc.lens_tokens += n - 1
        done += len(idx)
        report(progress, done / len(seqs), f"{done}/{len(seqs)} sequences")
        del outs
    return acc


def token_table(acc: ScoreColumns, tokenizer) -> pd.DataFrame:
    """The token table (COLUMNS) from the scores, with every id decoded once (`shown`). The accumulated columns
    become the table's without a copy (they are handed over: `acc` is emptied); the strings are looked up by id."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    rows, scores = acc.rows, acc.scores
    acc.rows, acc.scores = {}, {}
    ids = rows["token_id"]
    every = np.unique(np.concatenate([ids, *(scores[f"top_{side}"].ravel() for side in ("base", "model"))]))
    every = every[every >= 0]
    size = int(every[-1]) + 2 if every.size else 1
    text = np.full(size, "", dtype=object)                  # id → decoded token; the last slot ("") for −1
    kind = np.full(size, "", dtype=object)
    for i in every.tolist():
        text[i] = shown(tokenizer.decode([i]))
        kind[i] = token_class(text[i], i in special)
    cols: dict[str, object] = {"doc": rows.pop("doc"), "position": rows.pop("position"), "token_id": ids,
                               "token": text[ids], "token_class": kind[ids]}
    cols["logp_base"], cols["logp_model"] = scores.pop("logp_base"), scores.pop("logp_model")
    cols["rise"] = cols["logp_base"] - cols["logp_model"]
    cols["kl"] = scores.pop("kl")
    for side in ("base", "model"):
        top, ps = scores.pop(f"top_{side}"), scores.pop(f"p_{side}")
        for k in range(TOP_K):
            cols[f"top{k + 1}_{side}"] = text[top[k]]       # −1 indexes the last slot: ""
            cols[f"p{k + 1}_{side}"] = ps[k]
        del top
    return pd.DataFrame({c: cols[c] for c in COLUMNS}, copy=False)
