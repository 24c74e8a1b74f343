"""Issue 41, item 4: numeric arguments that ended in a traceback are messages with exit status 2, checked once for
every command (forgetlab.commands.args: finite_number, whole_number, add_seed; forgetlab.cli._check_arguments)."""
from __future__ import annotations

import argparse

import pytest

from forgetlab import cli
from forgetlab.cli import main


def _actions():
    """(command path, parser, action) for every option of every (sub)command."""
    def walk(parser, prefix):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, prefix + (name,))
            elif action.option_strings:
                yield " ".join(prefix), parser, action
    return list(walk(cli.build_parser(), ()))


def _argv(path, parser, *extra):
    argv = path.split()
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if not a.option_strings:
            argv.append("x")
        elif a.required:
            argv += [a.option_strings[0], "x"]
    return argv + list(extra)


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_no_option_is_a_bare_int_or_float():
    bare = [(p, a.option_strings[0]) for p, _, a in _actions() if a.type in (int, float)]
    assert bare == []


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300"])
def test_every_decimal_option_refuses_non_finite_values(value, capsys):
    checked = 0
    for path, parser, a in _actions():
        if getattr(a.type, "__name__", None) == "finite":
            err = _refused(_argv(path, parser, f"{a.option_strings[0]}={value}"), capsys)
            assert f"argument {a.option_strings[0]}: must" in err and "Traceback" not in err, (path, err)
            checked += 1
    assert checked >= 20


def test_every_whole_number_option_refuses_what_does_not_fit_64_bits(capsys):
    checked = 0
    for path, parser, a in _actions():
        if getattr(a.type, "__name__", None) in ("integer", "count", "number", "seed", "rank"):
            err = _refused(_argv(path, parser, a.option_strings[0], str(2**63)), capsys)
            assert f"argument {a.option_strings[0]}: must be at most" in err, (path, err)
            checked += 1
    assert checked >= 60


@pytest.mark.parametrize("path, limit", [("finetune", 2**63 - 1), ("sweep density", 2**63 - 1),
                                         ("features", 2**32 - 1), ("search", 2**32 - 2), ("pcb-search", 2**32 - 2)])
def test_seeds_take_the_range_of_the_generator_they_seed(path, limit, capsys):
    parser = dict((p, ps) for p, ps, _ in _actions())[path]
    assert cli.build_parser().parse_args(_argv(path, parser, "--seed", str(limit))).seed == limit
    assert "argument --seed: must be at most" in _refused(_argv(path, parser, "--seed", str(limit + 1)), capsys)
    assert "argument --seed: must be at least 0" in _refused(_argv(path, parser, "--seed", "-1"), capsys)


@pytest.mark.parametrize("extra, message", [
    (["--weight-decay", "nan"], "argument --weight-decay: must be a finite number; got 'nan'"),
    (["--seed", "1180591620717411303424"], "argument --seed: must be at most 2**63 − 1"),
    (["--l1", "1e308"], "argument --l1: must lie within ±3.403e+38"),
    (["--lr", "inf"], "argument --lr: must be a finite number"),
])
def test_finetune_numbers_that_ended_in_a_traceback_exit_2_with_a_message(extra, message, tiny_llama, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["finetune", str(tiny_llama.pool_yaml), "--task", "math", "--steps", "1", "--no-save", *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_negative_weight_decay_is_a_message_from_the_library(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    assert main(["finetune", str(tiny_llama.pool_yaml), "--task", "math", "--steps", "1", "--no-save",
                 "--max-general", "1", "--weight-decay", "-1"]) == 2
    err = capsys.readouterr().err
    assert "weight_decay must be a finite number ≥ 0" in err and "Traceback" not in err


def test_the_trainer_refuses_bad_seeds_and_non_finite_penalties(tiny_llama):
    from forgetlab.core.checkpoints import load_model
    from forgetlab.core.errors import ParameterError
    from forgetlab.train.trainer import train

    model = load_model(tiny_llama.base)
    for kw, message in [({"seed": 2**70}, "seed must be a whole number from 0 to 2\\*\\*63 − 1"),
                        ({"seed": -1}, "seed must be"), ({"l1": float("nan")}, "l1 and l2 must be finite"),
                        ({"weight_decay": float("inf")}, "weight_decay must be a finite number")]:
        with pytest.raises(ParameterError, match=message):
            train(model, [object()], steps=1, **kw)


def test_search_refuses_cma_settings_it_would_ignore_or_crash_on(tiny_llama):
    from forgetlab.analysis.search import check_search
    from forgetlab.core.errors import ParameterError
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge.recipes import Recipe

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    recipe = Recipe.from_dict({"method": "task_arithmetic", "base": str(tiny_llama.base),
                               "models": [str(p) for p in tiny_llama.finetuned.values()]})
    check_search(recipe, pool, sigma0=0.3, popsize=4, seed=2**32 - 2, hma_blocks=pool.anatomy.num_layers)
    for kw, message in [({"sigma0": 0.0}, "sigma0 .* must be a finite number > 0"),
                        ({"sigma0": -1.0}, "sigma0"), ({"popsize": 1}, "popsize must be at least 2"),
                        ({"popsize": 0}, "popsize must be at least 2"), ({"seed": 2**32 - 1}, "seed must be"),
                        ({"hma_blocks": 10**11}, "hma_blocks must be at most the model's")]:
        with pytest.raises(ParameterError, match=message):
            check_search(recipe, pool, **kw)


def test_features_refuses_t_sne_settings_scikit_learn_refuses(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    for extra, message in [(["--perplexity", "-5"], "perplexity must be a finite number > 0"),
                           (["--pca-dims", "0"], "pca_dims must be at least 1")]:
        assert main(["features", str(tiny_llama.pool_yaml), "--samples", "2", *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
