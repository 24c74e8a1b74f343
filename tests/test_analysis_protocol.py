"""Every analysis has the same verbs (forgetlab.analysis.base.Analysis): check(settings, pool) refuses bad settings
with the analysis' own message before any model is loaded, run(pool, settings, progress, executor) gives the
result the analysis' function gives, save → load gives the same table back, list finds what was saved."""
from __future__ import annotations

import pandas as pd
import pytest

from forgetlab.analysis.base import ANALYSES
from forgetlab.core.settings import settings_from

get = ANALYSES.get
ANALYSIS_NAMES = ("linearity", "features", "attribution", "search", "taskvec", "textdiff", "finetune", "sequence",
                  "pcb-search", "slwm-weights")
from forgetlab.core.errors import ForgetlabError, ParameterError


def _no_model_loads(monkeypatch):
    """Make any model load fail loudly: a check must not load one. The loader is replaced wherever a module of
    forgetlab holds it (modules import it by name at their top), and so is the pool's cached load."""
    import sys

    import forgetlab.core.checkpoints.loading as loading
    from forgetlab.core.pool import ModelPool

    def refuse(*a, **k):
        raise AssertionError("check() loaded a model")

    original = loading.load_model
    for name, module in list(sys.modules.items()):
        if name.startswith("forgetlab") and getattr(module, "load_model", None) is original:
            monkeypatch.setattr(module, "load_model", refuse)
    monkeypatch.setattr(ModelPool, "load", refuse)


def test_every_analysis_is_registered_with_its_verbs():
    for kind in ANALYSIS_NAMES:
        a = get(kind)
        assert a.kind == kind and a.name == kind
        for verb in ("check", "estimate", "run", "save", "load", "list", "figures"):
            assert callable(getattr(a, verb)), (kind, verb)
    with pytest.raises(ParameterError, match="Unknown analysis 'nope'; choose one of attribution, features"):
        get("nope")
    for kind in ("alpha", "pruning", "density", "hma", "lines", "rank", "iso"):     # a sweep per kind (issue 42)
        a = get(f"sweep-{kind}")
        assert a.kind == f"sweep-{kind}" and a.command == ("sweep", kind)
        for verb in ("check", "run", "save", "load", "list"):
            assert callable(getattr(a, verb)), (kind, verb)
    with pytest.raises(ParameterError, match="Unknown analysis 'sweep-wobble'"):
        get("sweep-wobble")
    studies = {n for n in ANALYSES.names() if n.startswith("study-")}     # test_study_framework.py lists them
    assert set(ANALYSIS_NAMES) | {f"sweep-{k}" for k in ("alpha", "pruning", "density", "hma", "lines", "rank",
                                                         "iso")} == set(ANALYSES.names()) - studies


def test_settings_are_typed_and_unknown_names_are_refused():
    a = get("sweep-alpha")
    s = settings_from(a.settings, {"model": "ft0", "alphas": [0.0, 1.0]})
    assert s.alphas == [0.0, 1.0] and not hasattr(s, "ratios")         # another kind's grid is not a setting
    with pytest.raises(ParameterError, match="AlphaSettings has no setting 'alhpas'"):
        settings_from(a.settings, {"alhpas": [0.5]})


