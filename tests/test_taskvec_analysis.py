"""The task-vector analysis on the analysis home: found by the registry, its command made from its settings, its
numbers those of the formulas, saved and reopened (the Runs page's charts too), and its page on the panel."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from forgetlab.analysis.base import ANALYSES, analysis_for_kind
from forgetlab.analysis.taskvec import TaskvecSettings
from forgetlab.cli import build_parser, main
from forgetlab.core.errors import ParameterError
from forgetlab.core.taskvectors import cosine_matrix, distance, task_vector_norms


def test_found_by_the_registry_and_on_the_command_line():
    analysis = ANALYSES.get("taskvec")
    assert analysis_for_kind("taskvec") is analysis
    args = build_parser().parse_args(["taskvec", "pool.yaml", "--models", "ft0", "--no-cosines", "--executor", "ray"])
    assert (args.models, args.no_cosines, args.executor) == (["ft0"], True, "ray")


def test_numbers_are_the_formulas(pool):
    analysis = ANALYSES.get("taskvec")
    result = analysis.run(pool, TaskvecSettings(models=("ft0", "ft1")))
    direct = task_vector_norms(pool, "ft1")
    pd.testing.assert_frame_equal(result.norms[1].to_frame(), direct.to_frame())
    assert result.cosine.values == cosine_matrix(pool, ["ft0", "ft1"]).values
    by_level = result.by_level()
    assert set(by_level["model"]) == {"ft0", "ft1"}
    # the whole task vector's norm, from its per-level norms and directly from the weights
    ft0 = by_level[by_level["model"] == "ft0"]
    base, tuned = pool.checkpoint("base").state_dict(), pool.checkpoint("ft0").state_dict()
    whole = math.sqrt(sum(float((tuned[k] - base[k]).norm()) ** 2 for k in base))
    assert math.sqrt(float((ft0["norm"] ** 2).sum())) == pytest.approx(whole, rel=1e-5)
    assert distance(tuned, base) > 0
    assert len(analysis.figures(result)) == 3          # a heatmap per model and the cosines
    without = analysis.run(pool, TaskvecSettings(models=("ft0",), cosines=False))
    assert without.cosine is None and len(analysis.figures(without)) == 1


def test_refuses_an_unknown_model_before_reading_a_tensor(pool):
    with pytest.raises(ParameterError, match="no fine-tuned model 'ft7'"):
        ANALYSES.get("taskvec").check(TaskvecSettings(models=("ft7",)), pool)


def test_saved_reopened_and_drawn_by_the_runs_page(pool, tmp_path):
    from forgetlab.ui.runs import run_figures

    analysis = ANALYSES.get("taskvec")
    result = analysis.run(pool, TaskvecSettings())
    path = analysis.save(result, pool=pool, home_path=tmp_path)
    [saved] = analysis.list(home_path=tmp_path)
    assert saved.path == path and saved.recipe["models"] == ["ft0", "ft1"]
    again = analysis.load(path)
    pd.testing.assert_frame_equal(again.by_level(), result.by_level())
    assert len(run_figures(saved)) == 3


def test_the_command_writes_its_table_and_the_cosines_beside_it(tiny_llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    out = tmp_path / "norms.csv"
    assert main(["taskvec", str(tiny_llama.pool_yaml), "--out", str(out)]) == 0
    assert set(pd.read_csv(out)["model"]) == {"ft0", "ft1"}
    assert pd.read_csv(tmp_path / "norms.cosine.csv", index_col=0).loc["ft0", "ft1"] <= 1.0
    assert len(list((tmp_path / "home" / "runs").iterdir())) == 1
    capsys.readouterr()
    assert main(["taskvec", str(tiny_llama.pool_yaml), "--out", str(out)]) == 2     # it exists: --overwrite
    assert "exists already" in capsys.readouterr().err


def test_its_page_runs_it_on_the_panel(tiny_llama, tmp_path, monkeypatch):
    from tests.jobs_helper import finish_jobs, open_page

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    at = open_page("taskvec", tiny_llama.pool_yaml, timeout=120).run()
    assert not at.exception and at.title[0].value == "Task vectors"
    at.button(key="taskvec_run").click().run()
    finish_jobs(at, "taskvec")
    assert not at.exception
    assert len(at.get("plotly_chart")) == 3
    assert len(ANALYSES.get("taskvec").list(home_path=tmp_path)) == 1
