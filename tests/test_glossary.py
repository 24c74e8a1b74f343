"""The app's words explained once (forgetlab.ui.glossary): every term has one line and a real anchor in
docs/methods.md, the tooltips are built from it, and the Glossary page lists it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from forgetlab.ui.glossary import (
    GROUPS,
    TERMS,
    explain,
    explain_group,
    glossary_rows,
    term,
)
from tests.jobs_helper import open_page

ROOT = Path(__file__).resolve().parents[1]
# the terms issue 29 asks to be explained wherever they appear
REQUIRED = ["nls", "distance", "tau", "fapm", "hma", "mofo", "sfa", "pareto", "speciality", "generality",
            "wise_ft", "ties", "dare", "pcb", "l1", "l2"]


def test_every_term_is_one_line_with_an_anchor_that_exists():
    anchors = set(re.findall(r'<a id="([^"]+)"', (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")))
    assert set(REQUIRED) <= set(TERMS)
    for key, t in TERMS.items():
        assert t.name and t.meaning and "\n" not in t.meaning, key
        assert len(t.meaning) <= 240, f"{key}: a tooltip line, not a paragraph"
        assert not t.anchor or t.anchor in anchors, f"{key}: docs/methods.md has no anchor {t.anchor!r}"
    assert all(k in TERMS for keys in GROUPS.values() for k in keys)


def test_explain_builds_the_tooltips_from_the_one_home():
    assert explain("mofo") == f"**MoFO**: {TERMS['mofo'].meaning}"
    two = explain("l1", "l2").split("  \n")
    assert two == [f"**L1-to-init**: {TERMS['l1'].meaning}", f"**L2-to-init**: {TERMS['l2'].meaning}"]
    assert [line.split("**")[1] for line in explain_group("sweeps").split("  \n")] == \
        ["WiSE-FT", "FAPM", "DARE", "TIES", "HMA"]
    with pytest.raises(KeyError, match="no glossary term 'mofoo'"):
        term("mofoo")


def test_glossary_rows_filter_and_order():
    everything = glossary_rows()
    assert len(everything) == len(TERMS)
    assert {r["term"] for r in glossary_rows("pareto")} == {"Pareto front"} | {
        t.name for t in TERMS.values() if "pareto" in t.meaning.lower()}
    assert glossary_rows("MOFO")[0]["term"] == "MoFO"               # case-insensitive
    assert glossary_rows("no such word at all") == []
    assert next(r for r in everything if r["term"] == "NLS")["formula"] == "docs/methods.md#nls"


def test_glossary_page_lists_every_term(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("glossary", tmp_path / "none.yaml")
    at.run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Glossary"
    shown = " ".join(m.value for m in at.markdown)
    for t in TERMS.values():
        assert f"**{t.name}** — {t.meaning}" in shown
    at.text_input(key="glossary_query").set_value("sfa").run()
    assert [m.value.split("**")[1] for m in at.markdown] == ["SFA"]


def test_glossary_page_is_in_the_menu():
    from forgetlab.ui.navigation import existing_pages

    assert "glossary" in [p.stem for p in existing_pages(ROOT / "pages")]


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


def test_sweep_and_linearity_words(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("forgetting", tiny_llama.pool_yaml)
    at.run()
    assert not at.exception, at.exception
    kinds = at.radio(key="forgetting_kind").help
    for key in ("wise_ft", "fapm", "dare", "ties", "hma"):
        assert TERMS[key].meaning in kinds
    # no range of D written into the page: the page shows the model's own D (docs/linearity.md measures it)
    source = (ROOT / "pages" / "linearity.py").read_text(encoding="utf-8")
    assert "D ≈" not in source and 'explain("distance")' in source
