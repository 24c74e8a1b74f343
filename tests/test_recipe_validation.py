"""Recipe validation (issue 17): seeds, `models:` shapes, mergekit imports that would give invalid recipes."""
from __future__ import annotations

import pytest
import yaml

from forgetlab.core.errors import ParameterError
from forgetlab.merge.recipes import Recipe, check_seed, load_recipe

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
        Recipe.from_mergekit({**MK, **change})


def test_mergekit_import_gives_a_valid_recipe_round_trip():
    r = Recipe.from_mergekit({**MK, "parameters": {"density": 0.3, "lambda": 0.8}})
    assert r.validated_params()["keep"] == 0.3
    again = load_recipe(r.to_yaml())
    assert again.validated_params() == r.validated_params()
