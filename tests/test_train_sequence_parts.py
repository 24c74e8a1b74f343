"""The training pieces of a sequence of tasks (issue 44): EWC's Fisher and penalty (docs/methods.md#ewc), a given
anchor for the L1/L2 penalties (#l2-to-init) and HFT's frozen half (#hft), each through `trainer.train`."""
from __future__ import annotations

import collections.abc

import pytest
import torch

from forgetlab.core.data import EncodedExample, collate
from forgetlab.core.errors import ParameterError
from forgetlab.train.ewc import EwcPenalty, diagonal_fisher
from forgetlab.train.hft import block_matrices, hft_frozen
from forgetlab.train.results import FinetuneConfig
from forgetlab.train.trainer import causal_lm_loss, train
from tests.test_train import _examples, _weights


def _model(seed: int = 0, layers: int = 2, dropout: float = 0.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                      attention_dropout=dropout)
    return LlamaForCausalLM(cfg)


def _same(wa, wb) -> bool:
    return all(torch.equal(wa[n], wb[n]) for n in wa)


# ------------------------------------------------------------------------------------------------ EWC


@pytest.mark.parametrize("chunk_bytes", [None, 1])
def test_fisher_equals_an_independent_per_example_computation(monkeypatch, chunk_bytes):
    """Each example's own loss (transformers' `labels=` loss) back-propagated on a copy of the model in eval mode,
    the gradients squared and averaged; the example without an answer token is left out of N; a frozen tensor
    has no Fisher; dropout is off; the model's mode and .grad are left as they were. Both paths: several
    examples at a time (vmap, right-padded, examples of different lengths) and one backward pass per example."""
    import forgetlab.train.ewc as ewc

    def unused(*a, **k):
        raise AssertionError("the other path was taken")

    if chunk_bytes is not None:                            # one backward pass per example, never vmap
        monkeypatch.setattr(ewc, "FISHER_CHUNK_BYTES", chunk_bytes)
        monkeypatch.setattr(ewc, "vmap", unused)
    else:                                                  # the tiny model's chunks all go through vmap
        monkeypatch.setattr(ewc, "_add_squares", unused)
    model = _model(dropout=0.4)
    model.lm_head.weight.requires_grad_(False)
    model.train()
    used = _examples(5, seed=3) + [EncodedExample([1, 7, 7, 2, 17, 27, 4], [-100, -100, -100, -100, 17, 27, 4]),
                                   EncodedExample([1, 2, 12], [-100, -100, 12])]
    examples = used[:3] + [EncodedExample([1, 4, 2, 14, 24], [-100] * 5)] + used[3:]
    fisher = diagonal_fisher(model, examples)
    assert model.training and all(p.grad is None for p in model.parameters())

    ref = _model(dropout=0.4)
    ref.load_state_dict(model.state_dict())
    ref.lm_head.weight.requires_grad_(False)
    ref.eval()
    want = {n: torch.zeros_like(p) for n, p in ref.named_parameters() if p.requires_grad}
    for ex in used:
        ref.zero_grad(set_to_none=True)
        ref(input_ids=torch.tensor([ex.input_ids]), labels=torch.tensor([ex.labels])).loss.backward()
        for n, p in ref.named_parameters():
            if p.requires_grad:
                want[n] += p.grad.pow(2) / len(used)
    assert set(fisher) == set(want) and "lm_head.weight" not in fisher
    for name in want:
        assert fisher[name].dtype == torch.float32
        torch.testing.assert_close(fisher[name], want[name], rtol=1e-4, atol=1e-9)
    assert float(fisher["model.layers.0.mlp.down_proj.weight"].sum()) > 0


