"""The training loop (forgetlab.train.trainer): determinism, loss, schedule, SFA, L1/L2-to-init, NaN guard."""
from __future__ import annotations

import math

import pytest
import torch

from forgetlab.core.data import EncodedExample
from forgetlab.core.errors import ParameterError, TrainingError
from forgetlab.train.trainer import add_penalty_grad_, causal_lm_loss, lr_factor, sfa_interval, train


def _model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    return LlamaForCausalLM(cfg)


def _examples(n: int = 24, seed: int = 0):
    """prompt "1 a 2" → answer "a+10 a+20" (labels only on the answer), all of length 5."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        a = int(torch.randint(3, 10, (1,), generator=g))
        out.append(EncodedExample([1, a, 2, a + 10, a + 20], [-100, -100, -100, a + 10, a + 20]))
    return out


def _weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_deterministic_for_a_seed_and_learns():
    ex = _examples()
    a, b, c = _model(), _model(), _model()
    ra = train(a, ex, steps=40, lr=1e-2, seed=3)
    rb = train(b, ex, steps=40, lr=1e-2, seed=3)
    train(c, ex, steps=40, lr=1e-2, seed=4)
    wa, wb, wc = _weights(a), _weights(b), _weights(c)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)
    assert not all(torch.equal(wa[n], wc[n]) for n in wa)
    assert ra.losses == rb.losses and len(ra.losses) == 40
    assert sum(ra.losses[-5:]) / 5 < 0.5 * sum(ra.losses[:5]) / 5


def test_loss_is_hf_causal_lm_loss_on_labelled_tokens():
    model = _model()
    from forgetlab.core.data import collate

    batch = collate(_examples(4), 0)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    ref = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
    torch.testing.assert_close(causal_lm_loss(logits, batch["labels"]), ref)


def test_schedule_values():
    assert lr_factor(0, 10, warmup=2) == 0.5
    assert lr_factor(1, 10, warmup=2) == 1.0
    assert lr_factor(2, 10, warmup=2) == 1.0
    assert lr_factor(6, 10, warmup=2) == pytest.approx(0.5)
    assert lr_factor(9, 10, warmup=0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.9)))
    assert lr_factor(7, 10, schedule="constant") == 1.0
    model = _model()
    res = train(model, _examples(), steps=10, warmup=2, lr=1e-3)
    assert res.lrs[0] == pytest.approx(5e-4) and res.lrs[6] == pytest.approx(5e-4)


def test_sfa_p1_equals_wise_ft_of_plain_run():
    ex = _examples()
    plain, sfa, ref = _model(), _model(), _model()
    beta = 0.3
    train(plain, ex, steps=12, lr=1e-2, seed=1)
    res = train(sfa, ex, steps=12, lr=1e-2, seed=1, sfa_p=1.0, sfa_beta=beta)
    assert res.averaged_at == [12]
    w_plain, w_sfa, w0 = _weights(plain), _weights(sfa), _weights(ref)
    for n in w0:
        torch.testing.assert_close(w_sfa[n], (1 - beta) * w_plain[n] + beta * w0[n], rtol=1e-5, atol=1e-6)


def test_sfa_averages_every_ceil_pT_steps_and_stays_closer():
    ex = _examples()
    assert sfa_interval(10, 0.25) == 3 and sfa_interval(12, 0.25) == 3 and sfa_interval(5, 1.0) == 5
    plain, sfa = _model(), _model()
    rp = train(plain, ex, steps=10, lr=1e-2, seed=1, eval_every=10)
    rs = train(sfa, ex, steps=10, lr=1e-2, seed=1, sfa_p=0.25, eval_every=10)
    assert rs.averaged_at == [3, 6, 9, 10]
    assert rs.history[-1]["distance"] < rp.history[-1]["distance"]


def test_sfa_schedule_of_the_default_comparison_by_hand():
    """docs/methods.md#sfa on the demo zoo's recipe (T = 150, p = 0.25, warm-up 10): P = ⌈37.5⌉ = 38, so the
    averagings come after steps 38, 76 and 114 and after the last step, 150 — 1/p = 4 of them, the last with no
    step left; the steps after the third one run at ≤ 15.4 % of the peak rate (½·(1 + cos(π·104/140)))."""
    assert sfa_interval(150, 0.25) == 38 and sfa_interval(100, 0.25) == 25
    res = train(_model(), _examples(), steps=150, lr=1e-3, warmup=10, seed=0, sfa_p=0.25, sfa_beta=0.5)
    assert res.averaged_at == [38, 76, 114, 150]
    assert res.lrs[114] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 104 / 140))) and res.lrs[114] < 1.55e-4


def test_l2_zero_equals_plain_and_l2_pulls_to_init():
    ex = _examples()
    a, b, c = _model(), _model(), _model()
    ra = train(a, ex, steps=15, lr=1e-2, seed=2, eval_every=15)
    train(b, ex, steps=15, lr=1e-2, seed=2, l2=0.0, eval_every=15)
    rc = train(c, ex, steps=15, lr=1e-2, seed=2, l2=50.0, eval_every=15)
    wa, wb, wc = _weights(a), _weights(b), _weights(c)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)
    assert not all(torch.equal(wa[n], wc[n]) for n in wa)
    assert rc.history[-1]["distance"] < ra.history[-1]["distance"]
    assert rc.penalties[-1] > 0 and ra.penalties[-1] == 0


def test_penalty_gradient_matches_autograd():
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(5, 4, generator=g, requires_grad=True)
    theta0 = torch.randn(5, 4, generator=g)
    l1, l2 = 0.3, 0.7
    value = l1 * (theta - theta0).abs().sum() + 0.5 * l2 * (theta - theta0).pow(2).sum()
    (ref,) = torch.autograd.grad(value, theta)
    theta.grad = None
    got = add_penalty_grad_([theta], [theta0], l1, l2)
    torch.testing.assert_close(theta.grad, ref)
    assert got == pytest.approx(float(value.detach()), rel=1e-6)


def test_history_and_eval_fn():
    calls = []
    res = train(_model(), _examples(), steps=10, lr=1e-3, eval_every=5,
                eval_fn=lambda m, s: (calls.append((s, m.training)), {"score": float(s)})[1])
    assert [h["step"] for h in res.history] == [0, 5, 10]
    assert calls == [(0, False), (5, False), (10, False)]
    assert res.history[0]["distance"] == 0.0 and res.history[-1]["distance"] > 0
    frame = res.to_frame()
    assert list(frame["step"]) == list(range(11))
    assert frame.loc[frame.step == 5, "score"].item() == 5.0


def test_mofo_through_the_trainer_moves_fewer_entries():
    ex = _examples()
    a, b, ref = _model(), _model(), _model()
    train(a, ex, steps=3, lr=1e-2, optimizer="mofo", fraction=0.1, clip=None)
    train(b, ex, steps=3, lr=1e-2, optimizer="adamw", clip=None)
    name = "model.layers.1.mlp.down_proj.weight"
    w0 = _weights(ref)[name]
    assert (_weights(a)[name] != w0).float().mean() <= 0.3 + 1e-9
    assert (_weights(b)[name] != w0).float().mean() > 0.9


def test_nan_loss_stops_and_restores_last_good_weights():
    ex = _examples()
    model = _model()
    calls = [0]

    def poison(module, inputs, output):
        calls[0] += 1
        if calls[0] == 3:  # the third forward pass (step 3) returns NaN logits
            output.logits = output.logits * float("nan")
        return output

    model.register_forward_hook(poison)
    with pytest.raises(TrainingError, match="NaN.*step 3.*restored") as info:
        train(model, ex, steps=10, lr=1e-2, seed=5, schedule="constant", rollback=True)
    assert info.value.result.completed_steps == 2
    assert len(info.value.result.losses) == 2
    # the last weights with a finite loss are those after step 1 (they gave step 2 its finite loss)
    one = _model()
    train(one, ex, steps=1, lr=1e-2, seed=5, schedule="constant")
    wm, wo = _weights(model), _weights(one)
    assert all(torch.equal(wm[n], wo[n]) for n in wm)
    assert all(torch.isfinite(p).all() for p in wm.values())


def test_nan_loss_without_rollback_keeps_the_last_completed_step_and_no_copy(monkeypatch):
    """By default no full copy is kept: the error says the model holds the weights after the last step."""
    ex = _examples()
    model = _model()
    calls = [0]

    def poison(module, inputs, output):
        calls[0] += 1
        if calls[0] == 3:
            output.logits = output.logits * float("nan")
        return output

    model.register_forward_hook(poison)
    clones = [0]
    real_clone = torch.Tensor.clone

    def counting_clone(self, *a, **k):
        clones[0] += 1
        return real_clone(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "clone", counting_clone)
    with pytest.raises(TrainingError, match="NaN.*step 3.*holds the weights after step 2") as info:
        train(model, ex, steps=10, lr=1e-2, seed=5, schedule="constant", record_distance=False)
    monkeypatch.undo()
    assert clones[0] == 0                       # neither θo nor a rollback copy was made
    assert info.value.result.completed_steps == 2
    two = _model()
    train(two, ex, steps=2, lr=1e-2, seed=5, schedule="constant")
    wm, wt = _weights(model), _weights(two)
    assert all(torch.equal(wm[n], wt[n]) for n in wm)


def test_distance_fn_replaces_the_copy_of_the_start():
    ex = _examples()
    a, b = _model(), _model()
    ra = train(a, ex, steps=4, lr=1e-2, seed=1, eval_every=2)
    seen = []
    rb = train(b, ex, steps=4, lr=1e-2, seed=1, eval_every=2, distance_fn=lambda: (seen.append(1), 0.5)[1])
    assert [h["distance"] for h in rb.history] == [0.5, 0.5, 0.5] and len(seen) == 3
    assert ra.history[-1]["distance"] > 0
    wa, wb = _weights(a), _weights(b)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)


def test_bad_input():
    with pytest.raises(TrainingError, match="No training data"):
        train(_model(), [], steps=5)
    with pytest.raises(TrainingError, match="-100"):
        train(_model(), [EncodedExample([1, 2, 3], [-100, -100, -100])], steps=5)
    with pytest.raises(ParameterError, match="optimizer"):
        train(_model(), _examples(), steps=1, optimizer="adagrad")
    with pytest.raises(ParameterError, match="steps"):
        train(_model(), _examples(), steps=0)
    with pytest.raises(ParameterError, match="sfa_p"):
        train(_model(), _examples(), steps=2, sfa_p=0.0)


def test_grads_finite_checks_every_piece_without_a_float64_copy():
    from forgetlab.train.trainer import grads_finite

    params = [torch.nn.Parameter(torch.zeros(n)) for n in (10, 2500, 3)]
    params[0].grad = torch.full((10,), 3e38)          # finite, and its float64 square sum is finite too
    params[1].grad = torch.ones(2500)
    assert grads_finite(params, piece=1000)           # the third has no gradient: skipped
    for bad in (float("nan"), float("inf"), -float("inf")):
        params[1].grad[2345] = bad                    # in the last piece of the second tensor
        assert not grads_finite(params, piece=1000)
        params[1].grad[2345] = 1.0
    half = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    half.grad = torch.tensor([1.0, float("nan"), 0.0], dtype=torch.bfloat16)
    assert not grads_finite([*params, half])
