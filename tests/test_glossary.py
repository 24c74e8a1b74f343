"""The app's words explained once (forgetlab.ui.glossary): every word a page shows has an entry, every merge method,
fine-tune method and sweep kind is found by search, every formula link points at a real docs/methods.md anchor,
the tooltips are built from the same lines, and the Glossary page lists them, grouped and searchable."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest

from forgetlab.ui.glossary import (GROUPS, TERMS, all_terms, doc_anchors, doc_section, doc_source, explain,
                                   explain_group, find, glossary_rows, method_summary,
                                   phrases, term)
from tests.glossary_words import (DATA_NAMES, RUN_IDS, Shown, figure_words, page_words, source_words, spec_words,
                                  table_words)
from tests.jobs_helper import open_page

ROOT = Path(__file__).resolve().parents[1]
# the terms issue 29 and issue 43 ask to be explained wherever they appear
REQUIRED = ["nls", "distance", "tau", "fapm", "hma", "mofo", "sfa", "pareto", "speciality", "generality",
            "wise_ft", "ties", "dare", "pcb", "l1", "l2", "kl", "lens", "rise", "della", "iso_c", "tsv", "lines",
            "slerp", "cma_es", "model_stock", "slwm", "token_class", "benchmark"]

# ------------------------------------------------------------------ how a shown text is read into words
#
# A text the app shows (a label, an option, an axis title, a column header) is explained when, after
#   1. HTML tags removed, "_" read as a space (code names: general_loss = general loss), "{…}" fields dropped;
#   2. the direction marks ↑ ↓ and "better" dropped;
#   3. every glossary name and alias removed where it stands as a phrase (case-insensitive, also with a plural
#      "s"), the longest first ("general loss" before "loss");
#   4. numbers, symbols side by side (ατ), units (UNITS) and the names of the data the words were collected on
#      (DATA_NAMES: models, tasks; RUN_IDS: the saved runs' ids) dropped,
# every word left is an everyday word used in its everyday sense (PLAIN); a hyphenated word passes when each of its
# parts does. A word that is neither needs a glossary entry (forgetlab/ui/glossary_terms.py) or, if it really is
# everyday English here, a place in PLAIN.
UNITS = {"nats", "nat", "s", "%", "mib", "gib", "k"}
PLAIN = set("""
a an the of to in on at by for from with without into over under per vs than as and or not no if
is it its it's this these them their each every all any one two first last only other others own same
mean total share sum min max largest smallest higher better lower larger more less most many few
new saved open show shown draw compare comparing keep kept find pick choose pick use used
name names value values path folder kind label labels id index key number count size
run runs point points line lines grid curve curves map maps text type step
optional empty what where which whose how when whole part
measured measure measures created error stopped seconds time
before after along beside between across up down per rate rates n my
average compared final evaluate evaluated examples fit address term none mode trains reopen read known form format answered
shade symbol colour dashed separated
previous earlier next since that finished half ways change averaging trained rows dotted outlined
frequency
table tables figure appendix b.1 a.1.3 a.1.4 section results rebuttal review discussion reply authors baseline validation
self i j data draws
""".split())
# why each kind of word above is plain: function words; counting and comparing words (mean, total, share, sum,
# largest); the app's verbs on its own objects (show, compare, keep, open, pick); the names of a table's own
# bookkeeping columns (id, index, key, kind, label, created, error, seconds, stopped) and of plain layout words
# (line, point, grid, curve, map, part); words of instructions and chart keys in their everyday sense (evaluate, fit,
# shade, symbol, colour, dashed, known, answered); n: a count. The words of a task sequence's labels in their
# everyday sense: the previous or next stage, the earlier or finished tasks, half of the matrices, ways of
# fine-tuning, a change since a stage, averaging, the stage that trained on a task, a heatmap's rows, dotted and
# outlined marks. A study's name: how often SFA averages (frequency). Where a paper study says what it reproduces:
# the parts of a paper and of its review (table, figure, appendix B.1, results, rebuttal, review discussion, the
# authors' reply, a baseline, the validation search), the self term (pcb-self) and its indices i and j, how much
# probe data a study draws and how many draws it takes.


def _strip(text: str) -> str:
    text = re.sub(r"<[^>]+>", " ", str(text)).replace("{…}", " ").replace("_", " ")
    text = re.sub(r"[↑↓]|\bbetter\b", " ", text)
    return " ".join(text.lower().split())


def unexplained(text: str, data=frozenset()) -> list[str]:
    """The words of `text` that neither a glossary entry nor PLAIN, UNITS or the data's names explain (above)."""
    return list(_unexplained(str(text), frozenset(data) | frozenset(RUN_IDS)))


