"""One name per merge method on every screen: each registered method declares the name the app shows and its own
paper; a merge folder the app proposes is named as the page names the method ("weight average", not "linear"),
and an old folder named after the registry name still reads with the page's name."""
from __future__ import annotations

import yaml

from forgetlab.merge import METHODS
from forgetlab.merge.registry import method_title
from forgetlab.merge.workflow import check_merge_name, load_merge, merge_folder_name


def test_every_method_declares_its_display_name_and_paper():
    for name, spec in METHODS.items():
        assert spec.title and spec.paper, f"{name} declares no title or paper"
        assert spec.to_dict()["title"] == spec.display_name and spec.to_dict()["paper"] == spec.paper
    assert method_title("linear") == "weight average"
    assert method_title("iso_c") == "Iso-C" and method_title("della") == "DELLA"
    assert METHODS["iso_c"].paper != METHODS["ties"].paper          # each its own paper
    assert method_title("no_such_method") == "no_such_method"        # an old recipe's method still gets a label


def test_folder_names_follow_the_display_name_and_are_distinct():
    slugs = {name: spec.slug for name, spec in METHODS.items()}
    assert len(set(slugs.values())) == len(slugs)                    # no two methods share a folder prefix
    for slug in slugs.values():
        check_merge_name(slug)
    assert slugs["linear"] == "weight-average" and slugs["regmean_pp"] == "regmeanpp"
    assert slugs["submodule_alpha"] == "one-alpha-per-submodule"
    name = merge_folder_name("linear", ["math", "code", "translate"], "1206-0915")
    assert name == "weight-average-math-code-translate-1206-0915"
    assert len(merge_folder_name("ties", ["a-very-long-model-name"] * 9, "1206-0915")) <= 100
    check_merge_name(merge_folder_name("ties", ["a-very-long-model-name"] * 9, "1206-0915"))


def test_an_old_folder_named_after_the_registry_name_reads_with_the_pages_name(tmp_path):
    old = tmp_path / "linear-math-code-1201-101010"
    old.mkdir()
    (old / "recipe.yaml").write_text(yaml.safe_dump({"method": "linear", "base": "b", "models": ["m1", "m2"]}))
    row = load_merge(old).to_row()
    assert row["name"] == "linear-math-code-1201-101010" and row["method"] == "weight average"
