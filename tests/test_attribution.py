"""forgetlab.analysis.attribution: per-submodule only-this / leave-one-out maps, additivity, bad input, CLI, Runs, and
the submodule_alpha recipe made from a map."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import yaml

from forgetlab.analysis import attribution as A
from forgetlab.core.errors import ForgetlabError, ParameterError, ProbeDataError
from forgetlab.core.evaluate import Scorecard, TaskScore

LIMITS = dict(max_general=2, max_task=4, batch_size=8, device="cpu")


@pytest.fixture(scope="module")
def edited(tiny_llama, tmp_path_factory):
    """A pool over the tiny Llama base whose models change known parts only: `one-mlp` (layer 1's MLP, by a
    lot), `same` (a copy of the base: τ = 0), `two` (layer 0's attention and layer 1's MLP) — plus ft0."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forgetlab.core.pool import ModelPool

    root = tmp_path_factory.mktemp("attr-pool")
    tok = AutoTokenizer.from_pretrained(str(tiny_llama.base))
    g = torch.Generator().manual_seed(7)

    def save(name, prefixes):
        m = AutoModelForCausalLM.from_pretrained(str(tiny_llama.base))
        with torch.no_grad():
            for n, p in m.named_parameters():
                if any(n.startswith(pre) for pre in prefixes):
                    p.add_(0.5 * torch.randn(p.shape, generator=g))
        m.save_pretrained(str(root / name))
        tok.save_pretrained(str(root / name))

    save("one-mlp", ["model.layers.1.mlp."])
    save("same", [])
    save("two", ["model.layers.0.self_attn.", "model.layers.1.mlp."])
    data = tiny_llama.root / "data"
    spec = {"name": "attr", "base": str(tiny_llama.base),
            "models": {"one-mlp": str(root / "one-mlp"), "same": str(root / "same"), "two": str(root / "two"),
                       "ft0": str(tiny_llama.finetuned["ft0"])},
            "probes": {"general": str(data / "general.txt"),
                       "tasks": {t: {"probe": str(data / f"{t}.jsonl"), "eval": str(data / f"{t}.jsonl")}
                                 for t in ("math", "copy")}}}
    (root / "pool.yaml").write_text(yaml.safe_dump(spec))
    pool = ModelPool.from_yaml(root / "pool.yaml")
    return pool


def _frame(result, which):
    f = result.to_frame()
    return f[f["map"] == which].set_index("key")


def test_one_changed_mlp_is_where_the_map_puts_everything(edited):
    """The external check: only layer 1's MLP changed → only-this puts the whole change there (others 0) and
    leaving that submodule out recovers the base's scores exactly."""
    r = A.attribute(edited, "one-mlp", task="math", level="module", **LIMITS)
    base, ft = r.scores("base"), r.scores("finetuned")
    assert ft["general_loss"] - base["general_loss"] > 0.01          # the edit is visible
    only, loo = _frame(r, "only_this"), _frame(r, "leave_one_out")
    assert list(only.index) == ["embed", "0.attn", "0.mlp", "0.norm", "1.attn", "1.mlp", "1.norm", "norm", "lm_head"]
    for meas in ("general_loss", "speciality", "answer_loss"):
        assert only.loc["1.mlp", f"d_{meas}"] == pytest.approx(ft[meas] - base[meas], abs=1e-6)
        others = only.drop(index="1.mlp")[f"d_{meas}"]
        assert (others.abs() < 1e-6).all(), others
        # leave-one-out of 1.mlp = the base: its scores, d = base − fine-tune
        assert loo.loc["1.mlp", meas] == pytest.approx(base[meas], abs=1e-6)
        assert loo.loc["1.mlp", f"d_{meas}"] == pytest.approx(base[meas] - ft[meas], abs=1e-6)
        assert (loo.drop(index="1.mlp")[f"d_{meas}"].abs() < 1e-6).all()
    assert only.loc["1.mlp", "tau_share"] == pytest.approx(1.0)
    assert set(r.zero_parts) == set(only.index) - {"1.mlp"}
    assert "zero task vector" in r.notes[0]
    assert r.evaluations == 4                    # base, fine-tune, only 1.mlp, without 1.mlp: zero parts skipped
    add = r.additivity().set_index(["map", "measure"])
    assert add.loc[("only_this", "general_loss"), "ratio"] == pytest.approx(1.0)
    # the layer level: leave-one-out of layer 1 is the base too
    lay = A.attribute(edited, "one-mlp", task="math", level="layer", **LIMITS)
    assert _frame(lay, "leave_one_out").loc["1", "general_loss"] == pytest.approx(base["general_loss"], abs=1e-6)
    assert _frame(lay, "only_this").loc["1", "d_general_loss"] == pytest.approx(
        ft["general_loss"] - base["general_loss"], abs=1e-6)


