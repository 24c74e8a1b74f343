"""General text for the demo zoo: English Wikipedia prose from the sample that `gensim` ships.

The sample is `enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2` in gensim's test data.
Articles (namespace 0, redirects dropped) are cleaned to prose — templates, tables, references, links,
headings, lists and emphasis marks removed — and split into paragraphs. Articles, not paragraphs, are split
between train and held-out, so no held-out article was seen in pretraining. Everything is deterministic: the
split is a seeded permutation of the article titles sorted by name.
"""
from __future__ import annotations

import bz2
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from forgetlab.core.errors import MissingDependencyError, ProbeDataError

WIKI_SAMPLE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
GENSIM_PIP = "pip install gensim"


@dataclass
class Article:
    """One cleaned article: its title and prose paragraphs."""

    title: str
    paragraphs: list[str]

    @property
    def chars(self) -> int:
        return sum(len(p) for p in self.paragraphs)


@dataclass
class WikiSplit:
    """Wikipedia paragraphs split by article into a pretraining part and a held-out part."""

    train: list[str]
    heldout: list[str]
    train_titles: list[str] = field(default_factory=list)
    heldout_titles: list[str] = field(default_factory=list)

    def to_frame(self) -> pd.DataFrame:
        """One row per part: articles, paragraphs, characters."""
        return pd.DataFrame([
            {"part": "train", "articles": len(self.train_titles), "paragraphs": len(self.train),
             "chars": sum(map(len, self.train))},
            {"part": "heldout", "articles": len(self.heldout_titles), "paragraphs": len(self.heldout),
             "chars": sum(map(len, self.heldout))},
        ])


def wiki_sample_path() -> Path:
    """Path of the Wikipedia sample inside the installed gensim package (raises if gensim is missing)."""
    try:
        from gensim.test.utils import datapath
    except ImportError:
        raise MissingDependencyError(
            f"The demo zoo needs the Wikipedia sample shipped with gensim, which is not installed. "
            f"Install it with `{GENSIM_PIP}` and build again."
        ) from None
    path = Path(datapath(WIKI_SAMPLE))
    if not path.is_file():
        raise MissingDependencyError(
            f"gensim is installed but its Wikipedia sample {WIKI_SAMPLE} is missing ({path}). "
            f"Reinstall it with `{GENSIM_PIP} --force-reinstall`."
        )
    return path


_EMPTY_PARENS = re.compile(r"\(\s*[,;:]?\s*(?:[,;:]\s*)*\)")
_LEAD_PUNCT_IN_PARENS = re.compile(r"\(\s*[,;:]\s*")
_MULTISPACE = re.compile(r"[ \t\u00a0]+")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?)])")
_HEADING = re.compile(r"^\s*=+.*=+\s*$")
_MARKUP_LEFT = re.compile(r"[\[\]{}|<>]|&[a-z]+;|https?://|\bthumb\b|\bpx\b|\bCategory:|\bFile:|\bImage:")


def clean_paragraphs(filtered: str, min_chars: int = 80) -> list[str]:
    """Turn gensim-filtered wiki text into prose paragraphs.

    Drops headings, list/table/indented lines, lines with leftover markup, and lines shorter than
    `min_chars`; removes bold/italic quote marks and the empty parentheses that removed templates leave.
    """
    out: list[str] = []
    for raw in filtered.split("\n"):
        line = raw.strip()
        if not line or _HEADING.match(line) or line[0] in "*#:;|!{}=<":
            continue
        line = line.replace("'''", "").replace("''", "")
        line = _LEAD_PUNCT_IN_PARENS.sub("(", line)
        line = _EMPTY_PARENS.sub("", line)
        line = _MULTISPACE.sub(" ", line)
        line = _SPACE_BEFORE_PUNCT.sub(r"\1", line).strip()
        if len(line) < min_chars or _MARKUP_LEFT.search(line):
            continue
        if not line[-1] in ".!?\"')":
            continue  # captions, fragments and cut-off lines
        out.append(line)
    return out


