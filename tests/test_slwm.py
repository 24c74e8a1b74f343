"""forgetlab.merge.methods.slwm: closed-form submodule weights (G a = b), coefficient maps, registry integration."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from forgetlab.core.data import TaskPair
from forgetlab.core.errors import ForgetlabError
from forgetlab.merge.methods.slwm import slwm_merge, slwm_weights, solve_weights

PAIRS = [TaskPair(f"{a}+{b}=", str(a + b)) for a, b in [(1, 2), (3, 4), (5, 6), (7, 1)]]


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return AutoTokenizer.from_pretrained(str(tiny_llama.base))


def _llama(vocab, kv=2):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=kv,
                                        max_position_embeddings=128)).eval()


def _with_delta(model, delta: dict, scale: float):
    m = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n in delta:
                p.add_(scale * delta[n])
    return m


def _delta(model, only, seed=3, size=0.5):
    g = torch.Generator().manual_seed(seed)
    return {n: size * torch.randn(p.shape, generator=g) for n, p in model.named_parameters()
            if any(o in n for o in only)}


def test_solver_matches_least_squares():
    """G a = b is the normal equation of the stacked least-squares problem; compare with numpy's lstsq."""
    rng = np.random.default_rng(0)
    T, M = 3, 50
    per_task = [rng.normal(size=(T, M)) for _ in range(T)]  # Δj(x) for the samples of task t
    G = sum(D @ D.T for D in per_task)
    b = sum(D @ D[t] for t, D in enumerate(per_task))
    a, fb = solve_weights(G, b, ridge=0.0)
    A = np.concatenate([D.T for D in per_task])  # rows: every (t, x, feature); columns: j
    y = np.concatenate([D[t] for t, D in enumerate(per_task)])
    np.testing.assert_allclose(a, np.linalg.lstsq(A, y, rcond=None)[0], atol=1e-10)
    assert not fb
    a0, fb0 = solve_weights(np.zeros((2, 2)), np.zeros(2))
    assert fb0 and list(a0) == [0.5, 0.5]


@pytest.mark.parametrize("level", ["attn_mlp", "head_mlp"])
def test_recovers_known_weights_for_proportional_task_vectors(tok, level):
    """τ2 = 2·τ1 on o_proj and down_proj (so attention, heads and MLP are linear in their τ), the same samples
    for both tasks and inputs from the base: per submodule s = a1 + 2·a2 minimises (s − 1)² + (s − 2)², s = 1.5,
    and the ridge picks the minimum-norm a ∝ (1, 2): a = (0.3, 0.6). Norms and embeddings: λ = 1/2."""
    base = _llama(len(tok))
    d = _delta(base, ("o_proj", "down_proj"))
    ft1, ft2 = _with_delta(base, d, 1.0), _with_delta(base, d, 2.0)
    w = slwm_weights((base, [ft1, ft2], tok, [PAIRS, PAIRS]), ["t1", "t2"], level=level, samples=4,
                     ridge=1e-9, capture="base")
    df = w.to_frame()
    n_sub = 2 * (2 if level == "attn_mlp" else 5)
    assert len(df) == n_sub and not df.fallback.any()
    np.testing.assert_allclose(df[["t1", "t2"]].to_numpy(), np.tile([0.3, 0.6], (n_sub, 1)), atol=1e-5)
    merged, table = slwm_merge((base, [ft1, ft2], tok, [PAIRS, PAIRS]), ["t1", "t2"], level=level, samples=4,
                               ridge=1e-9, capture="base")
    sd0 = base.state_dict()
    for n, delta in d.items():  # θ0 + 0.3·δ + 0.6·2δ = θ0 + 1.5·δ
        torch.testing.assert_close(merged[n], sd0[n] + 1.5 * delta, atol=1e-4, rtol=1e-4)
    assert list(table.columns[:5]) == ["submodule", "layer", "module", "head", "fallback"]


