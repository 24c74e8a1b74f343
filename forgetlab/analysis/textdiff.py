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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from forgetlab.analysis.protocol import Analysis, list_results, load_result, options, register
from forgetlab.core.errors import ParameterError, ProbeDataError, check_fraction
from forgetlab.core.progress import Progress, report, scaled
from forgetlab.analysis.textdiff_inputs import (ModelRef, Sequence_, load_scored_model, context_length,  # noqa: F401 - re-exported
                                                heldout_sequences, line_sequences, read_text_lines, resolve_model)
from forgetlab.analysis.textdiff_scoring import (BASE_COLUMNS, CLASSES, COLUMNS, TOP_COLUMNS, TOP_K,  # noqa: F401 - re-exported
                                                 VOCAB_CHUNK, token_table, LogitReader, score_sequences, shown, token_class,
                                                 token_scores)

KIND = "textdiff"
TABLE_FILE = "results.csv"      # a saved text diff's token table (forgetlab.core.workspace.save_run's frame)
SPLITS = ("heldout",)
CONTEXT = 8
LENS_BLOCKS = 64        # sequences the logit lens reads by default (it costs a head pass per layer and model)
MEASURES = ("rise", "kl")


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

    def scored(self, columns: Optional[Sequence[str]] = None) -> pd.DataFrame:
        """The rows that predict a token (position ≥ 1); only `columns` when given (a summary of a long text then
        copies the columns it reads, not the whole table)."""
        mask = self.tokens["position"] > 0
        return self.tokens[mask] if columns is None else self.tokens.loc[mask, list(columns)]

    def summary(self) -> dict[str, float]:
        """Scored tokens, the mean loss of each model on them, the mean rise (= the loss difference) and KL."""
        s = self.scored(["logp_base", "logp_model", "rise", "kl"])
        return {"tokens": int(len(s)), "loss_base": float(-s["logp_base"].mean()),
                "loss_model": float(-s["logp_model"].mean()), "mean_rise": float(s["rise"].mean()),
                "mean_kl": float(s["kl"].mean())}

    def by_class(self) -> pd.DataFrame:
        """Per token class (CLASSES order): scored tokens, their share, mean and total rise, share of the total
        rise, mean KL."""
        s = self.scored(["token_class", "rise", "kl"])
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
        s = self.scored(["position", "rise", "kl"])
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
        g = self.scored(["token", "token_class", "rise", "kl"]).groupby(["token", "token_class"])
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
        top = self.tokens.loc[self.scored([by])[by].nlargest(n).index]
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

    def to_dict(self, tokens: bool = True) -> dict:
        """JSON-ready; the token table as one compact JSON string (column → values), or with `tokens=False` the
        name of the file beside it that holds the table (`TABLE_FILE`: `save_textdiff` writes it as CSV, which
        costs a fraction of the JSON's memory on a long text)."""
        table = (json.dumps({c: self.tokens[c].tolist() for c in self.tokens.columns}, separators=(",", ":"))
                 if tokens else TABLE_FILE)
        return {"model": self.model, "against": self.against, "source": self.source, "docs": list(self.docs),
                "lens": list(self.lens), "notes": list(self.notes), "seconds": self.seconds,
                "recipe": dict(self.recipe), "summary": self.summary(), "tokens": table}

    @classmethod
    def from_dict(cls, d: dict, tokens: Optional[pd.DataFrame] = None) -> "TextDiffResult":
        """The result of `to_dict`; `tokens`: the table, where `to_dict(tokens=False)` left it out."""
        if tokens is None:
            if d["tokens"] == TABLE_FILE:
                raise ValueError(f"the token table is in {TABLE_FILE} beside the results: open it with load_textdiff")
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