def test_ewc_value_and_gradient_equal_the_sum_over_two_tasks():
    """(λ/2)·Σ_k Σ_j F_k (θ − θ*_k)² by autograd on the explicit sum, against add_grad_'s value and the gradient
    it adds (onto an existing gradient, and into a missing one); entries where both Fishers are 0 included."""
    g = torch.Generator().manual_seed(1)
    shapes = {"a": (4, 3), "b": (5,)}
    fishers = [{n: torch.rand(s, generator=g) * (torch.rand(s, generator=g) > 0.3) for n, s in shapes.items()}
               for _ in range(2)]
    fishers[0]["a"][0, 0] = fishers[1]["a"][0, 0] = 0.0
    stars = [{n: torch.randn(s, generator=g) for n, s in shapes.items()} for _ in range(2)]
    theta = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    lam = 2.5

    ref = {n: t.double().requires_grad_(True) for n, t in theta.items()}
    value = 0.5 * lam * sum((f[n].double() * (ref[n] - s[n].double()).pow(2)).sum()
                            for f, s in zip(fishers, stars) for n in shapes)
    value.backward()

    pen = EwcPenalty(lam)
    for f, s in zip(fishers, stars):
        pen.add_task(f, s)
    assert pen.tasks == 2
    torch.testing.assert_close(pen.fisher_sum["a"], fishers[0]["a"] + fishers[1]["a"])     # A
    torch.testing.assert_close(pen.fisher_sum["b"] * pen.center["b"],                      # B = A·μ
                               fishers[0]["b"] * stars[0]["b"] + fishers[1]["b"] * stars[1]["b"])
    params = {n: torch.nn.Parameter(t.clone()) for n, t in theta.items()}
    start = torch.randn(shapes["a"], generator=g)
    params["a"].grad = start.clone()
    got = pen.add_grad_(list(params.items()))
    assert got == pytest.approx(float(value.detach()), rel=1e-5)
    torch.testing.assert_close(params["a"].grad.double(), start.double() + ref["a"].grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(params["b"].grad.double(), ref["b"].grad, rtol=1e-5, atol=1e-6)


def test_ewc_off_leaves_gradients_untouched_and_refuses_bad_input():
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 0.5)
    before = p.grad
    assert EwcPenalty(3.0).add_grad_([("w", p)]) == 0.0                  # no task yet
    off = EwcPenalty(0.0)
    off.add_task({"w": torch.ones(3)}, {"w": torch.zeros(3)})
    assert off.add_grad_([("w", p)]) == 0.0
    assert p.grad is before and torch.equal(p.grad, torch.full((3,), 0.5))
    with pytest.raises(ParameterError, match="λ"):
        EwcPenalty(-1.0)
    with pytest.raises(ParameterError, match="missing"):
        EwcPenalty(1.0).add_task({"w": torch.ones(3)}, {})
    on = EwcPenalty(1.0)
    on.add_task({"w": torch.ones(3)}, {"w": torch.zeros(3)})
    with pytest.raises(ParameterError, match="another model"):
        on.add_grad_([("v", p)])


def test_ewc_in_train_lambda_zero_is_the_plain_run_and_lambda_pulls_to_the_finished_task():
    ex_a, ex_b = _examples(seed=0), [EncodedExample([1, e.input_ids[1], 3, 5, 6], [-100, -100, -100, 5, 6])
                                     for e in _examples(seed=1)]
    first = _model()
    train(first, ex_a, steps=10, lr=1e-2, seed=1)
    star = _weights(first)
    fisher = diagonal_fisher(first, ex_a)

    def second(ewc):
        m = _model()
        m.load_state_dict(star)
        return m, train(m, ex_b, steps=10, lr=1e-2, seed=2, ewc=ewc)

    plain, rp = second(None)
    zero = EwcPenalty(0.0)
    zero.add_task(fisher, star)
    same, rz = second(zero)
    assert _same(_weights(plain), _weights(same)) and rz.penalties == rp.penalties
    assert (rz.settings["ewc_lambda"], rz.settings["ewc_tasks"]) == (0.0, 1)
    none_yet, _ = second(EwcPenalty(1e4))
    assert _same(_weights(plain), _weights(none_yet))

    strong = EwcPenalty(1e4)
    strong.add_task(fisher, star)
    pulled, rs = second(strong)
    assert rs.penalties[0] == 0.0 and rs.penalties[-1] > 0        # step 1 starts at θ*: nothing to pay yet

    def fisher_gap(m):
        w = _weights(m)
        return sum(float((fisher[n] * (w[n] - star[n]).pow(2)).sum()) for n in fisher)

    assert fisher_gap(pulled) < 0.5 * fisher_gap(plain)