def test_layer_level_and_unchanged_submodules(tok):
    """Only down_proj changes: each layer is linear in its τ; a = (0.3, 0.6). At attn_mlp the unchanged
    attention falls back to 1/T."""
    base = _llama(len(tok))
    d = _delta(base, ("down_proj",))
    ft1, ft2 = _with_delta(base, d, 1.0), _with_delta(base, d, 2.0)
    inputs = (base, [ft1, ft2], tok, [PAIRS, PAIRS])
    w = slwm_weights(inputs, ["a", "b"], level="layer", samples=3, ridge=1e-9, capture="base").to_frame()
    np.testing.assert_allclose(w[["a", "b"]].to_numpy(), [[0.3, 0.6]] * 2, atol=1e-5)
    w2 = slwm_weights(inputs, ["a", "b"], level="attn_mlp", samples=3, capture="base").to_frame()
    assert w2[w2.module == "attn"].fallback.all()
    np.testing.assert_allclose(w2[w2.module == "attn"][["a", "b"]].to_numpy(), 0.5)


def test_single_task_gets_weight_one_and_orthogonal_tasks(tok):
    """One task: G = g, b = g → a = 1. Two tasks changing disjoint output rows of down_proj, same samples,
    base inputs: G diagonal, b_i = G_ii / 2 → a = (0.5, 0.5) for the MLP."""
    base = _llama(len(tok))
    d = _delta(base, ("down_proj",))
    ft = _with_delta(base, d, 1.0)
    w = slwm_weights((base, [ft], tok, [PAIRS]), ["t"], level="attn_mlp", samples=4, ridge=1e-9).to_frame()
    np.testing.assert_allclose(w[w.module == "mlp"]["t"], 1.0, atol=1e-6)
    top = {n: v * (torch.arange(v.shape[0]) < 16).float()[:, None] for n, v in d.items()}
    bottom = {n: v - top[n] for n, v in d.items()}
    f1, f2 = _with_delta(base, top, 1.0), _with_delta(base, bottom, 1.0)
    w = slwm_weights((base, [f1, f2], tok, [PAIRS, PAIRS]), ["x", "y"], samples=4, ridge=1e-9,
                     capture="base").to_frame()
    np.testing.assert_allclose(w[w.module == "mlp"][["x", "y"]].to_numpy(), 0.5, atol=1e-6)


def test_gqa_head_mlp_coefficient_maps(tok):
    base = _llama(len(tok), kv=2)
    d = _delta(base, ("self_attn", "mlp"), size=0.3)
    ft1, ft2 = _with_delta(base, d, 1.0), _with_delta(base, {k: torch.randn_like(v) * 0.3 for k, v in d.items()}, 1.0)
    w = slwm_weights((base, [ft1, ft2], tok, [PAIRS, PAIRS]), ["p", "q"], level="head_mlp", samples=3)
    coefs = w.coefficients()
    df = w.to_frame()
    q = coefs["model.layers.1.self_attn.q_proj.weight"]
    k = coefs["model.layers.1.self_attn.k_proj.weight"]
    o = coefs["model.layers.1.self_attn.o_proj.weight"]
    assert tuple(q.shape) == (2, 32, 1) and tuple(o.shape) == (2, 1, 32) and tuple(k.shape) == (2, 16, 1)
    heads = df[(df.module == "head") & (df.layer == 1)].sort_values("head")[["p", "q"]].to_numpy()
    for h in range(4):
        np.testing.assert_allclose(q[:, h * 8, 0].numpy(), heads[h], rtol=1e-5)
        np.testing.assert_allclose(o[:, 0, h * 8 + 7].numpy(), heads[h], rtol=1e-5)
    np.testing.assert_allclose(k[:, 8, 0].numpy(), heads[2:4].mean(0), rtol=1e-5)  # kv head 1 ← query heads 2, 3
    emb = coefs["model.embed_tokens.weight"]
    assert emb.flatten().tolist() == [0.5, 0.5]
    norm = coefs["model.layers.0.input_layernorm.weight"]
    assert norm.flatten().tolist() == [0.5, 0.5]


