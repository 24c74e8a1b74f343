"""Forgetting sweeps (forgetlab.analysis.sweeps): endpoints, in-place working copy, Pareto front, save/reopen, bad input."""
from __future__ import annotations


import pytest
import torch

from forgetlab.analysis.measures import pareto_front, pareto_mask
from forgetlab.analysis.sweep_results import SweepResult
from forgetlab.analysis.sweeps import (_hma, _pruned, alpha_curve, density_curve, hma_grid, load_sweep, pruning_curve,
                                       save_sweep)
from forgetlab.core.errors import ForgetlabError, ParameterError
from forgetlab.core.evaluate import evaluate
from forgetlab.core.pool import ModelPool
from forgetlab.merge.working_copy import WorkingCopy


def _card(pool, name):
    return evaluate(pool.load(name, device="cpu"), pool.tokenizer, pool.probes, name=name)


def _same(card_a, card_b):
    assert card_a.general_loss == card_b.general_loss
    assert card_a.tasks.keys() == card_b.tasks.keys()
    for t in card_a.tasks:
        assert card_a.tasks[t].exact_match == card_b.tasks[t].exact_match
        assert card_a.tasks[t].answer_loss == card_b.tasks[t].answer_loss


def test_alpha_curve_endpoints_and_live_points(pool):
    seen = []
    res = alpha_curve(pool, "ft0", alphas=[0.0, 0.5, 1.0], device="cpu",
                      on_point=lambda p, r: seen.append((p.x, len(r.points))))
    assert [p.x for p in res.points] == [0.0, 0.5, 1.0]
    assert seen == [(0.0, 1), (0.5, 2), (1.0, 3)]          # reported while the sweep ran
    _same(res.points[0].scorecard, _card(pool, "base"))
    _same(res.points[-1].scorecard, _card(pool, "ft0"))
    assert res.points[0].distance == 0.0
    from forgetlab.core.taskvectors import checkpoint_distance
    assert res.points[-1].distance == pytest.approx(checkpoint_distance(pool, "ft0"), rel=1e-5)
    # D grows linearly in α for WiSE-FT: D(θ(α), θ0) = α·D(θ1, θ0)
    assert res.points[1].distance == pytest.approx(0.5 * res.points[-1].distance, rel=1e-4)
    frame = res.to_frame()
    assert list(frame["alpha"]) == [0.0, 0.5, 1.0]
    assert {"speciality", "general_loss", "distance", "pareto", "math/exact_match"} <= set(frame.columns)


def test_sweep_leaves_pool_models_untouched(pool):
    base = pool.load("base", device="cpu")
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    alpha_curve(pool, "ft1", alphas=[0.3], device="cpu", max_general=2, max_task=2)
    for n, p in base.named_parameters():
        assert torch.equal(p, before[n]), n


def test_working_copy_writes_in_place(pool):
    work = WorkingCopy.load(pool, "ft0", device="cpu")
    ids = {n: id(p) for n, p in work.model.named_parameters()}
    work.set(lambda name, w0, w1: 0.25 * w0 + 0.75 * w1, [work.tuned])
    name = "model.layers.0.mlp.up_proj.weight"
    w0, w1 = pool.base.read(name), pool.checkpoint("ft0").read(name)
    torch.testing.assert_close(work.params[name].detach(), 0.25 * w0 + 0.75 * w1)
    assert {n: id(p) for n, p in work.model.named_parameters()} == ids   # same tensors, rewritten


def test_pruning_ratio_zero_and_one(pool):
    res = pruning_curve(pool, "ft0", ratios=[0.0, 0.5, 1.0], scores=["fapm", "magnitude"], device="cpu")
    assert res.series == ["fapm", "magnitude"]
    by = {(p.series, p.x): p for p in res.points}
    ft, base = _card(pool, "ft0"), _card(pool, "base")
    for s in ("fapm", "magnitude"):
        _same(by[(s, 0.0)].scorecard, ft)
        _same(by[(s, 1.0)].scorecard, base)
    assert by[("fapm", 0.5)].distance < by[("fapm", 0.0)].distance
    assert by[("fapm", 1.0)].distance == 0.0


def test_pruned_weights_keep_the_top_scores():
    w0 = torch.tensor([1.0, 2.0, -1.0, 4.0, 0.5, 3.0, 1.0, 2.0])
    tau = torch.tensor([0.1, -0.5, 0.2, 0.4, 0.05, -0.3, 0.6, 0.0])
    w1 = w0 + tau
    out = _pruned(0.5, "magnitude")("x", w0, w1, owned=False)
    kept = out != w0
    # the 4 largest |τ|: 0.6, -0.5, 0.4, -0.3
    assert kept.tolist() == [False, True, False, True, False, True, True, False]
    torch.testing.assert_close(out[kept], w1[kept], rtol=0, atol=1e-6)     # θ0 + τ where kept


def test_density_endpoints_shared_and_order(pool):
    res = density_curve(pool, "ft0", drops=[0.0, 0.9], keeps=[1.0, 0.2], device="cpu", max_task=4)
    assert [(p.series, p.x) for p in res.points] == [("dare", 1.0), ("dare", pytest.approx(0.1)),
                                                      ("ties", 1.0), ("ties", 0.2)]
    _same(res.points[0].scorecard, res.points[2].scorecard)
    assert res.points[0].distance == res.points[2].distance
    # DARE rescales the survivors, TIES does not: at comparable density DARE moves further from θ0
    assert res.points[1].distance > res.points[3].distance