def textdiff(pool, model: str, *, against: str = "base", alpha: Optional[float] = None, text=None,
             lines: Optional[Sequence[str]] = None, split: Optional[str] = None, max_general: Optional[int] = None,
             block_size: int = 128, general_mode: str = "blocks", batch_size: int = 16, device: Optional[str] = None,
             dtype=None, lens: bool = True, lens_blocks: Optional[int] = LENS_BLOCKS, vocab_chunk: int = VOCAB_CHUNK,
             home=None, progress: Progress = None) -> TextDiffResult:
    """Score every token of a text under `model` (at WiSE-FT point `alpha` when given) and `against` (see the
    module docstring). The text: the lines of the file `text`, the strings `lines`, or (the default, `split`
    "heldout") the scorecard's held-out blocks (`max_general`, `block_size`, `general_mode` as in
    `forgetlab.core.evaluate.evaluate`). The logit lens reads the first `lens_blocks` sequences (None: all of
    them; it costs one pass through the head per layer and model); `lens=False` skips it. `dtype` (None: bfloat16
    on cuda, float32 elsewhere) is the precision both models are loaded and run in; the logits are taken to
    float32 before the log-softmax, KL, top-k and the lens's losses. Its peak: `textdiff_memory`."""
    from forgetlab.core.evaluate import check_limits
    from forgetlab.core.memory import dtype_name, job_dtype, large_frees_to_os

    check_limits(max_general=max_general, block_size=block_size, batch_size=batch_size, vocab_chunk=vocab_chunk,
                 lens_blocks=lens_blocks)
    _sources(text, lines, split)
    device = device or "cpu"            # as ModelPool.load: both sides on one device
    dt = job_dtype(dtype, device)
    start = time.perf_counter()
    mref = resolve_model(pool, model, alpha=alpha, home=home)
    aref = resolve_model(pool, against, home=home, role="--against")
    tok = pool.tokenizer
    seqs, notes, source = text_sequences(pool, text=text, lines=lines, max_general=max_general,
                                         block_size=block_size, general_mode=general_mode)
    report(progress, 0.0, f"loading {mref.label} and {aref.label}")
    base_model = load_scored_model(pool, aref, device, dt)
    report(progress, 0.05, f"loaded {aref.label}")
    tuned_model = load_scored_model(pool, mref, device, dt)
    readers = (LogitReader(base_model, lens), LogitReader(tuned_model, lens))
    if lens and not all(r.lens for r in readers):
        notes.append("no logit lens: this architecture has no final norm forgetlab knows how to read the residual "
                     "stream through")
    # on the CPU, the per-sequence logits (S·V·4: megabytes each) go back to the system when freed, instead of
    # piling up as glibc heap that the next ones fragment (docs/scaling.md, the textdiff row)
    with large_frees_to_os(device):
        acc = score_sequences(readers, seqs, batch_size, tok.pad_token_id or 0, vocab_chunk, scaled(progress, 0.1, 0.97),
                     lens_blocks)
    frame = token_table(acc, tok)
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
              "batch_size": batch_size, "lens": lens, "lens_blocks": lens_blocks, "dtype": dtype_name(dt)}
    result = TextDiffResult(model=mref.label, against=aref.label, source=source, tokens=frame,
                            docs=[s.name for s in seqs], lens=lens_rows, notes=notes,
                            seconds=time.perf_counter() - start, recipe=recipe)
    s = result.summary()
    report(progress, 1.0, f"{s['tokens']} tokens: mean rise {s['mean_rise']:.4f} nats, mean KL {s['mean_kl']:.4f}")
    return result


# ------------------------------------------------------------------------------------------ save/reopen


def save_textdiff(result: TextDiffResult, home_path=None) -> Path:
    """Save under the workspace's runs/ (kind ``textdiff``: recipe.json, results.json, and the token table once, as
    results.csv: `TABLE_FILE`)."""
    from forgetlab.core.workspace import save_run

    recipe = dict(result.recipe)
    recipe.setdefault("model", result.model)
    return save_run(KIND, recipe, result.to_dict(tokens=False), frame=result.to_frame(), home_path=home_path)


def read_token_table(path) -> pd.DataFrame:
    """A token table written as CSV (`save_textdiff`, `--out`): every token string read back as written ("nan",
    "NA", "" included), empty numbers as NaN."""
    strings = ["token", "token_class"] + [c for c in TOP_COLUMNS if c.startswith("top")]
    numbers = [c for c in COLUMNS if c not in strings and c not in ("doc", "position", "token_id")]
    return pd.read_csv(path, keep_default_na=False, na_values={c: [""] for c in numbers},
                       dtype={c: str for c in strings})


def load_textdiff(path) -> TextDiffResult:
    """Reopen a text diff saved by `save_textdiff` (or by forgetlab before it saved the table only as CSV)."""
    folder = Path(path)

    class _Saved:
        @staticmethod
        def from_dict(d: dict) -> TextDiffResult:
            if d.get("tokens") != TABLE_FILE:
                return TextDiffResult.from_dict(d)
            if not (folder / TABLE_FILE).is_file():
                raise ValueError(f"its token table {TABLE_FILE} is missing")
            return TextDiffResult.from_dict(d, read_token_table(folder / TABLE_FILE))

    return load_result(path, KIND, _Saved, "a text diff")


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
    dtype: Optional[str] = None
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
           "read_text_lines", "line_sequences", "heldout_sequences", "text_sequences", "token_scores", "check",
           "textdiff", "save_textdiff", "load_textdiff", "list_textdiffs", "read_token_table"]

ANALYSIS = register(Analysis(KIND, TextDiffSettings, check_settings, run_settings, save_textdiff, load_textdiff,
                             list_textdiffs))

from forgetlab.analysis import textdiff_memory  # noqa: E402,F401  (registers the "textdiff" memory estimate)
