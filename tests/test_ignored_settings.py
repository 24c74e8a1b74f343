"""Issue 41, item 3: settings that were silently ignored are refused with a message naming them and the fix —
a null parameter value (`alpha:` with nothing after it), a key given twice in one YAML mapping, `--lora 0` and an
empty `--lora-targets`."""
from __future__ import annotations

import pytest
import yaml

from forgetlab.cli import main
from forgetlab.core.errors import ParameterError
from forgetlab.core.yamlio import YamlError, safe_load
from forgetlab.merge.recipe_io import load_recipe
from forgetlab.merge.recipes import Recipe
from forgetlab.merge.registry import METHODS, validate_params

FL = "method: {method}\nbase: /m/base\nmodels: [/m/a, /m/b]\nparams: {{{param}: }}\n"


def _numeric_params():
    return [(spec.name, p.name) for _, spec in METHODS.items() for p in spec.params
            if p.type in ("float", "int") and not p.per_model][:60]


@pytest.mark.parametrize("method, param", _numeric_params())
def test_a_null_parameter_in_a_recipe_is_refused_by_name(method, param):
    with pytest.raises(ParameterError, match=rf"params\.{param} has no value .*remove the key to use the method's "
                                             "default"):
        load_recipe(FL.format(method=method, param=param)).validated_params()


@pytest.mark.parametrize("text, where", [
    ("method: ties\nbase: b\nmodels:\n  - model: a\n    weight:\n", r"a: weight has no value"),
    ("method: ties\nbase: b\nmodels: [a]\nparams:\n  keep: [{filter: mlp, value: }, {value: 0.2}]\n",
     r"params\.keep .*filter entry .*has no value"),
    ("method: ties\nbase: b\nmodels: [a]\nparams:\n  keep: ~\n", r"params\.keep has no value"),
    ("method: ties\nbase: b\nmodels: [a]\nslices:\n  - sources:\n      - {model: b, layer_range: [0, 1]}\n"
     "      - {model: a, layer_range: [0, 1]}\n    params: {keep: null}\n", r"slice 1 params\.keep has no value"),
])
def test_null_per_model_filter_and_slice_values_are_refused(text, where):
    with pytest.raises(ParameterError, match=where):
        load_recipe(text).validated_params()


MK = "merge_method: ties\nbase_model: /m/base\nmodels:\n  - model: /m/a\n    parameters: {{weight: 1, density: {d}}}\n" \
     "parameters: {{normalize: {n}}}\n"


@pytest.mark.parametrize("density, normalize, where", [
    ("", "true", "mergekit parameter density of /m/a has no value"),
    ("0.5", "", "mergekit parameter normalize has no value"),
    ("[{filter: mlp, value: null}, {value: 0.5}]", "true", "mergekit parameter density of /m/a .*has no value"),
])
def test_a_null_mergekit_parameter_is_refused_as_mergekit_refuses_it(density, normalize, where):
    # mergekit 0.1.5's ParameterSetting (config.py) has no None: its pydantic model refuses these files
    with pytest.raises(ParameterError, match=where):
        load_recipe(MK.format(d=density, n=normalize))


def test_validate_params_refuses_an_explicit_none():
    with pytest.raises(ParameterError, match=r"ties: keep has no value .*default, 0\.2"):
        validate_params("ties", {"keep": None}, n_models=2)
    with pytest.raises(ParameterError, match=r"task_arithmetic: weights has no value"):
        validate_params("task_arithmetic", {"weights": [1.0, None]}, n_models=2)
    default = validate_params("ties", {"keep": 0.2}, n_models=2)["keep"]
    assert validate_params("ties", {}, n_models=2)["keep"] == default     # leaving it out still means the default


def test_a_recipe_without_nulls_still_reads():
    r = load_recipe("method: ties\nbase: b\nmodels: [a]\nparams: {keep: 0.3, lam: 1}\n")
    assert r.validated_params()["keep"] in (0.3, [0.3])      # one value, or one per model


# -- duplicate keys --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, key, lines", [
    ("method: task_arithmetic\nbase: b\nmodels: [a]\nparams: {lam: 1, lam: 2}\n", "'lam'", "line 4"),
    ("method: ties\nbase: b\nmodels: [a]\nparams:\n  keep: 0.2\n  lam: 1\n  keep: 0.5\n", "'keep'", "lines 5 and 7"),
    ("method: ties\nbase: b\nmodels: [a]\nmethod: dare_linear\n", "'method'", "lines 1 and 4"),
    ("merge_method: ties\nbase_model: b\nmodels:\n  - model: a\n    parameters: {weight: 1, weight: 2}\n",
     "'weight'", "line 5"),
])
def test_a_key_given_twice_in_a_recipe_is_refused_naming_it_and_its_lines(text, key, lines):
    with pytest.raises(YamlError, match=rf"gives the key {key} twice in one mapping \({lines}\).*Keep one"):
        load_recipe(text)


