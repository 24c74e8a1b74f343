"""The app's words, explained once: one line per term, used by the ⓘ tooltips and captions of every page
(`explain`) and by the Glossary page (pages/glossary.py, `glossary_rows`).

Where each entry comes from — one home each:
- the words no registry declares: hand-written in forgetlab/ui/glossary_terms.py (`SECTIONS`);
- every merge method: its own declaration in the METHODS registry (`MethodSpec.display_name` and `.paper`, and
  `method_summary`: its one-line description; its docs/methods.md anchor is its registry name);
- every merge parameter the Merge page shows that no hand-written entry covers: its declared help;
- every analysis, every sweep kind included: its declaration in ANALYSES (title and one-line help).

The formulas live in docs/methods.md. The app runs offline and serves no repository files, so a formula link
opens the Glossary page itself with `?formula=<anchor>`, which renders that section of docs/methods.md
(`doc_section`); the same anchor works on GitHub as docs/methods.md#<anchor>.
"""
from __future__ import annotations

import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Optional

from forgetlab.analysis.base import ANALYSES
from forgetlab.merge import METHODS
from forgetlab.ui.glossary_terms import ANALYSIS_ANCHORS, GROUPS, SECTIONS, Term

__all__ = ["GROUPS", "TERMS", "Term", "all_terms", "doc_anchors", "doc_section", "doc_source", "explain",
           "explain_group", "find", "formula_link", "glossary_rows", "method_summary", "phrases", "term"]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "methods.md"
METHOD_SECTION, PARAMETER_SECTION, ANALYSIS_SECTION = "Merge methods", "Merge parameters", "Analyses and sweeps"
# the Glossary page's order of sections: the hand-written ones, with the generated ones after "Fine-tuning"
ORDER = [*list(SECTIONS)[:5], METHOD_SECTION, PARAMETER_SECTION, *list(SECTIONS)[5:], ANALYSIS_SECTION]

# key → Term, the hand-written entries (each with its section)
TERMS: dict[str, Term] = {key: Term(t.name, t.meaning, t.anchor, t.aliases, section)
                          for section, terms in SECTIONS.items() for key, t in terms.items()}


# ------------------------------------------------------------------------------ docs/methods.md

@lru_cache(maxsize=1)
def _docs() -> str:
    return DOCS.read_text(encoding="utf-8") if DOCS.is_file() else ""


def doc_anchors() -> set[str]:
    """Every anchor (`<a id="…">`) of docs/methods.md (empty when the docs are not installed)."""
    return set(re.findall(r'<a id="([^"]+)"', _docs()))


def doc_section(anchor: str) -> Optional[str]:
    """The markdown of docs/methods.md's section at `anchor`: its heading and text up to the next heading or
    anchor, with in-page links (`(#x)`) turned into Glossary links; None for an unknown anchor."""
    lines = _docs().splitlines()
    start = next((i for i, line in enumerate(lines) if f'<a id="{anchor}"' in line), None)
    if start is None:
        return None
    body: list[str] = []
    for line in lines[start + 1:]:
        if body and (line.startswith("#") or line.startswith("<a id=")):
            break
        body.append(line)
    text = "\n".join(re.sub(r"<a id=\"[^\"]+\"></a>", "", line) for line in body).strip()
    return re.sub(r"\]\(#([^)]+)\)", lambda m: f"]({formula_link(m.group(1))})", text)


def doc_source(anchor: str, _depth: int = 0) -> str:
    """The paper (or other source) the docs/methods.md section at `anchor` cites: "Deep et al., *DELLA-Merging:
    …* (arXiv 2406.11617)"; "" when it cites none. "as X" is followed to anchor x's section."""
    section = doc_section(anchor) or ""
    found = re.search(r"Sources?: (.*?)(?=\n\s*\n|\n- |\Z)", section, re.S)
    if not found:
        return ""
    text = " ".join(found.group(1).split())
    title = re.search(r"\*[^*]+\*", text)
    if title:
        paren = re.match(r"\s*\([^()]*\)", text[title.end():])
        return text[:title.end()] + (paren.group(0) if paren else "")
    end = re.search(r"\)|[.;](?=\s|$)", text)
    text = text[:end.end() if end and end.group(0) == ")" else end.start()] if end else text
    other = re.fullmatch(r"as `?([^`]+)`?", text)         # "as DARE", "as `iso_c`": that anchor's source
    target = other.group(1).lower() if other else ""
    return doc_source(target, _depth + 1) if target in doc_anchors() and _depth < 2 else text


def formula_link(anchor: str) -> str:
    """The app's link to the formula at `anchor`: the Glossary page showing that section of docs/methods.md."""
    return f"glossary?formula={anchor}"


# ------------------------------------------------------------------------------ entries from the registries
#
def method_summary(spec) -> str:
    """What merge method `spec` does, in one line: its description without the name it starts with."""
    head, sep, rest = spec.description.partition(": ")
    return rest[:1].upper() + rest[1:] if sep and len(head) <= 40 else spec.description


def _method_terms() -> dict[str, Term]:
    anchors = doc_anchors()
    out = {}
    for name in METHODS.names():
        spec = METHODS[name]
        head = spec.description.partition(": ")[0]
        aliases = tuple(dict.fromkeys(a for a in (name, head if len(head) <= 40 else "") if a))
        out[name] = Term(spec.display_name, method_summary(spec), name if name in anchors else "", aliases,
                         METHOD_SECTION, spec.paper)
    return out