def test_two_parts_evaluated_and_not_additive_by_construction(edited):
    r = A.attribute(edited, "two", task="math", level="module", select=["0.attn", "1.mlp"], **LIMITS)
    only, loo = _frame(r, "only_this"), _frame(r, "leave_one_out")
    assert list(only.index) == ["0.attn", "1.mlp"]
    # with two parts, only-this of one is leave-one-out of the other: same model, same scores
    for meas in ("general_loss", "answer_loss"):
        assert only.loc["0.attn", meas] == pytest.approx(loo.loc["1.mlp", meas], abs=1e-6)
        assert only.loc["1.mlp", meas] == pytest.approx(loo.loc["0.attn", meas], abs=1e-6)
    assert r.evaluations == 6
    assert not r.to_frame()["zero_tau"].any()


def test_alpha_line_and_head_level(edited):
    r = A.attribute(edited, "two", task="math", level="head", select=["0.attn.h1", "1.mlp"], alphas=[0, 0.5, 1],
                    **LIMITS)
    f = r.to_frame()
    assert sorted(set(f["alpha"])) == [0.0, 0.5, 1.0]
    only = f[(f["map"] == "only_this") & (f["key"] == "1.mlp")].set_index("alpha")
    assert only.loc[0.0, "d_general_loss"] == pytest.approx(0.0, abs=1e-6)       # θ0 + 0·τk = θ0
    loo = f[(f["map"] == "leave_one_out") & (f["key"] == "1.mlp")].set_index("alpha")
    assert loo.loc[1.0, "d_general_loss"] == pytest.approx(0.0, abs=1e-6)        # θ0 + τ = θ1
    h = f[f["key"] == "0.attn.h1"].iloc[0]
    assert h["module"] == "attn" and h["head"] == 1 and h["layer"] == 0


def test_head_writes_touch_only_the_heads_slices(edited):
    from forgetlab.core.anatomy import Anatomy
    from forgetlab.merge.working_copy import WorkingCopy

    work = WorkingCopy.load(edited, "two")
    anat = Anatomy.from_config(edited.config, names=work.names)
    parts = A.parts_of(anat, work.names, "head")
    writer = A._Writer(work, parts)
    writer.write({"0.attn.h1": 1.0}, focus="0.attn.h1", rest=0.0)
    q = "model.layers.0.self_attn.q_proj.weight"
    w0, w1 = work.base[q], work.tuned[q]
    got = work.params[q].detach()
    d = anat.head_dim
    assert torch.equal(got[d:2 * d], w1[d:2 * d])
    assert torch.equal(got[:d], w0[:d]) and torch.equal(got[2 * d:], w0[2 * d:])
    o = "model.layers.0.self_attn.o_proj.weight"
    assert torch.equal(work.params[o].detach()[:, d:2 * d], work.tuned[o][:, d:2 * d])
    assert torch.equal(work.params[o].detach()[:, :d], work.base[o][:, :d])
    m = "model.layers.1.mlp.up_proj.weight"
    assert torch.equal(work.params[m].detach(), work.base[m])
    n_before = writer.written
    writer.write({"0.attn.h1": 1.0}, focus="0.attn.h1", rest=0.0)
    assert writer.written == n_before             # nothing changed, nothing rewritten