def test_a_key_given_twice_in_a_pool_file_is_refused(tiny_llama, tmp_path):
    from forgetlab.core.errors import ForgetlabError
    from forgetlab.core.pool import ModelPool

    p = tmp_path / "pool.yaml"
    p.write_text(f"base: {tiny_llama.base}\nmodels:\n  a: {tiny_llama.finetuned['ft0']}\n"
                 f"  a: {tiny_llama.finetuned['ft1']}\n")
    with pytest.raises(ForgetlabError, match=rf"pool file {p} gives the key 'a' twice .*lines 3 and 4"):
        ModelPool.from_yaml(p)


def test_merge_keys_may_override_what_they_bring_in_and_same_values_as_keys_count_once():
    doc = safe_load("defaults: &d {keep: 0.2, lam: 1}\nparams:\n  <<: *d\n  keep: 0.5\n")
    assert doc["params"] == {"keep": 0.5, "lam": 1}
    with pytest.raises(YamlError, match="key 1 twice"):
        safe_load("{1: a, 0x1: b}")          # the same integer, spelt twice
    with pytest.raises(YamlError, match="key 'a' twice"):
        safe_load("{a: 1, 'a': 2}")


def test_cli_merge_of_a_recipe_with_a_duplicate_or_null_exits_2_and_writes_nothing(tiny_llama, tmp_path, capsys):
    base, ft = tiny_llama.base, tiny_llama.finetuned["ft0"]
    for i, params in enumerate(["{lam: 1, lam: 2}", "{lam: }"]):
        r = tmp_path / f"r{i}.yaml"
        r.write_text(f"method: task_arithmetic\nbase: {base}\nmodels: [{ft}]\nparams: {params}\n")
        assert main(["merge", str(r), str(tmp_path / f"out{i}")]) == 2
        err = capsys.readouterr().err
        assert "lam" in err and "Traceback" not in err
        assert not (tmp_path / f"out{i}").exists()


# -- LoRA: rank 0 and an empty target list are refused, not read as "full fine-tune" / "every layer" -------------

@pytest.mark.parametrize("extra, message", [
    (["--lora", "0"], "LoRA rank must be ≥ 1; got 0. Leave --lora out for a full fine-tune"),
    (["--lora", "-2"], "LoRA rank must be ≥ 1; got -2"),
    (["--lora", "2", "--lora-targets", ""], "argument --lora-targets: names no module"),
    (["--lora", "2", "--lora-targets", " , "], "argument --lora-targets: names no module"),
    (["--lora", "2", "--lora-targets", "q_proj,,v_proj"], "has an empty name"),
    (["--lora-targets", "q_proj"], "apply only to a LoRA fine-tune: add --lora R"),
])
def test_finetune_refuses_lora_rank_0_and_empty_targets_with_exit_2(extra, message, tiny_llama, tmp_path,
                                                                    monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    try:
        code = main(["finetune", str(tiny_llama.pool_yaml), "--task", "math", "--steps", "1", "--no-save", *extra])
    except SystemExit as exc:                   # argparse's own refusal
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_an_empty_lora_target_list_is_refused_by_the_library_too(tiny_llama):
    from forgetlab.core.checkpoints import load_model
    from forgetlab.train.lora import check_lora
    from forgetlab.train.runs import standard_configs

    model = load_model(tiny_llama.base)
    with pytest.raises(ParameterError, match="target layers are an empty list; choose at least one of"):
        check_lora(model, 2, None, [])
    assert "q_proj" in check_lora(model, 2, None, None)          # None still means every linear layer
    assert standard_configs(lora=2, lora_targets=[])[0].lora_targets == []    # kept, so that it is refused


def test_finetune_page_refuses_an_empty_choice_of_adapted_layers(tiny_llama, tmp_path, monkeypatch):
    import shutil

    from tests.jobs_helper import finish_jobs, open_page

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    root = tmp_path / "pool"
    shutil.copytree(tiny_llama.root, root)
    at = open_page("finetune", root / "pool.yaml")
    at.run()
    at.radio(key="finetune_mode").set_value("one run").run()
    at.radio(key="finetune_weights").set_value("a LoRA adapter").run()
    assert at.number_input(key="finetune_lora_r").min == 1                       # no rank 0 on the page
    at.multiselect(key="finetune_lora_targets").set_value([])
    at.number_input(key="finetune_steps").set_value(2)
    at.number_input(key="finetune_max_general").set_value(1)
    at.button(key="finetune_run").click().run()
    assert not at.exception, at.exception      # refused by the settings' checks as the button is pressed
    assert any("lora_targets is empty" in e.value for e in at.error), [e.value for e in at.error]
    finish_jobs(at, "finetune")
    assert at.session_state["finetune_result"] is None if "finetune_result" in at.session_state else True, \
        "no result: nothing was trained"
