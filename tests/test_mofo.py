"""MoFO (docs/methods.md#mofo): the filter, the moments, the bias/norm rule, and equality with AdamW at fraction 1."""
from __future__ import annotations

import math

import pytest
import torch

from forgetlab.core.errors import ParameterError
from forgetlab.train.mofo import MoFO, top_fraction_mask, unfiltered_parameters


def _tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=48, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                      attention_bias=True)
    return LlamaForCausalLM(cfg)


def _params():
    g = torch.Generator().manual_seed(1)
    return {
        "layer.weight": torch.nn.Parameter(torch.randn(8, 10, generator=g)),
        "layer.bias": torch.nn.Parameter(torch.randn(8, generator=g)),
        "input_layernorm.weight": torch.nn.Parameter(torch.randn(10, generator=g)),
    }


def test_top_fraction_mask_counts_and_picks_largest():
    scores = torch.tensor([0.5, 3.0, -1.0, 2.0, 0.1, 7.0, 4.0, 0.0, 1.5, 6.0])
    mask = top_fraction_mask(scores, 0.3)
    assert mask.sum() == 3
    assert set(torch.nonzero(mask).flatten().tolist()) == {5, 9, 6}
    # ⌈fraction·n⌉, at least one entry
    assert top_fraction_mask(scores, 0.01).sum() == 1
    assert top_fraction_mask(scores, 0.25).sum() == 3
    assert top_fraction_mask(scores, 1.0).all()


def _tiny_gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=48, n_embd=16, n_layer=2, n_head=2, n_positions=32))


def test_unfiltered_by_module_type_llama_and_gpt2(tiny_gpt2):
    from forgetlab.core.checkpoints import load_model
    from forgetlab.train import MoFO as exported

    assert exported is MoFO  # forgetlab.train exports MoFO
    llama = _tiny_llama(0)
    got = unfiltered_parameters(llama)
    assert got == {n for n in dict(llama.named_parameters()) if "layernorm" in n or n == "model.norm.weight"
                   or n.endswith(".bias")}
    assert "model.layers.0.self_attn.q_proj.bias" in got and "model.embed_tokens.weight" not in got
    gpt2 = load_model(tiny_gpt2.base, device="cpu")  # GPT-2: ln_1, ln_2, ln_f — no "norm" in the names
    names = dict(gpt2.named_parameters())
    want = {n for n in names if ".ln_" in n or n.startswith("transformer.ln_f") or n.endswith(".bias")}
    assert {"transformer.h.0.ln_1.weight", "transformer.h.1.ln_2.weight", "transformer.ln_f.weight",
            "transformer.ln_f.bias", "transformer.h.0.attn.c_attn.bias"} <= want
    assert unfiltered_parameters(gpt2) == want
    assert not any("norm" in n for n in want)  # the old name rule would have filtered every one of them


def test_gpt2_layernorms_get_the_full_adam_step():
    model, ref = _tiny_gpt2(0), _tiny_gpt2(0)
    opt = MoFO(model, lr=1e-2, fraction=0.1)
    ids = torch.randint(0, 48, (2, 10), generator=torch.Generator().manual_seed(2))
    opt.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    moved = {n: (p != dict(ref.named_parameters())[n]) for n, p in model.named_parameters()}
    for n in ("transformer.h.0.ln_1.weight", "transformer.h.1.ln_2.bias", "transformer.ln_f.weight",
              "transformer.h.0.attn.c_attn.bias"):
        p = dict(model.named_parameters())[n]
        # every entry with a moment moves (GPT-2's key bias has a zero gradient where softmax ignores it)
        live = opt.state[p]["exp_avg"] != 0
        assert opt.state[p]["updated"] == p.numel() and bool(moved[n][live].all()) and live.float().mean() > 0.9, n
    for n in ("transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_fc.weight", "transformer.wte.weight"):
        p = dict(model.named_parameters())[n]
        k = math.ceil(0.1 * p.numel())
        assert opt.state[p]["updated"] == k and int(moved[n].sum()) <= k, n


def test_pairs_take_explicit_unfiltered_names_or_default_to_1d_tensors():
    model = _tiny_gpt2(0)
    pairs = list(model.named_parameters())
    opt = MoFO(pairs, unfiltered=unfiltered_parameters(model))
    assert sum(opt.param_groups[0]["unfiltered"]) == len(unfiltered_parameters(model))
    default = MoFO(pairs)
    assert [n for n, f in zip(default.param_groups[0]["names"], default.param_groups[0]["unfiltered"]) if f] == \
        [n for n, _ in pairs if n in unfiltered_parameters(model)]
    with pytest.raises(ParameterError, match="not among the parameters"):
        MoFO(pairs, unfiltered={"nope.weight"})