def test_gpt2_runs_and_registry(tiny_gpt2):
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge import METHODS, validate_params

    assert "slwm" in METHODS and METHODS["slwm"].needs_pool
    p = validate_params("slwm", {"level": "head_mlp"}, n_models=2)
    assert p["samples"] == 30 and p["ridge"] == pytest.approx(1e-4)
    pool = ModelPool.from_yaml(tiny_gpt2.pool_yaml)
    merged, table = slwm_merge(pool, ["math", "copy"], models=["ft0", "ft1"], level="head_mlp", samples=3)
    assert len(table) == 2 * (4 + 1) and np.isfinite(table[["math", "copy"]].to_numpy()).all()
    assert set(merged) == set(pool.load("base").state_dict())


def test_engine_prepare_hook(tiny_llama, tmp_path):
    from forgetlab.core.pool import ModelPool
    from forgetlab.merge import run

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    recipe = {"method": "slwm", "base": str(tiny_llama.base),
              "models": [{"model": str(tiny_llama.finetuned["ft0"])}, {"model": str(tiny_llama.finetuned["ft1"])}],
              "params": {"samples": 3, "tasks": "math,copy"}}
    res = run(recipe, tmp_path / "merged", pool=pool)
    assert (tmp_path / "merged" / "config.json").exists() and res.method == "slwm"


def test_bad_input(tok):
    base = _llama(len(tok))
    ft = _with_delta(base, _delta(base, ("mlp",)), 1.0)
    with pytest.raises(ForgetlabError, match="level must be one of"):
        slwm_weights((base, [ft], tok, [PAIRS]), level="head")
    with pytest.raises(ForgetlabError, match="only 4 probe samples"):
        slwm_weights((base, [ft], tok, [PAIRS]), samples=5)
    with pytest.raises(ForgetlabError, match="no probe samples"):
        slwm_weights((base, [ft], tok, [[]]), samples=2)
    other = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=48,
                                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ForgetlabError, match="structure"):
        slwm_weights((base, [ft, other], tok, [PAIRS, PAIRS]), samples=2)


def test_gpt2_head_coefficients_cover_fused_qkv_columns(tiny_gpt2):
    from forgetlab.core.pool import ModelPool

    pool = ModelPool.from_yaml(tiny_gpt2.pool_yaml)
    w = slwm_weights(pool, ["math", "copy"], models=["ft0", "ft1"], level="head_mlp", samples=3)
    coefs, df = w.coefficients(), w.to_frame()
    c_attn = coefs["transformer.h.1.attn.c_attn.weight"]
    c_bias = coefs["transformer.h.1.attn.c_attn.bias"]
    c_proj = coefs["transformer.h.1.attn.c_proj.weight"]
    assert tuple(c_attn.shape) == (2, 1, 96) and tuple(c_bias.shape) == (2, 96) and tuple(c_proj.shape) == (2, 32, 1)
    for h in range(4):
        a = df[(df.module == "head") & (df.layer == 1) & (df["head"] == h)][["math", "copy"]].to_numpy()[0]
        for off in (0, 32, 64):
            np.testing.assert_allclose(c_attn[:, 0, off + 8 * h: off + 8 * h + 8].numpy(), np.tile(a[:, None], 8),
                                       rtol=1e-5)
            np.testing.assert_allclose(c_bias[:, off + 8 * h].numpy(), a, rtol=1e-5)
        np.testing.assert_allclose(c_proj[:, 8 * h, 0].numpy(), a, rtol=1e-5)
    assert coefs["transformer.h.1.attn.c_proj.bias"].flatten().tolist() == [0.5, 0.5]
    mlp = df[(df.module == "mlp") & (df.layer == 0)][["math", "copy"]].to_numpy()[0]
    np.testing.assert_allclose(coefs["transformer.h.0.mlp.c_fc.weight"].flatten().numpy(), mlp, rtol=1e-6)