@dataclass
class RawArticle:
    """One article as stored in the dump: its title and wiki markup."""

    title: str
    markup: str

    def clean(self) -> Article:
        """The article's prose paragraphs (gensim's `filter_wiki`, then `clean_paragraphs`)."""
        from gensim.corpora.wikicorpus import filter_wiki

        return Article(self.title, clean_paragraphs(filter_wiki(self.markup)))


def read_raw_articles(path: Path | None = None) -> list[RawArticle]:
    """Every main-namespace article of the Wikipedia sample, redirects dropped, sorted by title."""
    try:
        from gensim.corpora.wikicorpus import extract_pages
    except ImportError:
        raise MissingDependencyError(
            f"Reading the Wikipedia sample needs gensim. Install it with `{GENSIM_PIP}`."
        ) from None
    path = path or wiki_sample_path()
    out: list[RawArticle] = []
    with bz2.open(path, "rb") as fh:
        for title, text, _pageid in extract_pages(fh, filter_namespaces=("0",)):
            if text.lstrip().upper().startswith("#REDIRECT"):
                continue
            out.append(RawArticle(title, text))
    if len(out) < 2:
        raise ProbeDataError(f"Fewer than two articles found in {path}; the file may be damaged.")
    return sorted(out, key=lambda a: a.title)


def read_articles(path: Path | None = None) -> list[Article]:
    """All articles of the Wikipedia sample cleaned to prose (those with no prose dropped), sorted by title."""
    arts = [raw.clean() for raw in read_raw_articles(path)]
    return [a for a in arts if a.paragraphs]


def split_articles(articles: list[RawArticle], *, heldout_fraction: float = 0.1, seed: int = 0,
                   max_train_chars: int | None = None, max_heldout_chars: int | None = None) -> WikiSplit:
    """Split articles (not paragraphs) into train and held-out parts with a seeded permutation.

    The titles, sorted, are shuffled by `random.Random(seed)`; the held-out part takes articles from the front
    until it holds at least `heldout_fraction` of all markup characters (at least one article, never all);
    the rest are train. Each part is then cleaned to prose in permutation order; the optional character caps
    stop a part once it holds that many characters (whole paragraphs), so a smaller build uses a prefix of
    the same data and cleans only what it needs.
    """
    if len(articles) < 2:
        raise ProbeDataError("Need at least two articles to split Wikipedia into train and held-out parts.")
    if not (0.0 < heldout_fraction < 1.0):
        raise ProbeDataError(f"heldout_fraction must lie in (0, 1); got {heldout_fraction}.")
    order = sorted(articles, key=lambda a: a.title)
    random.Random(seed).shuffle(order)
    total = sum(len(a.markup) for a in order)
    held: list[RawArticle] = []
    held_chars = 0
    while len(order) > 1 and (not held or held_chars < heldout_fraction * total):
        a = order.pop(0)
        held.append(a)
        held_chars += len(a.markup)

    def prose(parts: list[RawArticle], cap: int | None) -> tuple[list[str], list[str]]:
        paras: list[str] = []
        titles: list[str] = []
        n = 0
        for raw in parts:
            if cap is not None and n >= cap:
                break
            art = raw.clean()
            if not art.paragraphs:
                continue
            titles.append(art.title)
            for p in art.paragraphs:
                if cap is not None and n >= cap:
                    break
                paras.append(p)
                n += len(p)
        return paras, titles

    train, train_titles = prose(order, max_train_chars)
    heldout, heldout_titles = prose(held, max_heldout_chars)
    if not train or not heldout:
        raise ProbeDataError("The Wikipedia sample gave no prose for one of the parts; the file may be damaged.")
    return WikiSplit(train=train, heldout=heldout, train_titles=train_titles, heldout_titles=heldout_titles)


def load_wiki_split(*, heldout_fraction: float = 0.1, seed: int = 0, max_train_chars: int | None = None,
                    max_heldout_chars: int | None = None) -> WikiSplit:
    """Read and split the gensim Wikipedia sample, cleaning only what the caps need (see `split_articles`)."""
    return split_articles(read_raw_articles(), heldout_fraction=heldout_fraction, seed=seed,
                          max_train_chars=max_train_chars, max_heldout_chars=max_heldout_chars)