# ----------------------------------------------------------------------------------- a given anchor


def test_l2_with_the_start_as_anchor_is_bit_identical_to_no_anchor():
    ex = _examples()
    a, b = _model(), _model()
    ra = train(a, ex, steps=8, lr=1e-2, seed=4, l2=5.0, l1=1e-3, eval_every=4)
    rb = train(b, ex, steps=8, lr=1e-2, seed=4, l2=5.0, l1=1e-3, eval_every=4, penalty_anchor=_weights(b))
    assert _same(_weights(a), _weights(b))
    assert ra.penalties == rb.penalties and ra.history == rb.history
    assert rb.settings["penalty_anchor"] and not ra.settings["penalty_anchor"]


class _LazyAnchor(collections.abc.Mapping):
    """An anchor read on demand, in float64 (the trainer casts it), counting its reads."""

    def __init__(self, weights):
        self.weights, self.reads = weights, 0

    def __getitem__(self, name):
        self.reads += 1
        return self.weights[name].double()

    def __iter__(self):
        return iter(self.weights)

    def __len__(self):
        return len(self.weights)


def test_a_given_anchor_adds_l2_times_theta_minus_anchor_one_sgd_step_by_hand(monkeypatch):
    """θ1 = θ0 − lr·(∇loss(θ0) + l2·(θ0 − anchor)) with plain SGD, the anchor another model's weights, read
    lazily in float64 — and no copy of the start is made when the anchor replaces it."""
    ex = _examples(8)
    model, ref = _model(), _model()
    anchor = _LazyAnchor(_weights(_model(seed=1)))
    lr, l2 = 0.1, 3.0
    clones, real_clone = [0], torch.Tensor.clone

    def counting_clone(self, *a, **k):
        clones[0] += 1
        return real_clone(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "clone", counting_clone)
    res = train(model, ex, steps=1, batch_size=8, lr=lr, optimizer="sgd", clip=None, schedule="constant", l2=l2,
                penalty_anchor=anchor, record_distance=False)
    monkeypatch.undo()
    assert clones[0] == 0
    n_params = len(list(model.parameters()))
    assert anchor.reads == n_params

    batch = collate(ex, 0)
    loss = causal_lm_loss(ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                          batch["labels"])
    loss.backward()
    theta0 = _weights(ref)
    want_penalty = 0.0
    for name, p in model.named_parameters():
        diff = theta0[name] - anchor.weights[name]
        torch.testing.assert_close(p.detach(), theta0[name] - lr * (dict(ref.named_parameters())[name].grad
                                                                     + l2 * diff), rtol=1e-5, atol=1e-6)
        want_penalty += 0.5 * l2 * float(diff.double().pow(2).sum())
    assert res.penalties[0] == pytest.approx(want_penalty, rel=1e-6)


def test_an_anchor_that_lacks_a_trained_tensor_is_refused():
    anchor = _weights(_model())
    anchor.pop("lm_head.weight")
    with pytest.raises(ParameterError, match="penalty_anchor lacks 1 .*lm_head.weight"):
        train(_model(), _examples(), steps=1, l2=1.0, penalty_anchor=anchor)


# ------------------------------------------------------------------------------------------------ HFT


def _by_layer(model, names):
    """kind → layer → the matrices (parts) among `names`."""
    found = block_matrices(model)
    return {kind: {layer: {part for part, ps in parts.items() if set(ps) <= set(names)}
                   for layer, parts in layers.items()} for kind, layers in found.items()}