@lru_cache(maxsize=None)
def _unexplained(text: str, data: frozenset) -> tuple[str, ...]:
    rest = " " + _strip(text) + " "
    for phrase in sorted(phrases(), key=len, reverse=True):
        p = _strip(phrase)
        if p and p.rstrip("y") in rest:
            plural = rf"{re.escape(p[:-1])}(?:y|ies)" if p.endswith("y") else rf"{re.escape(p)}(?:e?s)?"
            rest = re.sub(rf"(?<!\w){plural}(?!\w)", " ", rest)
    names = {n.lower() for n in (*DATA_NAMES, *data)}
    symbols = {p for p in phrases() if len(p) == 1 and not p.isascii()}
    out = []
    for word in re.findall(r"[^\W\d_][\w'’.-]*", rest):
        word = word.strip(".-'’")
        if not word or word in UNITS or word in names or word in PLAIN:
            continue
        if all(c in symbols or c.isdigit() for c in word):       # symbols side by side: ατ = α·τ
            continue
        if "-" in word and all(part in PLAIN | UNITS | names or not part for part in word.split("-")):
            continue
        out.append(word)
    return tuple(out)


def _report(shown: list[Shown]) -> list[str]:
    missing: dict[str, list[str]] = {}
    for s in shown:
        for word in unexplained(s.text):
            missing.setdefault(word, []).append(f"{s.text!r} ({s.where})")
    return [f"{w!r}: {places[0]}" + (f" and {len(places) - 1} more" if len(places) > 1 else "")
            for w, places in sorted(missing.items())]


# ------------------------------------------------------------------ every word a page shows has an entry