def _card(gl, em, al):
    return Scorecard(model="m", general_loss=gl, perplexity=math.exp(gl), general_tokens=10,
                     tasks={"t": TaskScore("t", em, al, 4)})


def test_additivity_hand_case():
    rows = []
    for m, key, d in (("only_this", "a", (0.2, 0.25, -0.5)), ("only_this", "b", (0.3, 0.25, -0.5)),
                      ("leave_one_out", "a", (-0.1, 0.0, 0.2)), ("leave_one_out", "b", (-0.2, -0.5, 0.2))):
        rows.append(A.AttributionRow(map=m, key=key, layer=0, module="mlp", head=None,
                                     alpha=1.0 if m == "only_this" else 0.0, general_loss=0, speciality=0,
                                     answer_loss=0, d_general_loss=d[0], d_speciality=d[1], d_answer_loss=d[2],
                                     tau_norm=1.0, tau_share=0.5))
    r = A.AttributionResult(model="m", task="t", level="module", base=_card(2.0, 0.0, 3.0),
                            finetuned=_card(2.5, 0.5, 2.0), rows=rows)
    add = r.additivity().set_index(["map", "measure"])
    assert add.loc[("only_this", "general_loss"), "sum_of_parts"] == pytest.approx(0.5)
    assert add.loc[("only_this", "general_loss"), "ratio"] == pytest.approx(1.0)
    assert add.loc[("only_this", "answer_loss"), "ratio"] == pytest.approx(1.0)      # −1 / −1
    assert add.loc[("leave_one_out", "general_loss"), "whole"] == pytest.approx(-0.5)
    assert add.loc[("leave_one_out", "general_loss"), "ratio"] == pytest.approx(0.6)
    assert add.loc[("leave_one_out", "speciality"), "ratio"] == pytest.approx(1.0)
    assert add.loc[("leave_one_out", "answer_loss"), "ratio"] == pytest.approx(0.4)


@pytest.mark.parametrize("settings, error, words", [
    (dict(level="attn"), ParameterError, "module"),
    (dict(level="neuron"), ParameterError, "layer, module, head"),
    (dict(task="nope"), ProbeDataError, "no probe data"),
    (dict(select=[]), ParameterError, "empty"),
    (dict(alphas=[]), ParameterError, "empty"),
    (dict(alphas=[1.5]), ParameterError, "[0, 1]"),
])
def test_bad_settings_fail_before_loading(edited, settings, error, words):
    with pytest.raises(error, match=None) as exc:
        A.check(edited, "one-mlp", **{"task": "math", **settings})
    assert words in str(exc.value)
    with pytest.raises(error):
        A.attribute(edited, "one-mlp", **{"task": "math", **settings})


def test_zero_task_vector_and_unknown_keys(edited):
    with pytest.raises(ParameterError, match="no task vector"):
        A.attribute(edited, "same", task="math", **LIMITS)
    with pytest.raises(ParameterError, match="zero on every selected"):
        A.attribute(edited, "one-mlp", task="math", select=["0.attn", "embed"], **LIMITS)
    with pytest.raises(ParameterError, match="1.mlp"):
        A.attribute(edited, "one-mlp", task="math", level="module", select=["7.mlp"], **LIMITS)
    with pytest.raises(ForgetlabError, match="no fine-tuned model"):
        A.check(edited, "ghost", task="math")


