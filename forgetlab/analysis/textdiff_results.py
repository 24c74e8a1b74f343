"""What a text diff holds (`forgetlab.analysis.textdiff`, docs/textdiff.md): the token table — every token of a
text scored under a model and a reference — with its summaries (per token class, along the sequences, the tokens
and contexts with the largest rise or KL) and the logit lens. Plots and the Runs page read it without importing
the analysis; a saved run keeps the table beside its results (`TABLE_FILE`, `read_token_table`)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from forgetlab.core.errors import ParameterError
from forgetlab.core.workspace import SavedRun

CLASSES = ("word", "number", "punctuation", "whitespace", "special")
TOP_K = 3
BASE_COLUMNS = ["doc", "position", "token_id", "token", "token_class", "logp_base", "logp_model", "rise", "kl"]
TOP_COLUMNS = [f"{what}{k}_{side}" for side in ("base", "model") for k in range(1, TOP_K + 1)
               for what in ("top", "p")]
COLUMNS = BASE_COLUMNS + TOP_COLUMNS
KIND = "textdiff"
TABLE_FILE = "results.csv"      # a saved text diff's token table (forgetlab.core.workspace.save_run's frame)
CONTEXT = 8
MEASURES = ("rise", "kl")


def check_measure(by: str) -> str:
    """`by` if it is a measure the summaries rank by (rise or kl), else a ParameterError."""
    if by not in MEASURES:
        raise ParameterError(f"Unknown measure {by!r}; choose rise or kl.")
    return by


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
        by = check_measure(by)
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
        by = check_measure(by)
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
        name of the file beside it that holds the table (`TABLE_FILE`: a saved run keeps it there as CSV, which
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
                raise ValueError(f"the token table is in {TABLE_FILE} beside the results: open the run with "
                                 "the textdiff analysis' load")
            tokens = pd.DataFrame(json.loads(d["tokens"]) if isinstance(d["tokens"], str) else d["tokens"])
        return cls(d["model"], d["against"], d["source"], tokens[COLUMNS], list(d["docs"]), list(d.get("lens", [])),
                   list(d.get("notes", [])), float(d.get("seconds", 0.0)), dict(d.get("recipe", {})))


def read_token_table(path) -> pd.DataFrame:
    """A token table written as CSV (a saved run's `TABLE_FILE`, `--out`): every token string read back as
    written ("nan", "NA", "" included), empty numbers as NaN."""
    strings = ["token", "token_class"] + [c for c in TOP_COLUMNS if c.startswith("top")]
    numbers = [c for c in COLUMNS if c not in strings and c not in ("doc", "position", "token_id")]
    return pd.read_csv(path, keep_default_na=False, na_values={c: [""] for c in numbers},
                       dtype={c: str for c in strings})


def saved_results(result: TextDiffResult) -> dict:
    """What a saved text diff keeps in results.json: everything but the token table, which is saved once, as
    results.csv (`TABLE_FILE`)."""
    return result.to_dict(tokens=False)


def from_saved(run: SavedRun) -> TextDiffResult:
    """The text diff of a saved run: its results with the token table read from `TABLE_FILE` beside them (or
    from results.json itself, as forgetlab saved it before it saved the table only as CSV)."""
    d = run.results
    if d.get("tokens") != TABLE_FILE:
        return TextDiffResult.from_dict(d)
    table = Path(run.path) / TABLE_FILE
    if not table.is_file():
        raise ValueError(f"its token table {TABLE_FILE} is missing")
    return TextDiffResult.from_dict(d, read_token_table(table))


def source_words(result: TextDiffResult) -> str:
    """The text a diff scored, in words: "the held-out text" or its file / typed lines."""
    return "the held-out text" if result.source == "heldout" else result.source


def takeaway(result: TextDiffResult) -> list[str]:
    """The diff in two sentences: the mean rise per token (nats: the model's loss minus the reference's), then
    the token class with the largest mean rise (nats per token, with its share of the total rise where the total
    is a loss) and the token string that lost most in all (`top_tokens`: seen at least twice)."""
    s = result.summary()
    if not s["tokens"]:
        return []
    against = "the base" if result.against == "base" else result.against
    first = (f"Against {against}, {result.model}'s loss on the {s['tokens']:,} tokens of "
             f"{source_words(result)} rises by {s['mean_rise']:+.4f} nats per token on average.")
    classes = result.by_class()
    classes = classes[classes["tokens"] > 0]
    top = classes.loc[classes["mean_rise"].idxmax()]
    share = float(top["share_of_rise"])
    second = (f"{str(top['token_class']).capitalize()} tokens rise most: {float(top['mean_rise']):+.3f} nats each "
              "on average" + (f" ({100 * share:.0f} % of the total rise)" if s["mean_rise"] > 0 and share == share
                              else ""))
    tokens = result.top_tokens("rise", 1)
    if len(tokens) and float(tokens["total_rise"].iloc[0]) > 0:
        t = tokens.iloc[0]
        second += (f"; the token {str(t['token'])!r} loses most in all, {float(t['total_rise']):+.3f} nats over "
                   f"{int(t['count'])} occurrences")
    return [first, second + "."]