def test_hma_grid_uniform_tuples_are_wise_ft(pool):
    res = hma_grid(pool, "ft0", grid=[(0, 0), (1, 1)], device="cpu")  # the tiny Llama has 2 layers: ≤ 2 blocks
    _same(res.points[0].scorecard, _card(pool, "base"))
    _same(res.points[1].scorecard, _card(pool, "ft0"))
    fn = _hma([0.0, 0.5], pool.config, pool.base.names())
    w0, w1 = torch.zeros(3), torch.ones(3)
    assert fn("model.embed_tokens.weight", w0, w1).tolist() == [0.0] * 3     # first block's α
    assert fn("lm_head.weight", w0, w1).tolist() == [0.5] * 3                # last block's α (untied)
    assert fn("model.norm.weight", w0, w1).tolist() == [0.5] * 3
    assert fn("model.layers.1.mlp.up_proj.weight", w0, w1).tolist() == [0.5] * 3
    assert fn("model.layers.0.mlp.up_proj.weight", w0, w1).tolist() == [0.0] * 3
    with pytest.raises(ParameterError, match="HMA got 3 α values but the model has 2 decoder layers"):
        hma_grid(pool, "ft0", grid=[(0.1, 0.2, 0.3)], device="cpu")


def test_pareto_front_hand_made():
    pts = [(0.9, 3.0), (0.5, 2.0), (0.8, 3.5), (0.5, 2.5), (0.95, 3.0), (float("nan"), 1.0), (0.7, 2.2),
           (0.5, 2.0)]
    assert pareto_mask([p[0] for p in pts], [p[1] for p in pts]) == [
        False, True, False, False, True, False, True, True]
    assert pareto_front(pts) == pareto_mask([p[0] for p in pts], [p[1] for p in pts])


def test_save_and_reopen(pool, tmp_path):
    res = alpha_curve(pool, "ft0", alphas=[0.0, 1.0], device="cpu", max_general=2, max_task=2)
    path = save_sweep(res, home_path=tmp_path)
    assert path.parent == tmp_path / "runs"
    back = load_sweep(path)
    assert isinstance(back, SweepResult)
    assert back.to_frame().drop(columns=["settings"]).equals(res.to_frame().drop(columns=["settings"]))
    assert [p.pareto for p in back.points] == [p.pareto for p in res.points]


def test_bad_input(pool):
    with pytest.raises(ParameterError, match="empty"):
        alpha_curve(pool, "ft0", alphas=[])
    with pytest.raises(ParameterError, match=r"\[0, 1\]"):
        alpha_curve(pool, "ft0", alphas=[0.0, 1.5])
    with pytest.raises(ParameterError, match=r"\[0, 1\]"):
        pruning_curve(pool, "ft0", ratios=[-0.1])
    with pytest.raises(ForgetlabError, match="no fine-tuned model 'nope'.*ft0"):
        alpha_curve(pool, "nope", alphas=[0.5])
    with pytest.raises(ParameterError, match="base"):
        alpha_curve(pool, "base", alphas=[0.5])
    with pytest.raises(ParameterError, match="score"):
        pruning_curve(pool, "ft0", scores=["random"])
    with pytest.raises(ParameterError, match="same number"):
        hma_grid(pool, "ft0", grid=[(0.1,), (0.1, 0.2)])


def test_gpt2_pool_with_tied_embeddings(tiny_gpt2):
    gpool = ModelPool.from_yaml(tiny_gpt2.pool_yaml)
    res = alpha_curve(gpool, "ft1", alphas=[0.0, 1.0], device="cpu", max_general=2, max_task=3)
    _same(res.points[0].scorecard, evaluate(gpool.load("base", device="cpu"), gpool.tokenizer, gpool.probes,
                                            max_general=2, max_task=3))
    _same(res.points[1].scorecard, evaluate(gpool.load("ft1", device="cpu"), gpool.tokenizer, gpool.probes,
                                            max_general=2, max_task=3))
    res = pruning_curve(gpool, "ft1", ratios=[0.0, 0.9, 1.0], scores=["fapm"], device="cpu", max_general=2,
                        max_task=3)
    assert res.points[0].distance > res.points[1].distance > res.points[2].distance == 0.0


@pytest.mark.parametrize("alpha", [0.3, 0.7])
def test_a_wise_ft_sweep_point_has_exactly_the_weights_of_forgetlab_merge_wise_ft(pool, tmp_path, monkeypatch, alpha):
    """One home per formula: the α-sweep builds its weights with the merge registry's `wise_ft`, so its point at α
    and `forgetlab merge` with wise_ft at α are the same model bit for bit."""
    import yaml
    from safetensors.torch import load_file

    from forgetlab.analysis import sweeps
    from forgetlab.cli import main

    swept = {}
    real = sweeps.evaluate

    def spy(model, *args, **kw):
        swept.update({n: p.detach().clone() for n, p in model.named_parameters()})
        return real(model, *args, **kw)

    monkeypatch.setattr(sweeps, "evaluate", spy)
    alpha_curve(pool, "ft0", alphas=[alpha], device="cpu", max_general=1, max_task=1)
    recipe = tmp_path / "wise.yaml"
    recipe.write_text(yaml.safe_dump({"method": "wise_ft", "base": str(pool.base_ref),
                                      "models": [str(pool.entries["ft0"].ref)], "params": {"alpha": alpha}}))
    assert main(["merge", str(recipe), str(tmp_path / "merged")]) == 0
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    assert swept and set(swept) <= set(merged)
    for name, t in swept.items():
        assert torch.equal(t, merged[name]), name
    # and not trivially: the point lies strictly between the base and the fine-tune
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(swept[name], pool.base.read(name))