def _parameter_terms(known: set[str]) -> dict[str, Term]:
    """An entry per merge parameter name that no other entry names: its first declaration's help, the methods that
    take it, and its choices as aliases (scope: tensor, global)."""
    users: dict[str, list] = {}
    for name in METHODS.names():
        for p in METHODS[name].params:
            users.setdefault(p.name, []).append((METHODS[name], p))
    out = {}
    for pname, pairs in sorted(users.items()):
        if _norm(pname) in known:
            continue
        spec, p = pairs[0]
        methods = ", ".join(s.display_name for s, _ in pairs)
        choices = tuple(c for _, q in pairs for c in (q.choices or ()))
        out[f"param:{pname}"] = Term(pname, f"{p.help} (a parameter of {methods})", spec.name, choices,
                                     PARAMETER_SECTION)
    return out


def _analysis_terms() -> dict[str, Term]:
    anchors = doc_anchors()
    out = {}
    for name in ANALYSES.names():
        a = ANALYSES.get(name)
        anchor = ANALYSIS_ANCHORS.get(name, "sweeps" if name.startswith("sweep-") else name)
        out[f"analysis:{name}"] = Term(a.title, a.help[:1].upper() + a.help[1:], anchor if anchor in anchors else "",
                                       (name,), ANALYSIS_SECTION)
    return out


@lru_cache(maxsize=1)
def all_terms() -> dict[str, Term]:
    """Every entry by key: the hand-written ones (TERMS; the fine-tune methods with their paper), then the merge
    methods (by registry name), the merge parameters no other entry names ("param:<name>") and the analyses
    ("analysis:<name>")."""
    hand = {k: replace(t, source=doc_source(t.anchor)) if t.section == "Fine-tuning" and t.anchor else t
            for k, t in TERMS.items()}          # a fine-tune method with the paper its section cites
    out = {**hand, **_method_terms()}
    known = {_norm(w) for t in out.values() for w in (t.name, *t.aliases)}
    return {**out, **_parameter_terms(known), **_analysis_terms()}


# ------------------------------------------------------------------------------ finding and explaining

def _norm(text: str) -> str:
    """A name as the glossary compares names: lower case, "_" read as a space, spaces collapsed."""
    return " ".join(str(text).replace("_", " ").lower().split())


@lru_cache(maxsize=1)
def phrases() -> dict[str, str]:
    """Every name and alias of every entry, normalised (lower case, "_" as a space), → the entry's key; a phrase
    two entries share goes to the first."""
    out: dict[str, str] = {}
    for key, t in all_terms().items():
        for word in (t.name, *t.aliases):
            out.setdefault(_norm(word), key)
    return out


def find(phrase: str) -> Optional[Term]:
    """The entry whose name or alias is `phrase` (case-insensitive, "_" as a space), or None."""
    key = phrases().get(_norm(phrase))
    return all_terms()[key] if key is not None else None


def term(key: str) -> Term:
    """The glossary entry of `key` — a key of `all_terms`, else a name or alias ("dare" → DARE) — or a KeyError
    that names the hand-written keys (a typo in a page must fail its test)."""
    terms = all_terms()
    if key in terms:
        return terms[key]
    found = find(key)
    if found is None:
        raise KeyError(f"no glossary term {key!r}; known: {', '.join(sorted(TERMS))} and every merge method")
    return found


def explain(*keys: str) -> str:
    """One line per term, "**name**: meaning", for a widget's `help=` or a caption (Markdown)."""
    return "  \n".join(f"**{term(k).name}**: {term(k).meaning}" for k in keys)


def explain_group(group: str) -> str:
    """`explain` over the terms of one of GROUPS (e.g. "sweeps": WiSE-FT, FAPM, DARE, TIES, HMA)."""
    return explain(*GROUPS[group])


def glossary_rows(query: str = "") -> list[dict[str, str]]:
    """The glossary as rows {key, term, aliases (a list), meaning, section, formula, link, source}, keeping those
    whose name, aliases, meaning or source contains `query` (case-insensitive; "_" and a space alike; empty keeps
    all): first the entries it names (name or alias equal to it), then those whose name or alias contains it, then
    the others; within each, in the page's order of sections (ORDER) and by term (case-insensitive)."""
    q = _norm(query)
    rows = []
    for key, t in all_terms().items():
        aliases = [a for a in t.aliases if _norm(a) != _norm(t.name)]
        names = [_norm(w) for w in (t.name, *aliases)]
        rank = 0 if q in names else 1 if any(q in n for n in names) else 2
        if q and rank == 2 and not any(q in _norm(text) for text in (t.meaning, t.source)):
            continue
        rows.append({"key": key, "term": t.name, "aliases": aliases, "meaning": t.meaning, "section": t.section,
                     "formula": f"docs/methods.md#{t.anchor}" if t.anchor else "",
                     "link": formula_link(t.anchor) if t.anchor else "", "source": t.source,
                     "rank": rank if q else 0})
    rows.sort(key=lambda r: (r["rank"], ORDER.index(r["section"]), r["term"].lower().lstrip("τθ‖(Δ ")))
    return [{k: v for k, v in r.items() if k != "rank"} for r in rows]