def test_hft_freezes_the_papers_half_of_every_layer():
    """Llama, share ½: 2 of the 4 attention matrices in every layer; 2 of the 3 MLP matrices in half the layers
    and 1 in the other half; never an embedding, a norm or the head; seeded: same seed same half, another seed
    another half."""
    model = _model(layers=4)
    names = hft_frozen(model, 0.5, seed=0)
    chosen = _by_layer(model, names)
    assert [len(chosen["attn"][i]) for i in range(4)] == [2, 2, 2, 2]
    assert sorted(len(chosen["mlp"][i]) for i in range(4)) == [1, 1, 2, 2]
    assert all(".layers." in n and ("self_attn" in n or ".mlp." in n) for n in names)
    assert len(names) == 2 * 4 + 6
    assert hft_frozen(model, 0.5, seed=0) == names
    others = [hft_frozen(model, 0.5, seed=s) for s in range(1, 6)]
    assert all(o != names for o in others) and len({tuple(o) for o in others}) > 1
    assert hft_frozen(model, 0.0, seed=0) == []
    everything = hft_frozen(model, 1.0, seed=0)
    assert len(everything) == 7 * 4
    with pytest.raises(ParameterError, match="hft"):
        hft_frozen(model, 1.5, seed=0)


def test_hft_on_gpt2_takes_each_matrix_with_its_bias_and_qwen3_keeps_its_q_k_norms():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=16, n_layer=3, n_head=2, n_positions=32))
    names = hft_frozen(gpt2, 0.5, seed=0)
    chosen = _by_layer(gpt2, names)
    assert [len(chosen["attn"][i]) for i in range(3)] == [1, 1, 1]
    assert [len(chosen["mlp"][i]) for i in range(3)] == [1, 1, 1]
    assert len(names) == 2 * 6 and all(n.rsplit(".", 1)[0] + ".bias" in names for n in names)

    from transformers import Qwen3Config, Qwen3ForCausalLM

    qwen = Qwen3ForCausalLM(Qwen3Config(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                        max_position_embeddings=32))
    every = hft_frozen(qwen, 1.0, seed=0)
    assert len(every) == 7 * 2 and not any("norm" in n for n in every)


def test_hft_in_train_freezes_its_half_for_the_run_and_restores_it():
    ex = _examples()
    plain, zero, half = _model(), _model(), _model()
    start = _weights(half)
    rp = train(plain, ex, steps=6, lr=1e-2, seed=3)
    train(zero, ex, steps=6, lr=1e-2, seed=3, hft=0.0)
    assert _same(_weights(plain), _weights(zero))
    assert rp.settings["hft"] == 0.0 and rp.settings["hft_frozen"] == 0

    rh = train(half, ex, steps=6, lr=1e-2, seed=3, hft=0.5)
    frozen = hft_frozen(half, 0.5, seed=3)
    after = _weights(half)
    assert rh.settings["hft_frozen"] == len(frozen) > 0 and rh.settings["hft_seed"] == 3
    assert all(torch.equal(after[n], start[n]) for n in frozen)
    moved = [n for n in after if not torch.equal(after[n], start[n])]
    assert set(moved) == set(after) - set(frozen)          # everything else trained, embeddings and norms too
    assert all(p.requires_grad for p in half.parameters())

    other = _model()
    train(other, ex, steps=6, lr=1e-2, seed=3, hft=0.5, hft_seed=11)
    still = {n for n, w in _weights(other).items() if torch.equal(w, start[n])}
    assert still == set(hft_frozen(other, 0.5, seed=11)) != set(frozen)


def test_hft_restores_requires_grad_when_the_run_fails():
    model = _model()
    model.lm_head.weight.requires_grad_(False)             # frozen before the run: stays frozen
    with pytest.raises(ParameterError, match="optimizer"):
        train(model, _examples(), steps=2, hft=0.5, optimizer="adagrad")
    assert [n for n, p in model.named_parameters() if not p.requires_grad] == ["lm_head.weight"]


def test_finetune_config_passes_hft_and_reads_old_saved_configs():
    cfg = FinetuneConfig(label="hft", hft=0.5)
    assert cfg.train_kwargs()["hft"] == 0.5 and "label" not in cfg.train_kwargs()
    old = {k: v for k, v in FinetuneConfig(label="adamw", l2=1.0).to_dict().items() if k != "hft"}
    back = FinetuneConfig.from_dict(old)
    assert back.hft == 0.0 and back.l2 == 1.0 and FinetuneConfig.from_dict(cfg.to_dict()) == cfg
