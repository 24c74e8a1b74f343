"""Where forgetting shows in text: every token scored under two models (docs/textdiff.md).

For a model θ (a fine-tune, a WiSE-FT point θ0 + α(θ1 − θ0), a merge, any compatible folder) and a reference
(`against`, the base by default), every token of a text is scored under both. The text is either each line of
a file, tokenized as the tokenizer does by default (`tokenizer(line)["input_ids"]`), or the held-out general
text cut into exactly the blocks the scorecard's general loss scores (`forgetlab.core.evaluate.general_loss`),
so that the mean rise over them is the scorecard's general-loss rise. Row i of a sequence predicts token i
from tokens 0…i−1 (row 0 predicts nothing: its scores are empty). Per row:

- logp_base, logp_model: log p(token | prefix) under the reference and the model (natural log, nats);
- rise = logp_base − logp_model: nats the model lost on that token (positive: forgotten);
- kl = KL(p_base ‖ p_model) = Σ_v p_base(v)·(log p_base(v) − log p_model(v)) over the whole vocabulary;
- the top-3 next-token predictions of each model with their probabilities.

Summaries (`TextDiffResult`): the tokens and contexts (the 8 tokens up to and including the token) with the
largest rise and KL, the rise per token class (`token_class`), the rise along the sequence, and a logit lens:
the next-token loss when the residual stream after each layer is read through the final norm and the head, for
both models (layer 0: the embeddings; the last layer gives the models' own loss), read on the first `lens_blocks`
sequences (64 by default: the lens costs a pass through the head per layer and model).

Cost: one forward pass per model per batch of sequences, on the job's device. The logits of one sequence at a
time are formed from the final hidden states and the log-softmax, KL and top-k are computed over the vocabulary
in chunks (`VOCAB_CHUNK` columns), so the memory beyond the forward pass is one sequence's logits per model.
"""
from __future__ import annotations

import json
import math
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from forgetlab.analysis.protocol import Analysis, list_results, load_result, options, register
from forgetlab.core.errors import CheckpointError, ForgetlabError, ParameterError, ProbeDataError, check_fraction
from forgetlab.core.progress import Progress, report, scaled

KIND = "textdiff"
CLASSES = ("word", "number", "punctuation", "whitespace", "special")
SPLITS = ("heldout",)
TOP_K = 3
CONTEXT = 8
VOCAB_CHUNK = 32768
LENS_BLOCKS = 64        # sequences the logit lens reads by default (it costs a head pass per layer and model)
MEASURES = ("rise", "kl")
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
    from forgetlab.core.checkpoints import open_checkpoint
    from forgetlab.core.checkpoints.lora import _read_adapter_config
    from forgetlab.core.pool import check_compatible

    adapter = (path / "adapter_config.json").is_file()
    try:
        ckpt = open_checkpoint(str(path))
    except CheckpointError as exc:
        if not adapter:
            raise
        base = _read_adapter_config(path).get("base_model_name_or_path")
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
    from forgetlab.core.pool import BASE
    from forgetlab.core.workspace import merges_dir

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


def _load(pool, mref: ModelRef, device: Optional[str]):
    """The model for forward passes: the pool's cached model, a fresh working copy at the WiSE-FT point (built
    by the registry's wise_ft through forgetlab.merge.working_copy, as the sweeps build theirs), or the folder."""
    if mref.kind == "pool":
        return pool.load(mref.ref, device=device)
    if mref.kind == "sweep":
        from forgetlab.merge.working_copy import WorkingCopy

        work = WorkingCopy.load(pool, mref.ref, device=device)
        work.lerp(work.tuned, mref.alpha)
        return work.model.eval()
    from forgetlab.core.checkpoints import load_model

    return load_model(mref.path, device=device)


# ------------------------------------------------------------------------------------------------ texts