@pytest.mark.parametrize("kind,values,message", [
    ("sweep-alpha", {"model": "ft0", "ratios": [0.5]}, "AlphaSettings has no setting 'ratios'"),
    ("sweep-alpha", {"model": "nope"}, "no fine-tuned model 'nope'"),
    ("sweep-alpha", {"model": "ft0", "alphas": [0.5, 1.5]}, "alpha"),
    ("linearity", {"task": "math", "model": "ft0", "alphas": [0.5, 1.0]}, "alphas must be distinct numbers in [0, 1)"),
    ("linearity", {"task": "math", "model": "ft0", "levels": ["neuron"]}, "'neuron' is not one of the levels"),
    ("linearity", {"task": "chess", "model": "ft0"}, "no task 'chess'"),
    ("features", {"models": []}, "models is empty"),
    ("features", {"models": ["ft9"]}, "no model 'ft9'"),
    ("attribution", {"model": "ft0", "level": "neuron"}, "neuron"),
    ("attribution", {"model": "nope"}, "nope"),
    ("search", {}, "A search needs a recipe"),
    ("taskvec", {"models": ["ft7"]}, "no fine-tuned model 'ft7'"),
])
def test_check_refuses_bad_settings_before_loading_a_model(kind, values, message, pool, monkeypatch):
    _no_model_loads(monkeypatch)
    a = get(kind)
    with pytest.raises(ForgetlabError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        a.check(settings_from(a.settings, values), pool)


def test_check_passes_good_settings_without_loading_a_model(pool, monkeypatch):
    _no_model_loads(monkeypatch)
    for kind, values in [("sweep-alpha", {"model": "ft0", "alphas": [0.0, 1.0]}),
                         ("linearity", {"task": "math", "model": "ft0", "levels": ["mlp"]}),
                         ("features", {"models": ["base", "ft0"], "tasks": ["math"]}),
                         ("attribution", {"model": "ft0", "level": "layer", "task": "math"}),
                         ("taskvec", {"models": ["ft0", "ft1"]})]:
        a = get(kind)
        a.check(settings_from(a.settings, values), pool)


def test_run_gives_what_the_function_gives_and_save_load_list_round_trip(pool, tmp_path):
    from forgetlab.analysis.sweeps import alpha_curve
    from forgetlab.core.taskvectors import cosine_matrix

    sweep = get("sweep-alpha")
    s = sweep.settings(model="ft0", alphas=[0.0, 0.5], max_general=2, max_task=2, device="cpu")
    seen = []
    res = sweep.run(pool, s, progress=lambda f, m: seen.append(f))
    direct = alpha_curve(pool, "ft0", alphas=[0.0, 0.5], max_general=2, max_task=2, device="cpu")
    cols = ["series", "x", "general_loss", "speciality", "distance"]
    pd.testing.assert_frame_equal(res.to_frame()[cols], direct.to_frame()[cols])
    assert seen and seen[-1] == 1.0
    path = sweep.save(res, home_path=tmp_path)
    pd.testing.assert_frame_equal(sweep.load(path).to_frame()[cols], res.to_frame()[cols])
    assert [r.path for r in sweep.list(home_path=tmp_path)] == [path]

    tv = get("taskvec")
    res = tv.run(pool, tv.settings(models=["ft0", "ft1"]))
    assert [n.model for n in res.norms] == ["ft0", "ft1"]
    assert res.cosine.values == cosine_matrix(pool, ["ft0", "ft1"]).values
    path = tv.save(res, home_path=tmp_path, pool=pool)
    again = tv.load(path)
    pd.testing.assert_frame_equal(again.to_frame(), res.to_frame())
    assert again.cosine.values == res.cosine.values
    assert [r.path for r in tv.list(home_path=tmp_path)] == [path]
    with pytest.raises(ForgetlabError, match="not task-vector norms"):
        tv.load(sweep.list(home_path=tmp_path)[0].path)


def test_linearity_save_is_the_one_the_page_and_the_cli_write(pool, tmp_path):
    lin = get("linearity")
    res = lin.run(pool, lin.settings(task="math", model="ft0", levels=["mlp"], samples=2, alphas=[0.0, 0.5],
                                     device="cpu"))
    path = lin.save(res, home_path=tmp_path, pool=pool)
    saved = lin.list(home_path=tmp_path)[0]
    assert saved.path == path and saved.recipe["model"] == "ft0" and saved.recipe["levels"] == ["mlp"]
    assert saved.recipe["pool"] == str(pool.source.resolve())
    csv = pd.read_csv(path / "results.csv")
    assert csv["curve"].iloc[0].count(";") == 1                     # d(α) written 'd0;d1'
    pd.testing.assert_frame_equal(lin.load(path).to_frame(), res.to_frame())
