"""The scoring of a text diff (docs/textdiff.md): each token's class, and every token of a batch of sequences
scored under two models — log-probabilities, rise, KL(p_base ‖ p_model) over the vocabulary in `VOCAB_CHUNK`-column
chunks, top-k — one sequence's logits at a time (`forgetlab.analysis.textdiff` runs it)."""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Optional, Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from forgetlab.core.errors import ForgetlabError
from forgetlab.core.progress import Progress, report


from forgetlab.analysis.textdiff_inputs import Sequence_  # noqa: E402

CLASSES = ("word", "number", "punctuation", "whitespace", "special")
TOP_K = 3
VOCAB_CHUNK = 32768
BASE_COLUMNS = ["doc", "position", "token_id", "token", "token_class", "logp_base", "logp_model", "rise", "kl"]
TOP_COLUMNS = [f"{what}{k}_{side}" for side in ("base", "model") for k in range(1, TOP_K + 1)
               for what in ("top", "p")]
COLUMNS = BASE_COLUMNS + TOP_COLUMNS


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


class _Reader:
    """How one model's hidden states become logits: the decoder's final hidden states through the head (and
    the residual stream after each layer through the final norm and the head, for the logit lens)."""

    def __init__(self, model, lens: bool):
        from forgetlab.core.anatomy import Anatomy

        self.model = model
        self.head = model.get_output_embeddings()
        self.cap = getattr(model.config, "final_logit_softcapping", None)
        self.scale = getattr(model.config, "logit_scale", None)
        mods = dict(model.named_modules())
        try:
            self.anatomy = Anatomy.from_model(model)
        except ForgetlabError:
            self.anatomy = None
        self.decoder = mods.get(self.anatomy.prefix.rstrip(".")) if self.anatomy is not None else None
        self.norm = None
        if self.anatomy is not None:
            self.norm = mods.get(self.anatomy.prefix + ("norm" if self.anatomy.family == "llama" else "ln_f"))
        self.layers = [mods[self.anatomy.layer_path(i)] for i in range(self.anatomy.num_layers)] \
            if self.anatomy is not None else []
        self.lens = bool(lens and self.norm is not None and self.layers and self.head is not None)

    @property
    def plain(self) -> bool:
        return self.decoder is None or self.head is None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.head(hidden).float()
        if isinstance(self.scale, (int, float)) and self.scale not in (0, 1):
            out = out * self.scale
        if self.cap:
            out = torch.tanh(out / self.cap) * self.cap
        return out

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor):
        """(final hidden states or, without a decoder/head, the logits; the residual stream per depth or None)."""
        if self.plain:
            return self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float(), None
        from forgetlab.core.submodules import first_tensor

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
class _Accum:
    rows: dict[str, list] = field(default_factory=lambda: {c: [] for c in ("doc", "position", "token_id")})
    scores: dict[str, list] = field(default_factory=dict)
    lens_base: Optional[torch.Tensor] = None
    lens_model: Optional[torch.Tensor] = None
    lens_tokens: int = 0

    def add(self, name: str, t: torch.Tensor) -> None:
        self.scores.setdefault(name, []).append(t.detach().cpu())


@torch.no_grad()
def _score(readers: tuple[_Reader, _Reader], seqs: Sequence[Sequence_], batch_size: int, pad_id: int,
           chunk: int, progress: Progress, lens_blocks: Optional[int] = None) -> _Accum:
    """Forward both models over the sequences in batches (sorted by length, as the scorecard batches them) and
    score every position of each sequence; positions of a sequence come out in order, sequences in input order.
    The logit lens reads the first `lens_blocks` sequences (all when None)."""
    from forgetlab.core.data import EncodedExample, collate

    acc = _Accum()
    per: list[Optional[dict]] = [None] * len(seqs)
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
            res: dict[str, torch.Tensor] = {}
            if n >= 2:
                dev = outs[0][0].device
                targets = torch.tensor(seqs[i].ids[1:], device=dev)
                logits = [r.logits(o[0][row, :n - 1]) if not r.plain else o[0][row, :n - 1]
                          for r, o in zip(readers, outs)]
                res = token_scores(logits[0], logits[1].to(dev), targets, chunk)
                del logits
                if lens and (lens_blocks is None or i < lens_blocks):
                    for d in range(n_depth):
                        for r, o, tot in zip(readers, outs, (acc.lens_base, acc.lens_model)):
                            h = o[1][d][row, :n - 1]
                            lg = r.logits(r.norm(h)) if d < n_depth - 1 else r.logits(o[0][row, :n - 1])
                            tot[d] += float(F.cross_entropy(lg, targets.to(lg.device), reduction="sum"))
                    acc.lens_tokens += n - 1
            per[i] = {k: v.cpu() for k, v in res.items()}
        done += len(idx)
        report(progress, done / len(seqs), f"{done}/{len(seqs)} sequences")
        del outs
    for d, seq in enumerate(seqs):
        n = len(seq.ids)
        acc.rows["doc"] += [d] * n
        acc.rows["position"] += list(range(n))
        acc.rows["token_id"] += list(seq.ids)
        res = per[d] or {}
        for name in ("logp_base", "logp_model", "kl"):
            first = torch.full((1,), float("nan"))
            acc.add(name, torch.cat([first, res[name]]) if res else first.expand(n).clone())
        for side in ("base", "model"):
            ids = res.get(f"top_{side}", torch.empty(0, TOP_K, dtype=torch.long))
            ps = res.get(f"p_{side}", torch.empty(0, TOP_K))
            acc.add(f"top_{side}", torch.cat([torch.full((1, ids.shape[1] or TOP_K), -1, dtype=torch.long), ids]))
            acc.add(f"p_{side}", torch.cat([torch.full((1, ps.shape[1] or TOP_K), float("nan")), ps]))
    return acc


def _frame(acc: _Accum, tokenizer) -> pd.DataFrame:
    """The token table (COLUMNS) from the scores, with every id decoded once (`shown`)."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    cat = {k: torch.cat(v) for k, v in acc.scores.items()}
    every = set(acc.rows["token_id"]).union(*(cat[f"top_{side}"].flatten().tolist() for side in ("base", "model")))
    text = {i: shown(tokenizer.decode([i])) for i in every if i >= 0}
    frame = pd.DataFrame(acc.rows)
    frame["token"] = [text[i] for i in frame["token_id"]]
    frame["token_class"] = [token_class(text[i], i in special) for i in frame["token_id"]]
    frame["logp_base"] = cat["logp_base"].double().numpy()
    frame["logp_model"] = cat["logp_model"].double().numpy()
    frame["rise"] = frame["logp_base"] - frame["logp_model"]
    frame["kl"] = cat["kl"].double().numpy()
    for side in ("base", "model"):
        ids, ps = cat[f"top_{side}"], cat[f"p_{side}"].double()
        for k in range(TOP_K):
            col = ids[:, k].tolist() if ids.shape[1] > k else [-1] * len(frame)
            frame[f"top{k + 1}_{side}"] = [text.get(i, "") if i >= 0 else "" for i in col]
            frame[f"p{k + 1}_{side}"] = ps[:, k].numpy() if ps.shape[1] > k else float("nan")
    return frame[COLUMNS]