@dataclass
class Sequence_:
    """One scored sequence: its token ids and a name (``line 3``, ``line 3, piece 2/3``, ``block 0``)."""

    ids: list[int]
    name: str


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
            seqs.append(Sequence_(ids, f"line {i}"))
            continue
        pieces = [ids[s:s + context] for s in range(0, len(ids), context)]
        notes.append(f"line {i} has {len(ids)} tokens, more than the model's context of {context}: split into "
                     f"{len(pieces)} pieces, each scored from its own start (the first tokens of pieces 2… are "
                     "predicted without the text before them)")
        seqs += [Sequence_(p, f"line {i}, piece {k}/{len(pieces)}") for k, p in enumerate(pieces, 1)]
    if not seqs:
        raise ProbeDataError("The text has no token to score: every line tokenized to nothing.")
    return seqs, notes


def heldout_sequences(pool, *, max_general: Optional[int] = None, block_size: int = 128,
                      general_mode: str = "blocks") -> list[Sequence_]:
    """The blocks the scorecard's general loss scores (`forgetlab.core.evaluate.general_loss` with the same
    block size, limit and mode)."""
    from forgetlab.core.data import encode_documents, encode_text
    from forgetlab.core.evaluate import GENERAL_LOSS_MODES

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


# ------------------------------------------------------------------------------------------ the result