def test_updates_exactly_top_fraction_by_momentum_and_all_moments():
    params = _params()
    lr, b1, b2, eps, frac = 0.01, 0.9, 0.999, 1e-8, 0.2
    opt = MoFO(list(params.items()), lr=lr, betas=(b1, b2), eps=eps, fraction=frac)
    m = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    v = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    g = torch.Generator().manual_seed(7)
    for t in range(1, 5):
        before = {n: p.detach().clone() for n, p in params.items()}
        grads = {n: torch.randn(p.shape, generator=g) for n, p in params.items()}
        for n, p in params.items():
            p.grad = grads[n].clone()
            m[n] = b1 * m[n] + (1 - b1) * grads[n].double()
            v[n] = b2 * v[n] + (1 - b2) * grads[n].double() ** 2
        opt.step()
        for n, p in params.items():
            st = opt.state[p]
            # m and v are updated for every entry
            torch.testing.assert_close(st["exp_avg"].double(), m[n], rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(st["exp_avg_sq"].double(), v[n], rtol=1e-6, atol=1e-9)
            changed = (p.detach() != before[n])
            expected_step = lr * (m[n] / (1 - b1**t)) / ((v[n] / (1 - b2**t)).sqrt() + eps)
            if n == "layer.weight":
                k = math.ceil(frac * p.numel())
                top = torch.topk(m[n].abs().flatten(), k).indices
                want = torch.zeros(p.numel(), dtype=torch.bool)
                want[top] = True
                assert torch.equal(changed.flatten(), want), f"step {t}: wrong entries moved"
                assert int(changed.sum()) == k == st["updated"]
            else:  # bias / norm: full Adam step
                assert changed.all()
                assert st["updated"] == p.numel()
            delta = (before[n] - p.detach()).double()
            torch.testing.assert_close(delta[changed], expected_step[changed], rtol=1e-4, atol=1e-7)
            assert torch.all(delta[~changed] == 0)


def test_weight_decay_applies_to_every_entry():
    params = _params()
    lr, wd = 0.01, 0.5
    opt = MoFO(list(params.items()), lr=lr, weight_decay=wd, fraction=0.2)
    w = params["layer.weight"]
    before = w.detach().clone()
    for p in params.values():
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(3))
    opt.step()
    m = opt.state[w]["exp_avg"]
    mask = top_fraction_mask(m.abs(), 0.2)
    torch.testing.assert_close(w.detach()[~mask], before[~mask] * (1 - lr * wd))
    assert not torch.allclose(w.detach()[mask], before[mask] * (1 - lr * wd))


def test_fraction_one_equals_adamw_step_by_step():
    a, b = _tiny_llama(0), _tiny_llama(0)
    kw = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt_a = MoFO(a.named_parameters(), fraction=1.0, **kw)
    opt_b = torch.optim.AdamW(b.parameters(), foreach=False, **kw)
    g = torch.Generator().manual_seed(0)
    for step in range(6):
        ids = torch.randint(0, 48, (3, 12), generator=g)
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
        for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
            assert torch.allclose(pa, pb, rtol=0, atol=1e-7), f"{name} differs at step {step}"
    # and the run really moved the weights
    assert not torch.allclose(a.model.embed_tokens.weight, _tiny_llama(0).model.embed_tokens.weight)


def test_fraction_below_one_moves_less_than_adamw():
    a, b, ref = _tiny_llama(0), _tiny_llama(0), _tiny_llama(0)
    opt_a = MoFO(a.named_parameters(), lr=1e-2, fraction=0.1)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.0)
    ids = torch.randint(0, 48, (2, 10), generator=torch.Generator().manual_seed(2))
    for model, opt in ((a, opt_a), (b, opt_b)):
        for _ in range(3):
            opt.zero_grad()
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
    wa = a.model.layers[0].mlp.up_proj.weight
    wb = b.model.layers[0].mlp.up_proj.weight
    w0 = ref.model.layers[0].mlp.up_proj.weight
    moved_a = (wa != w0).float().mean().item()
    moved_b = (wb != w0).float().mean().item()
    assert moved_a <= 0.3 + 1e-9   # at most 3 steps × 10 % of the entries
    assert moved_b > 0.9


def test_bad_input():
    model = _tiny_llama(0)
    with pytest.raises(ParameterError, match="named_parameters"):
        MoFO(model.parameters())
    with pytest.raises(ParameterError, match="fraction"):
        MoFO(model.named_parameters(), fraction=0.0)
    with pytest.raises(ParameterError, match="fraction"):
        MoFO(model.named_parameters(), fraction=1.5)
    with pytest.raises(ParameterError, match="no parameters"):
        MoFO([])