def test_cli_writes_map_saves_run_and_reopens(edited, tmp_path, monkeypatch, capsys):
    from forgetlab.cli import main
    from forgetlab.core.workspace import list_runs

    monkeypatch.setenv("FORGETLAB_HOME", str(tmp_path / "home"))
    out = tmp_path / "map.csv"
    code = main(["attribution", str(edited.source), "--model", "two", "--task", "math", "--level", "layer",
                 "--max-general", "2", "--max-task", "4", "--batch-size", "8", "--device", "cpu", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "additivity" in text and "saved" in text
    frame = pd.read_csv(out)
    for col in ("map", "layer", "module", "head", "d_general_loss", "d_speciality", "d_answer_loss"):
        assert col in frame.columns
    assert set(frame["map"]) == {"only_this", "leave_one_out"}
    runs = list_runs(tmp_path / "home", kind="attribution")
    assert len(runs) == 1
    back = A.ANALYSIS.load(runs[0].path)
    pd.testing.assert_frame_equal(back.to_frame().astype({"layer": float, "head": float}), frame, check_dtype=False)
    assert back.level == "layer" and back.evaluations > 0 and back.seconds > 0
    from forgetlab.ui.runs import run_figures      # the Runs page redraws the map with the page's charts

    figs = run_figures(runs[0], "exact_match")
    assert [f.data[0].type for f in figs] == ["heatmap", "heatmap", "scatter"]
    # bad input: exit 2, nothing saved; an existing --out is refused without --overwrite
    assert main(["attribution", str(edited.source), "--model", "two", "--level", "attn"]) == 2
    assert main(["attribution", str(edited.source), "--model", "same", "--task", "math",
                 "--max-general", "1", "--max-task", "1"]) == 2
    assert len(list_runs(tmp_path / "home", kind="attribution")) == 1
    assert main(["attribution", str(edited.source), "--model", "two", "--task", "math", "--out", str(out)]) == 2
    assert "overwrite" in capsys.readouterr().err
    assert len(list_runs(tmp_path / "home", kind="attribution")) == 1


def test_recipe_from_map_merges_the_chosen_submodules(edited, tmp_path):
    from forgetlab.core.checkpoints import open_checkpoint
    from forgetlab.merge import run

    recipe = A.recipe_from_map(edited, "two", ["1.mlp"])
    assert recipe.method == "submodule_alpha" and recipe.params["alphas"] == "1.mlp=1"
    run(recipe, tmp_path / "merged")
    merged, base, two = (open_checkpoint(p) for p in (tmp_path / "merged", edited.checkpoint("base").path,
                                                      edited.checkpoint("two").path))
    for name in merged.names():
        want = two if name.startswith("model.layers.1.mlp.") else base
        assert torch.equal(merged.read(name), want.read(name)), name
    half = A.recipe_from_map(edited, "two", {"0": 0.5}, default=1.0)
    run(half, tmp_path / "half")
    m = open_checkpoint(tmp_path / "half")
    q = "model.layers.0.self_attn.q_proj.weight"
    assert torch.allclose(m.read(q), 0.5 * (base.read(q) + two.read(q)), atol=1e-6)
    assert torch.equal(m.read("model.layers.1.mlp.up_proj.weight"), two.read("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ParameterError, match="head"):
        A.recipe_from_map(edited, "two", ["0.attn.h1"])
    with pytest.raises(ParameterError, match="No submodule"):
        A.recipe_from_map(edited, "two", [])


def test_submodule_alpha_keys():
    from forgetlab.merge.methods.submodule import alpha_of, parse_alphas

    a = parse_alphas("3.mlp=1, 3=0.5 embed=0.25 lm_head=0")
    assert alpha_of("model.layers.3.mlp.up_proj.weight", 3, a, 0.0) == 1.0
    assert alpha_of("model.layers.3.self_attn.q_proj.weight", 3, a, 0.0) == 0.5
    assert alpha_of("model.layers.2.self_attn.q_proj.weight", 2, a, 0.75) == 0.75
    assert alpha_of("model.embed_tokens.weight", "first", a, 1.0) == 0.25
    assert alpha_of("lm_head.weight", "last", a, 1.0) == 0.0
    assert alpha_of("model.norm.weight", "last", a, 1.0) == 1.0
    assert alpha_of("transformer.h.0.attn.c_attn.weight", 0, parse_alphas("0.attn=0.3"), 1.0) == 0.3
    assert alpha_of("transformer.h.0.ln_1.weight", 0, parse_alphas("0.norm=0.3"), 1.0) == 0.3
    for bad in ("3.mlp", "3.ffn=1", "x=1", "3=2"):
        with pytest.raises(ParameterError):
            parse_alphas(bad)
