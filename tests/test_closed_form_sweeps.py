"""The closed-form forgetting curves (issue 26): LiNeS β, TSV rank and Iso-C α on one fine-tuned model — their
endpoints are exact models (θ1, θ0), their live points are the registry's merges evaluated like every sweep, and
they run from the CLI and the sweep verbs."""
from __future__ import annotations

import pytest

from forgetlab.analysis.base import ANALYSES
from forgetlab.analysis.closed_form_sweeps import iso_curve, lines_curve, rank_curve
from forgetlab.core.errors import ParameterError
from forgetlab.core.evaluate import evaluate
from forgetlab.merge.working_copy import TensorMerger, WorkingCopy


def _card(pool, name):
    return evaluate(pool.load(name, device="cpu"), pool.tokenizer, pool.probes, name=name)


def _merged_card(pool, merger):
    work = WorkingCopy.load(pool, "ft0")
    work.set(merger, [work.tuned])
    return evaluate(work.model, pool.tokenizer, pool.probes, name="x")


def test_lines_curve_endpoints_and_a_live_point(pool):
    res = lines_curve(pool, "ft0", betas=[0.0, 0.5, 1.0], device="cpu")
    assert res.x_name == "beta" and [p.x for p in res.points] == [0.0, 0.5, 1.0]
    assert res.points[0].scorecard.general_loss == _card(pool, "ft0").general_loss
    names = list(pool.base.names())
    exp = _merged_card(pool, TensorMerger("lines", {"alpha": 0.5, "beta": 0.5}, config=pool.config, names=names))
    assert res.points[1].scorecard.general_loss == pytest.approx(exp.general_loss, abs=1e-6)
    assert res.points[2].settings == {"beta": 1.0, "alpha": 0.0}


def test_rank_curve_and_iso_curve(pool):
    res = rank_curve(pool, "ft0", ranks=[1.0, 0.25], device="cpu")
    assert res.x_name == "keep"
    assert res.points[0].scorecard.general_loss == _card(pool, "ft0").general_loss
    exp = _merged_card(pool, TensorMerger("tsv", {"keep": 0.25}))
    assert res.points[1].scorecard.general_loss == pytest.approx(exp.general_loss, abs=1e-6)
    res = iso_curve(pool, "ft0", iso_alphas=[0.0, 1.5], device="cpu")
    assert res.points[0].scorecard.general_loss == _card(pool, "base").general_loss
    exp = _merged_card(pool, TensorMerger("iso_c", {"alpha": 1.5}))
    assert res.points[1].scorecard.general_loss == pytest.approx(exp.general_loss, abs=1e-6)
    assert res.points[1].distance > 0


def test_bad_grids_and_settings(pool):
    with pytest.raises(ParameterError, match="rank fraction"):
        rank_curve(pool, "ft0", ranks=[0.0])
    with pytest.raises(ParameterError, match=r"\[-10, 10\]"):     # iso_c's α range in the method registry
        iso_curve(pool, "ft0", iso_alphas=[-11])
    with pytest.raises(ParameterError, match="beta"):
        lines_curve(pool, "ft0", betas=[1.5])
    lines, iso = ANALYSES.get("sweep-lines"), ANALYSES.get("sweep-iso")
    with pytest.raises(ParameterError, match="has no setting 'ranks'"):          # another kind's grid
        lines.make_settings(model="ft0", ranks=[0.5])
    res = iso.run(pool, iso.make_settings(model="ft0", iso_alphas=(0.5,), max_general=2, max_task=2))
    assert res.kind == "iso" and len(res.points) == 1


def test_sweep_cli_closed_form_kinds(tiny_llama, tmp_path, monkeypatch, capsys):
    from forgetlab.cli import main
    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path))
    for kind, flag, grid in [("lines", "--betas", "0,1"), ("rank", "--ranks", "1,0.5"), ("iso", "--iso-alphas", "0,1")]:
        code = main(["sweep", kind, str(tiny_llama.pool_yaml), "--model", "ft0", flag, grid, "--max-general", "2",
                     "--max-task", "2"])
        assert code == 0, capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:        # argparse refuses it, naming the registry's range
        raise SystemExit(main(["sweep", "iso", str(tiny_llama.pool_yaml), "--model", "ft0", "--iso-alphas", "11"]))
    assert exit_info.value.code == 2
    assert "[-10, 10]" in capsys.readouterr().err
