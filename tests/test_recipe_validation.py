"""Recipe validation (issue 17): seeds, `models:` shapes, mergekit imports that would give invalid recipes."""
from __future__ import annotations

import re

import pytest
import yaml

from forgetlab.core.errors import ParameterError
from forgetlab.merge.mergekit_yaml import from_mergekit
from forgetlab.merge.recipe_io import load_recipe
from forgetlab.merge.recipes import Recipe, check_seed

BASE = {"method": "dare_linear", "base": "/m/base", "models": ["/m/a"]}


@pytest.mark.parametrize("seed, message", [
    (1.9, r"seed must be a whole number .* got 1.9"),
    (float("inf"), r"seed must be a whole number .* got inf"),
    ("abc", r"seed must be a whole number .* got 'abc'"),
    (True, r"got True"),
    (-1, r"got -1"),
    (2**63, r"got 9223372036854775808"),
])
def test_bad_recipe_seeds_are_refused(seed, message):
    with pytest.raises(ParameterError, match=message):
        Recipe.from_dict({**BASE, "seed": seed})


def test_seed_yaml_spellings():
    assert load_recipe(yaml.safe_dump({**BASE, "seed": 7})).seed == 7
    assert load_recipe("method: dare_linear\nbase: b\nmodels: [a]\nseed: 3.0\n").seed == 3  # YAML float, whole
    with pytest.raises(ParameterError, match="whole number"):
        load_recipe("method: dare_linear\nbase: b\nmodels: [a]\nseed: .inf\n")
    assert check_seed(None) is None


def test_seed_param_inf_is_a_message_not_overflow():
    r = Recipe.from_dict({**BASE, "params": {"seed": float("inf")}})
    with pytest.raises(ParameterError, match="seed must be an integer; got inf"):
        r.validated_params()
    r = Recipe.from_dict({**BASE, "params": {"seed": 1.9}})
    with pytest.raises(ParameterError, match="seed must be an integer; got 1.9"):
        r.validated_params()


@pytest.mark.parametrize("models", ["/m/a", {"/m/a": 1}, 5])
def test_models_must_be_a_list(models):
    with pytest.raises(ParameterError, match="`models` must be a list of models"):
        Recipe.from_dict({**BASE, "models": models})


MK = {"merge_method": "ties", "base_model": "/m/base", "models": [{"model": "/m/a"}], "parameters": {"density": 0.5}}


@pytest.mark.parametrize("change, message", [
    ({"models": [5]}, r"Each mergekit model entry is a path or a mapping with `model:`; got 5"),
    ({"models": [{"model": 5}]}, r"A mergekit model must name a path or hub id; got 5"),
    ({"models": "/m/a"}, r"mergekit recipe's `models` must be a list"),
    ({"parameters": [1, 2]}, r"mergekit `parameters` must be a mapping"),
    ({"parameters": [["density", 0.5]]}, r"mergekit `parameters` must be a mapping"),
    ({"models": [{"model": "/m/a", "parameters": [0.5]}]}, r"`parameters` of /m/a must be a mapping"),
    ({"parameters": {"density": 1.7}}, r"mergekit density must lie in \[0, 1\].*got 1.7"),
    ({"merge_method": "dare_ties", "parameters": {"density": -0.2}}, r"density must lie in \[0, 1\].*got -0.2"),
    ({"parameters": {"density": 0.5, "lambda": float("nan")}}, r"lam must be finite"),
])
def test_bad_mergekit_yaml_gives_messages(change, message):
    with pytest.raises(ParameterError, match=message):
        from_mergekit({**MK, **change})


def test_mergekit_import_gives_a_valid_recipe_round_trip():
    r = from_mergekit({**MK, "parameters": {"density": 0.3, "lambda": 0.8}})
    assert r.validated_params()["keep"] == [0.3]          # one per model (issue 41)
    again = load_recipe(r.to_yaml())
    assert again.validated_params() == r.validated_params()


# -- issue 30, item 13: a recipe path is a file to read whatever its name; a folder or non-UTF-8 file is a message

def test_a_recipe_file_is_read_whatever_its_suffix(tmp_path):
    text = yaml.safe_dump({**BASE, "base": str(tmp_path), "models": [str(tmp_path)]})
    for name in ("recipe.txt", "recipe", "RECIPE.YAML"):
        (tmp_path / name).write_text(text)
        assert load_recipe(tmp_path / name).method == "dare_linear"
        assert load_recipe(str(tmp_path / name)).method == "dare_linear"


def test_a_recipe_path_that_is_a_folder_or_not_utf8_or_missing_is_a_message(tmp_path):
    from forgetlab.core.yamlio import YamlError

    with pytest.raises(ParameterError, match=rf"recipe {re.escape(str(tmp_path))} is a folder.*YAML file"):
        load_recipe(tmp_path)
    (tmp_path / "merged").mkdir()                                       # a merge's output folder: its recipe named
    (tmp_path / "merged" / "recipe.yaml").write_text(yaml.safe_dump(BASE))
    with pytest.raises(ParameterError, match=r"is a folder; this folder holds .*merged/recipe.yaml"):
        load_recipe(str(tmp_path / "merged"))
    (tmp_path / "latin1.yaml").write_bytes("method: ties\nbase: café\nmodels: [a]\n".encode("latin-1"))
    with pytest.raises(YamlError, match=r"latin1.yaml is not UTF-8"):
        load_recipe(tmp_path / "latin1.yaml")
    with pytest.raises(ParameterError, match=r"recipe.txt does not exist"):
        load_recipe(str(tmp_path / "recipe.txt"))
    (tmp_path / "list.txt").write_text("- a\n- b\n")
    with pytest.raises(ParameterError, match=r"list.txt must be a YAML mapping"):
        load_recipe(tmp_path / "list.txt")


@pytest.mark.parametrize("make, says", [
    (lambda d: d / "folder.yaml", "is a folder"),
    (lambda d: d / "latin1.yaml", "not UTF-8"),
])
def test_cli_merge_of_a_folder_or_non_utf8_recipe_exits_2_and_writes_nothing(tmp_path, capsys, make, says):
    from forgetlab.cli import main

    (tmp_path / "folder.yaml").mkdir()
    (tmp_path / "latin1.yaml").write_bytes("method: ties\nbase: café\nmodels: [a]\n".encode("latin-1"))
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["merge", str(make(tmp_path)), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert says in err and str(make(tmp_path)) in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_cli_merge_of_a_recipe_named_txt_or_without_suffix(tiny_llama, tmp_path, capsys):
    from forgetlab.cli import main

    text = yaml.safe_dump({"method": "ties", "base": str(tiny_llama.base),
                           "models": [str(p) for p in tiny_llama.finetuned.values()]})
    for name in ("recipe.txt", "recipe"):
        (tmp_path / name).write_text(text)
        assert main(["merge", str(tmp_path / name), str(tmp_path / f"out-{name}")]) == 0
        assert (tmp_path / f"out-{name}" / "model.safetensors").is_file()