@pytest.fixture(scope="module")
def shown(tiny_llama, tmp_path_factory) -> dict:
    """The words collected by tests/glossary_words.py, by where they come from (an empty workspace)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORGETLAB_HOME", str(tmp_path_factory.mktemp("glossary-home")))
        figures, undrawn = figure_words()
        return {"pages": page_words(tiny_llama.pool_yaml), "source": source_words(), "figures": figures,
                "tables": table_words(), "undrawn": undrawn}


@pytest.mark.parametrize("where", ["pages", "source", "figures", "tables"])
def test_every_word_the_pages_show_has_a_glossary_entry(shown, where):
    assert len(shown[where]) > 20, f"the collection of {where} found almost nothing: is it broken?"
    missing = _report(shown[where])
    assert not missing, ("words the app shows without a glossary entry (add one to forgetlab/ui/glossary_terms.py, "
                         "or an everyday word to PLAIN here):\n" + "\n".join(missing))


def test_every_figure_function_is_drawn_by_the_collection(shown, monkeypatch):
    assert not shown["undrawn"], f"no builder in tests/glossary_words.py draws {shown['undrawn']}: add one"
    # a new chart function is noticed: it is one of the functions the collection must draw
    import plotly.graph_objects as go

    import forgetlab.plots.models as models
    from tests.glossary_words import figure_functions

    def new_chart(cards) -> go.Figure:
        return go.Figure()
    new_chart.__module__ = models.__name__
    monkeypatch.setattr(models, "new_chart", new_chart, raising=False)
    assert "forgetlab.plots.models.new_chart" in figure_functions().values()


def test_the_collection_reads_axis_titles_and_catches_an_undocumented_one():
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[0], y=[0], name="Pareto front"))
    fig.update_layout(xaxis_title="flux capacitance (nats) ↓", yaxis_title="Δ general loss (nats)",
                      coloraxis_colorbar_title_text="NLS")
    texts = {s.text for s in spec_words(fig.to_plotly_json(), "test")}
    assert {"flux capacitance (nats) ↓", "Δ general loss (nats)", "Pareto front"} <= texts
    assert unexplained("flux capacitance (nats) ↓") == ["flux", "capacitance"]
    for documented in ("Δ general loss (nats)", "Pareto front", "mean rise per token class · math vs base",
                       "KL(reference ‖ model)", "speciality: math exact match ↑", "iso_c", "DARE / TIES / DELLA / "
                       "SCE density curve", "‖τ‖ / ‖θ0‖", "Distance curves d(α) = ‖f(θ0+ατ) − f(θ0+τ)‖"):
        assert unexplained(documented) == [], documented


# ------------------------------------------------------------------ the entries

def test_every_term_is_one_line_with_an_anchor_that_exists():
    anchors = doc_anchors()
    assert anchors == set(re.findall(r'<a id="([^"]+)"', (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")))
    for key in REQUIRED:
        assert term(key).meaning, key
    for key, t in all_terms().items():
        assert t.name and t.meaning and "\n" not in t.meaning and t.section, key
        assert key not in TERMS or len(t.meaning) <= 240, f"{key}: a tooltip line, not a paragraph"
        assert not t.anchor or t.anchor in anchors, f"{key}: docs/methods.md has no anchor {t.anchor!r}"
        assert not t.anchor or doc_section(t.anchor), key
    assert all(term(k) for keys in GROUPS.values() for k in keys)
    assert [r["link"] for r in glossary_rows("DELLA") if r["key"] == "della"] == ["glossary?formula=della"]


def test_merge_methods_come_from_the_registry_with_their_paper():
    from forgetlab.merge import METHODS

    for name in METHODS.names():
        spec, t = METHODS[name], all_terms()[name]
        assert (t.name, t.meaning, t.anchor, t.section) == (spec.display_name, method_summary(spec), name,
                                                            "Merge methods")
        assert name in t.aliases and t.meaning.lower() in spec.description.lower() and t.source == spec.paper
    names = [METHODS[n].display_name for n in METHODS.names()]
    assert len(set(names)) == len(names), "two methods show the same name"
    for name, shown in [("della", "DELLA"), ("iso_c", "Iso-C"), ("lines", "LiNeS"), ("slerp", "SLERP"),
                        ("model_stock", "Model Stock")]:
        assert term(name).name == shown and find(shown) is term(name)
    assert term("della").meaning.startswith("Random magnitude-ranked pruning")     # the name is not repeated
    assert "DELLA-Merging" in term("della").source and "2406.11617" in term("della").source
    assert doc_source("dare_ties") == doc_source("dare_linear") != ""           # "Source: as DARE." is followed
    assert all(METHODS[n].paper for n in METHODS.names()), "a method without its paper"


def test_search_finds_every_method_fine_tune_method_and_sweep_kind():
    from forgetlab.analysis.sweeps import KINDS
    from forgetlab.merge import METHODS
    from forgetlab.plots import SERIES_NAMES
    from forgetlab.train.runs import standard_configs
    from forgetlab.train.trainer import OPTIMIZERS

    for name in METHODS.names():
        for word in (name, METHODS[name].display_name):
            assert name in [r["key"] for r in glossary_rows(word)], word
    fixes = {c.label.split("-")[0] for c in standard_configs()} | set(OPTIMIZERS) | {"lora"}
    for word in sorted(fixes) + [SERIES_NAMES[f] for f in sorted(fixes) if f in SERIES_NAMES]:     # names, legends
        assert find(word) is not None and glossary_rows(word), word
    assert find("sfa").section == "Fine-tuning" and "Soup to go" in find("sfa").source
    for kind in KINDS:
        assert f"analysis:sweep-{kind}" in [r["key"] for r in glossary_rows(f"sweep-{kind}")], kind
    for word in ("DELLA", "KL", "logit lens", "rise", "Iso-C", "TSV", "LiNeS", "SLERP", "CMA-ES", "model_stock",
                 "slwm", "special", "benchmark accuracy"):
        assert glossary_rows(word), word


def test_search_finds_every_sequence_method_and_the_group_covers_them():
    from forgetlab.train.sequence import SEQUENCE_METHODS

    for name, method in SEQUENCE_METHODS.items():        # the names the CLI and the legends use, and the titles
        assert find(name) is not None and glossary_rows(name), name
        assert unexplained(method.title) == [], method.title
    # the Sequence page's tooltip (GROUPS["sequence"]) has a line for every method and none for anything else
    assert {find(name) for name in SEQUENCE_METHODS} == {term(k) for k in GROUPS["sequence"]}
    for word, paper in (("ewc", "Kirkpatrick"), ("hft", "Half Fine-Tuning")):
        assert find(word).section == "Fine-tuning" and paper in find(word).source, word
    for word in ("BWT", "backward transfer", "bwt_gem", "TRACE", "OP", "FWT", "per-task forgetting", "stage",
                 "chain", "training order", "retained gain", "naive sequential fine-tuning", "proximal GD"):
        assert find(word) is not None and find(word).anchor in ("sequence-metrics", "sequence-methods"), word


def test_explain_builds_the_tooltips_from_the_one_home():
    assert explain("mofo") == f"**MoFO**: {TERMS['mofo'].meaning}"
    two = explain("l1", "l2").split("  \n")
    assert two == [f"**L1-to-init**: {TERMS['l1'].meaning}", f"**L2-to-init**: {TERMS['l2'].meaning}"]
    assert [line.split("**")[1] for line in explain_group("sweeps").split("  \n")] == \
        ["WiSE-FT", "FAPM", "DARE", "TIES", term("hma").name]
    assert explain("iso_c") == f"**Iso-C**: {all_terms()['iso_c'].meaning}"     # a method: from the registry
    with pytest.raises(KeyError, match="no glossary term 'mofoo'"):
        term("mofoo")


def test_glossary_rows_filter_and_order():
    everything = glossary_rows()
    assert len(everything) == len(all_terms())
    sections = [r["section"] for r in everything]
    assert sections == sorted(sections, key=sections.index) and sections[0] == "Measures"    # grouped
    assert {r["term"] for r in glossary_rows("pareto")} >= {"Pareto front"}
    assert glossary_rows("MOFO")[0]["term"] == "MoFO"               # case-insensitive
    assert glossary_rows("general_loss")[0]["term"] == "general loss"   # a code name finds its entry
    assert glossary_rows("no such word at all") == []
    assert next(r for r in everything if r["term"] == "NLS")["formula"] == "docs/methods.md#nls"


# ------------------------------------------------------------------ the page

def test_glossary_page_lists_every_term_grouped_and_finds_them(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("glossary", tmp_path / "none.yaml")
    at.run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Glossary"
    shown = " ".join(m.value for m in at.markdown)
    for t in all_terms().values():
        assert f"**{t.name}** — {t.meaning}" in shown
    assert [e.label.rsplit(" (", 1)[0] for e in at.expander] == list(dict.fromkeys(
        r["section"] for r in glossary_rows()))
    assert "[docs/methods.md#della](glossary?formula=della)" in " ".join(c.value for c in at.caption)
    at.text_input(key="glossary_query").set_value("DELLA").run()
    found = [m.value.split("**")[1] for m in at.markdown]
    assert "DELLA" in found and "TIES" not in found


def test_a_formula_link_opens_its_section_of_docs_methods_md(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("glossary", tmp_path / "none.yaml")
    at.query_params["formula"] = "della"
    at.run()
    assert not at.exception, at.exception
    shown = " ".join(m.value for m in at.markdown)
    assert "`della`, `della_linear`, `breadcrumbs_ties`" in shown and "MAGPRUNE" in shown
    at = open_page("glossary", tmp_path / "none.yaml")
    at.query_params["formula"] = "no-such-anchor"
    at.run()
    assert "no section 'no-such-anchor'" in at.warning[0].value


def test_glossary_page_is_in_the_menu():
    from forgetlab.ui.navigation import existing_pages

    assert "glossary" in [p.stem for p in existing_pages(ROOT / "pages")]


# ------------------------------------------------------------------ the tooltips on the pages

def _help(widgets, key):
    return next(w for w in widgets if w.key == key).help or ""


def test_finetune_inputs_explain_themselves_and_l1_has_its_input(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("finetune", tiny_llama.pool_yaml)
    at.run()
    assert not at.exception, at.exception
    assert at.radio(key="finetune_mode").value == "comparison"
    numbers = at.number_input
    assert TERMS["mofo"].meaning in _help(numbers, "finetune_fraction")
    assert TERMS["sfa"].meaning in _help(numbers, "finetune_sfa_beta")
    assert "SFA p" in _help(numbers, "finetune_cmp_sfa_p")
    assert TERMS["l2"].meaning in _help(numbers, "finetune_cmp_l2")
    assert TERMS["l1"].meaning in _help(numbers, "finetune_cmp_l1")
    assert at.number_input(key="finetune_cmp_l1").value == pytest.approx(1e-3)   # the comparison's L1 strength
    for name in ("AdamW", "MoFO", "SFA", "L2-to-init", "L1-to-init"):
        assert f"**{name}**" in at.radio(key="finetune_mode").help
    # one run: the same explanations on its own inputs
    at.radio(key="finetune_mode").set_value("one run").run()
    assert TERMS["l1"].meaning in _help(at.number_input, "finetune_l1")
    assert TERMS["l2"].meaning in _help(at.number_input, "finetune_l2")
    assert "**MoFO**" in at.radio(key="finetune_optimizer").help


def test_the_sequence_page_explains_its_methods_and_metrics(tiny_llama, tmp_path, monkeypatch):
    from forgetlab.train.sequence import SEQUENCE_METHODS

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("sequence", tiny_llama.pool_yaml)
    at.run()
    assert not at.exception, at.exception
    methods = at.multiselect(key="sequence_methods").help
    for name in SEQUENCE_METHODS:
        assert f"**{find(name).name}**: {find(name).meaning}" in methods, name
    # the metrics table's caption (drawn after a run) is the glossary's lines of its columns
    import ast

    captions = [ast.unparse(node.args[0]) for node in ast.walk(ast.parse((ROOT / "pages" / "sequence.py").read_text(
        encoding="utf-8"))) if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "caption" and node.args]
    assert "explain('op', 'bwt', 'fwt', 'task_forgetting')" in captions


def test_sweep_and_linearity_words(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("forgetting", tiny_llama.pool_yaml)
    at.run()
    assert not at.exception, at.exception
    kinds = at.radio(key="forgetting_kind").help
    for key in ("wise_ft", "fapm", "dare", "ties", "hma"):
        assert term(key).meaning in kinds
    # no range of D written into the page: the page shows the model's own D (docs/linearity.md measures it)
    source = (ROOT / "pages" / "linearity.py").read_text(encoding="utf-8")
    assert "D ≈" not in source and 'explain("distance")' in source


def test_the_text_and_features_pages_explain_their_words_from_the_glossary(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("features", tiny_llama.pool_yaml)
    at.run()
    assert not at.exception, at.exception
    assert TERMS["pooling"].meaning in _help(at.radio, "features_pooling")
    # the Text page's result view (drawn after a run): its radios' tooltips are explain() calls
    import ast

    calls = {}
    for node in ast.walk(ast.parse((ROOT / "pages" / "text.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "radio" and node.args \
                and isinstance(node.args[0], ast.Constant):
            calls[node.args[0].value] = next((ast.unparse(k.value) for k in node.keywords if k.arg == "help"), "")
    assert calls["shade by"] == "explain('rise', 'kl')" and calls["per class"] == "explain('token_class')"