@dataclass
class TextDiffResult:
    """Every token of a text scored under a model and a reference (see the module docstring).

    `tokens`: the token table (COLUMNS, one row per token, row 0 of each sequence unscored); `docs`: a name per
    sequence; `lens`: per depth (0 = embeddings … L = after the last layer) the mean next-token loss of both
    models, or empty when the architecture gives no final norm to read the residual through."""

    model: str
    against: str
    source: str
    tokens: pd.DataFrame
    docs: list[str]
    lens: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    recipe: dict = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        """The token table: doc, position, token_id, token, token_class, logp_base, logp_model, rise, kl and each
        model's top-3 predictions (top1_base, p1_base, …, top3_model, p3_model)."""
        return self.tokens

    def scored(self) -> pd.DataFrame:
        """The rows that predict a token (position ≥ 1)."""
        return self.tokens[self.tokens["position"] > 0]

    def summary(self) -> dict[str, float]:
        """Scored tokens, the mean loss of each model on them, the mean rise (= the loss difference) and KL."""
        s = self.scored()
        return {"tokens": int(len(s)), "loss_base": float(-s["logp_base"].mean()),
                "loss_model": float(-s["logp_model"].mean()), "mean_rise": float(s["rise"].mean()),
                "mean_kl": float(s["kl"].mean())}

    def by_class(self) -> pd.DataFrame:
        """Per token class (CLASSES order): scored tokens, their share, mean and total rise, share of the total
        rise, mean KL."""
        s = self.scored()
        total = float(s["rise"].sum())
        rows = []
        for c in CLASSES:
            part = s[s["token_class"] == c]
            rows.append({"token_class": c, "tokens": int(len(part)), "share_of_tokens": len(part) / max(1, len(s)),
                         "mean_rise": float(part["rise"].mean()) if len(part) else float("nan"),
                         "total_rise": float(part["rise"].sum()),
                         "share_of_rise": float(part["rise"].sum()) / total if total else float("nan"),
                         "mean_kl": float(part["kl"].mean()) if len(part) else float("nan")})
        return pd.DataFrame(rows)

    def by_position(self, bins: int = 16) -> pd.DataFrame:
        """Mean rise and KL along the sequences: positions grouped into `bins` equal ranges."""
        s = self.scored()
        if s.empty:
            return pd.DataFrame(columns=["position_from", "position_to", "tokens", "mean_rise", "mean_kl"])
        width = max(1, math.ceil((int(s["position"].max()) + 1) / bins))
        g = s.groupby(s["position"] // width)
        out = pd.DataFrame({"position_from": g["position"].min(), "position_to": g["position"].max(),
                            "tokens": g.size(), "mean_rise": g["rise"].mean(), "mean_kl": g["kl"].mean()})
        return out.reset_index(drop=True)

    def top_tokens(self, by: str = "rise", n: int = 20, min_count: int = 2) -> pd.DataFrame:
        """The token strings with the largest total `by` (rise or kl) over their occurrences (seen at least
        `min_count` times): count, mean and total rise, mean KL."""
        by = _check_measure(by)
        g = self.scored().groupby(["token", "token_class"])
        out = pd.DataFrame({"count": g.size(), "mean_rise": g["rise"].mean(), "total_rise": g["rise"].sum(),
                            "mean_kl": g["kl"].mean(), "total_kl": g["kl"].sum()}).reset_index()
        out = out[out["count"] >= min_count]
        return out.sort_values(f"total_{by}", ascending=False).head(n).reset_index(drop=True)

    def context_of(self, doc: int, position: int) -> str:
        """The CONTEXT tokens up to and including `position` of sequence `doc`, the token itself in [brackets]."""
        seq = self.tokens[self.tokens["doc"] == doc]
        toks = list(seq["token"][(seq["position"] > position - CONTEXT) & (seq["position"] <= position)])
        return "".join(toks[:-1]) + f"[{toks[-1]}]" if toks else ""

    def top_contexts(self, by: str = "rise", n: int = 20) -> pd.DataFrame:
        """The `n` positions with the largest `by` (rise or kl), each with its context (`context_of`), both
        models' first prediction and where it is."""
        by = _check_measure(by)
        top = self.scored().nlargest(n, by)
        return pd.DataFrame({
            "doc": top["doc"].values, "where": [self.docs[d] for d in top["doc"]], "position": top["position"].values,
            "context": [self.context_of(int(d), int(p)) for d, p in zip(top["doc"], top["position"])],
            "token": top["token"].values, "token_class": top["token_class"].values, "rise": top["rise"].values,
            "kl": top["kl"].values, "top1_base": top["top1_base"].values, "top1_model": top["top1_model"].values})

    def lens_frame(self) -> pd.DataFrame:
        """The logit lens: per depth (0 = embeddings, i = after layer i) the mean next-token loss of the
        reference and of the model read through the final norm and head, its rise (model − reference), and the
        number of tokens it was read on (the first `lens_blocks` sequences)."""
        cols = ["depth", "loss_base", "loss_model", "rise", "tokens"]
        return pd.DataFrame(self.lens, columns=cols) if self.lens else pd.DataFrame(columns=cols)

    def to_dict(self) -> dict:
        """JSON-ready; the token table as one compact JSON string (column → values)."""
        table = json.dumps({c: self.tokens[c].tolist() for c in self.tokens.columns}, separators=(",", ":"))
        return {"model": self.model, "against": self.against, "source": self.source, "docs": list(self.docs),
                "lens": list(self.lens), "notes": list(self.notes), "seconds": self.seconds,
                "recipe": dict(self.recipe), "summary": self.summary(), "tokens": table}

    @classmethod
    def from_dict(cls, d: dict) -> "TextDiffResult":
        tokens = pd.DataFrame(json.loads(d["tokens"]) if isinstance(d["tokens"], str) else d["tokens"])
        return cls(d["model"], d["against"], d["source"], tokens[COLUMNS], list(d["docs"]), list(d.get("lens", [])),
                   list(d.get("notes", [])), float(d.get("seconds", 0.0)), dict(d.get("recipe", {})))


def _check_measure(by: str) -> str:
    if by not in MEASURES:
        raise ParameterError(f"Unknown measure {by!r}; choose rise or kl.")
    return by


# ------------------------------------------------------------------------------------------ the analysis


def _sources(text, lines, split) -> None:
    given = [x for x in (text, lines, split) if x is not None]
    if len(given) > 1:
        raise ParameterError("Give one text to score: a text file (--text), lines, or --split heldout, not several.")
    if split is not None and split not in SPLITS:
        raise ParameterError(f"Unknown split {split!r}; the split textdiff scores is: {', '.join(SPLITS)}.")


def check(pool, model: str, *, against: str = "base", alpha: Optional[float] = None, text=None,
          lines: Optional[Sequence[str]] = None, split: Optional[str] = None, max_general: Optional[int] = None,
          block_size: int = 128, general_mode: str = "blocks", batch_size: int = 16, home=None) -> None:
    """Every setting checked, nothing loaded: both models exist and fit the pool's base, α ∈ [0, 1], one text
    source, a readable non-empty text, held-out text in the pool when it is the source, sane counts."""
    from forgetlab.core.evaluate import check_limits

    check_limits(max_general=max_general, block_size=block_size, batch_size=batch_size)
    _sources(text, lines, split)
    resolve_model(pool, model, alpha=alpha, home=home)
    resolve_model(pool, against, home=home, role="--against")
    if text is not None:
        read_text_lines(text)
    elif lines is not None:
        if not any(str(line).strip() for line in lines):
            raise ProbeDataError("The text is empty: type or paste at least one line to score.")
    else:
        heldout_sequences(pool, max_general=1, block_size=block_size, general_mode=general_mode)


def textdiff(pool, model: str, *, against: str = "base", alpha: Optional[float] = None, text=None,
             lines: Optional[Sequence[str]] = None, split: Optional[str] = None, max_general: Optional[int] = None,
             block_size: int = 128, general_mode: str = "blocks", batch_size: int = 16, device: Optional[str] = None,
             lens: bool = True, lens_blocks: Optional[int] = LENS_BLOCKS, vocab_chunk: int = VOCAB_CHUNK, home=None,
             progress: Progress = None) -> TextDiffResult:
    """Score every token of a text under `model` (at WiSE-FT point `alpha` when given) and `against` (see the
    module docstring). The text: the lines of the file `text`, the strings `lines`, or (the default, `split`
    "heldout") the scorecard's held-out blocks (`max_general`, `block_size`, `general_mode` as in
    `forgetlab.core.evaluate.evaluate`). The logit lens reads the first `lens_blocks` sequences (None: all of
    them; it costs one pass through the head per layer and model); `lens=False` skips it."""
    from forgetlab.core.evaluate import check_limits

    check_limits(max_general=max_general, block_size=block_size, batch_size=batch_size, vocab_chunk=vocab_chunk,
                 lens_blocks=lens_blocks)
    _sources(text, lines, split)
    device = device or "cpu"            # as ModelPool.load: both sides on one device
    start = time.perf_counter()
    mref = resolve_model(pool, model, alpha=alpha, home=home)
    aref = resolve_model(pool, against, home=home, role="--against")
    tok = pool.tokenizer
    notes: list[str] = []
    if text is not None or lines is not None:
        raw = read_text_lines(text) if text is not None else [str(x) for x in lines if str(x).strip()]
        if not raw:
            raise ProbeDataError("The text is empty: type or paste at least one line to score.")
        seqs, notes = line_sequences(tok, raw, context_length(pool.config))
        source = str(Path(text).expanduser().resolve()) if text is not None else "typed text"
    else:
        seqs = heldout_sequences(pool, max_general=max_general, block_size=block_size, general_mode=general_mode)
        source = "heldout"
    report(progress, 0.0, f"loading {mref.label} and {aref.label}")
    base_model = _load(pool, aref, device)
    report(progress, 0.05, f"loaded {aref.label}")
    tuned_model = _load(pool, mref, device)
    readers = (_Reader(base_model, lens), _Reader(tuned_model, lens))
    if lens and not all(r.lens for r in readers):
        notes.append("no logit lens: this architecture has no final norm forgetlab knows how to read the residual "
                     "stream through")
    acc = _score(readers, seqs, batch_size, tok.pad_token_id or 0, vocab_chunk, scaled(progress, 0.1, 0.97),
                 lens_blocks)
    frame = _frame(acc, tok)
    lens_rows = []
    if acc.lens_base is not None and acc.lens_tokens:
        for d in range(len(acc.lens_base)):
            lb, lm = float(acc.lens_base[d]) / acc.lens_tokens, float(acc.lens_model[d]) / acc.lens_tokens
            lens_rows.append({"depth": d, "loss_base": lb, "loss_model": lm, "rise": lm - lb,
                              "tokens": acc.lens_tokens})
    from forgetlab.analysis.protocol import pool_source

    recipe = {"analysis": KIND, "pool": pool_source(pool), "pool_name": getattr(pool, "name", None), "model": model,
              "against": against, "alpha": mref.alpha, "model_label": mref.label, "source": source,
              "max_general": max_general, "block_size": block_size, "general_mode": general_mode,
              "batch_size": batch_size, "lens": lens, "lens_blocks": lens_blocks}
    result = TextDiffResult(model=mref.label, against=aref.label, source=source, tokens=frame,
                            docs=[s.name for s in seqs], lens=lens_rows, notes=notes,
                            seconds=time.perf_counter() - start, recipe=recipe)
    s = result.summary()
    report(progress, 1.0, f"{s['tokens']} tokens: mean rise {s['mean_rise']:.4f} nats, mean KL {s['mean_kl']:.4f}")
    return result


# ------------------------------------------------------------------------------------------ save/reopen


def save_textdiff(result: TextDiffResult, home_path=None) -> Path:
    """Save under the workspace's runs/ (kind ``textdiff``: recipe.json, results.json, results.csv = tokens)."""
    from forgetlab.core.workspace import save_run

    recipe = dict(result.recipe)
    recipe.setdefault("model", result.model)
    return save_run(KIND, recipe, result.to_dict(), frame=result.to_frame(), home_path=home_path)


def load_textdiff(path) -> TextDiffResult:
    """Reopen a text diff saved by `save_textdiff`."""
    return load_result(path, KIND, TextDiffResult, "a text diff")


def list_textdiffs(home_path=None, model: Optional[str] = None) -> list:
    """Saved text diffs (`forgetlab.core.workspace.SavedRun`s, newest first), optionally of one model."""
    return list_results(home_path, KIND, model=model)


@dataclass
class TextDiffSettings:
    """What a text diff scores: `model` (at WiSE-FT `alpha`) against `against`, on a text file, typed lines or
    the held-out split."""

    model: str = ""
    against: Optional[str] = None
    alpha: Optional[float] = None
    text: Optional[str] = None
    lines: Optional[Sequence[str]] = None
    split: Optional[str] = None
    max_general: Optional[int] = None
    block_size: Optional[int] = None
    general_mode: Optional[str] = None
    batch_size: Optional[int] = None
    device: Optional[str] = None
    lens: Optional[bool] = None
    lens_blocks: Optional[int] = None


def check_settings(settings: TextDiffSettings, pool=None) -> None:
    """Refuse bad settings (with the pool: every check of `check`) without loading a model."""
    _sources(settings.text, settings.lines, settings.split)
    if settings.alpha is not None:
        check_fraction("alpha", settings.alpha)
    if pool is not None:
        opts = options(settings, {"against", "alpha", "text", "lines", "split", "max_general", "block_size",
                                  "general_mode", "batch_size"})
        check(pool, settings.model, **opts)


def run_settings(pool, settings: TextDiffSettings, progress: Progress = None, executor=None) -> TextDiffResult:
    """`textdiff` with these settings (in this process: `executor` is not used)."""
    opts = options(settings)
    return textdiff(pool, opts.pop("model"), progress=progress, **opts)


__all__ = ["CLASSES", "COLUMNS", "ModelRef", "TextDiffResult", "TextDiffSettings", "token_class", "resolve_model",
           "read_text_lines", "line_sequences", "heldout_sequences", "token_scores", "check", "textdiff",
           "save_textdiff", "load_textdiff", "list_textdiffs"]

ANALYSIS = register(Analysis(KIND, TextDiffSettings, check_settings, run_settings, save_textdiff, load_textdiff,
                             list_textdiffs))
