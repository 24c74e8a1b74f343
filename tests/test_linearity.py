"""forgetlab.analysis.linearity: d(α), NLS and the Property 1 residual; cached-input scores against direct recomputation."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from forgetlab.analysis.linearity import DEFAULT_ALPHAS, NonlinearityResult, nonlinearity_scores
from forgetlab.analysis.linearity_reference import direct_scores, score_function
from forgetlab.core.data import TaskPair
from forgetlab.core.errors import ForgetlabError, IncompatibleModelsError, ProbeDataError

PAIRS = [TaskPair(f"{a}+{b}=", str(a + b)) for a, b in [(1, 2), (3, 4), (5, 6), (7, 1), (2, 8)]]
IDEAL = 1.0 - np.asarray(DEFAULT_ALPHAS)


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return AutoTokenizer.from_pretrained(str(tiny_llama.base))


def _llama(vocab, layers=2, kv=2, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=kv, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def _gpt2(vocab, seed=0):
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                      bos_token_id=1, eos_token_id=2)).eval()


def _perturbed(model, scale=0.3, only=None, seed=1):
    import copy

    ft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in ft.named_parameters():
            if only is None or any(o in name for o in only):
                p.add_(scale * torch.randn(p.shape, generator=g) * (p.abs().mean() + 0.02))
    return ft


# ------------------------------------------------------------------ the formulas on plain functions

def test_bias_free_linear_layer_scores_zero():
    torch.manual_seed(0)
    w0, w1 = torch.randn(6, 5), torch.randn(6, 5)
    xs = torch.randn(12, 5)
    s = score_function(lambda x, w: w @ x, w0, w1, xs)
    np.testing.assert_allclose(s.d, np.tile(IDEAL, (12, 1)), atol=1e-12)
    np.testing.assert_allclose(s.nls, 0.0, atol=1e-12)
    np.testing.assert_allclose(s.residual, 0.0, atol=1e-12)
    assert s.nls_mean == pytest.approx(0.0, abs=1e-12) and s.nls_std == pytest.approx(0.0, abs=1e-12)


def test_quadratic_hand_computed():
    """f(θ) = θ², θ0 = 0, θ1 = 1: d(α) = 1 − α², NLS = Σα α(1 − α) = 4.5 − 2.85 = 1.65, residual |α² − α|."""
    s = score_function(lambda x, t: t * t * torch.ones_like(x), torch.tensor(0.0), torch.tensor(1.0),
                       torch.ones(3, 1))
    a = np.asarray(DEFAULT_ALPHAS)
    np.testing.assert_allclose(s.d[0], 1 - a ** 2, atol=1e-12)
    assert s.nls_mean == pytest.approx(1.65, abs=1e-12)
    assert s.residual[0] == pytest.approx(np.mean(np.abs(a ** 2 - a)), abs=1e-12)


def test_nonlinear_function_scores_above_zero():
    torch.manual_seed(0)
    w0, w1 = torch.randn(6, 5), 3 * torch.randn(6, 5)
    s = score_function(lambda x, w: torch.tanh(w @ x), w0, w1, torch.randn(8, 5))
    assert s.nls_mean > 0.05 and (s.nls > 0).all()


def test_unchanged_submodule_is_nan_not_a_crash():
    w = torch.randn(3, 3)
    s = score_function(lambda x, w: w @ x, w, w.clone(), torch.randn(4, 3))
    assert np.isnan(s.nls_mean)


# ------------------------------------------------------------------ models

def test_submodules_linear_in_their_changed_params_score_zero(tok):
    """Only o_proj and down_proj change: attention, each head and the MLP are exactly linear in α on fixed
    inputs; the layer is not (the changed attention output goes through post_attention_layernorm), nor the model."""
    base = _llama(len(tok))
    ft = _perturbed(base, scale=1.0, only=("o_proj", "down_proj"))
    res = nonlinearity_scores((base, ft, tok, PAIRS), "math", samples=5, batch_size=2)
    df = res.to_frame()
    lin = df[df.level.isin(["attn", "mlp", "head"])]
    assert len(lin) == 2 * 2 + 2 * 4
    assert (lin.nls_mean.abs() < 1e-4).all(), lin[["level", "layer", "head", "nls_mean"]]
    assert (lin.residual_mean.abs() < 1e-4).all()
    for curve in lin.curve:
        np.testing.assert_allclose(curve, IDEAL, atol=1e-4)
    assert (df[df.level == "layer"].nls_mean > 1e-3).all()
    assert df[df.level == "model"].nls_mean.iloc[0] > 1e-3


def test_layer_linear_when_only_down_proj_changes(tok):
    base = _llama(len(tok))
    ft = _perturbed(base, scale=1.0, only=("down_proj",))
    df = nonlinearity_scores((base, ft, tok, PAIRS), "math", levels=("layer", "mlp", "attn"), samples=5).to_frame()
    assert (df[df.level != "attn"].nls_mean.abs() < 1e-4).all()
    assert df[df.level == "attn"].nls_mean.isna().all()  # unchanged attention: no score, not a crash


def test_nonlinear_model_scores_above_zero_and_frame_shape(tok):
    base = _llama(len(tok))
    ft = _perturbed(base, scale=2.0)
    res = nonlinearity_scores((base, ft, tok, PAIRS), "math", samples=4)
    df = res.to_frame()
    assert list(df.columns)[:6] == ["level", "layer", "module", "head", "nls_mean", "nls_std"]
    assert len(df) == 1 + 3 * 2 + 4 * 2
    assert (df.n == 4).all()
    assert (df.nls_mean > 0).all()
    assert df[df.level == "model"].nls_mean.iloc[0] > 0.05
    assert set(df.module) >= {"model", "model.layers.0", "model.layers.1.self_attn", "model.layers.0.mlp"}
    # every curve starts at d(0) = 1 by definition
    assert all(abs(c[0] - 1.0) < 1e-9 for c in df.curve)
    curves = res.curves_frame()
    assert len(curves) == len(df) * 10 and set(curves.ideal.round(6)) == set(IDEAL.round(6))
    back = NonlinearityResult.from_dict(res.to_dict())
    np.testing.assert_allclose(back.to_frame().nls_mean, df.nls_mean)
    lv = res.by_level()
    assert list(lv.level) == ["model", "layer", "attn", "mlp", "head"] and list(lv.submodules) == [1, 2, 2, 2, 8]


@pytest.mark.parametrize("family,capture", [("llama", "finetuned"), ("gpt2", "finetuned"), ("llama", "base")])
def test_cached_inputs_equal_direct_recomputation(tok, family, capture):
    base = _llama(len(tok), kv=2) if family == "llama" else _gpt2(len(tok))
    ft = _perturbed(base, scale=1.0)
    alphas = (0.0, 0.3, 0.6, 0.9)
    args = dict(samples=3, alphas=alphas, capture=capture, batch_size=2)
    fast = nonlinearity_scores((base, ft, tok, PAIRS), "math", **args).to_frame()
    slow = direct_scores((base, ft, tok, PAIRS), "math", **args).to_frame()
    assert list(zip(fast["level"], fast["layer"], fast["head"])) == list(zip(slow["level"], slow["layer"], slow["head"]))
    np.testing.assert_allclose(fast.nls_mean, slow.nls_mean, atol=2e-4, rtol=1e-3)
    np.testing.assert_allclose(np.stack(fast.curve), np.stack(slow.curve), atol=2e-4)
    assert fast.nls_mean.max() > 0.01  # the comparison is not between zeros


def test_capture_choice_changes_downstream_inputs(tok):
    base = _llama(len(tok))
    ft = _perturbed(base, scale=2.0)
    a = nonlinearity_scores((base, ft, tok, PAIRS), "m", levels=("layer",), samples=3).to_frame()
    b = nonlinearity_scores((base, ft, tok, PAIRS), "m", levels=("layer",), samples=3, capture="base").to_frame()
    # layer 0 sees the embeddings in both cases only if they did not change; they did, so both layers differ
    assert not np.allclose(a.nls_mean, b.nls_mean)


def test_batch_size_does_not_change_scores(tok):
    base = _llama(len(tok))
    ft = _perturbed(base, scale=1.0)
    a = nonlinearity_scores((base, ft, tok, PAIRS), "m", samples=5, batch_size=1).to_frame()
    b = nonlinearity_scores((base, ft, tok, PAIRS), "m", samples=5, batch_size=5).to_frame()
    np.testing.assert_allclose(a.nls_mean, b.nls_mean, atol=1e-5)


def test_pool_input_and_progress(tiny_llama):
    from forgetlab.core.pool import ModelPool

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    seen = []
    res = nonlinearity_scores(pool, "math", model="ft0", levels=("model", "attn", "head"), samples=4,
                              progress=lambda f, m: seen.append(f))
    df = res.to_frame()
    assert res.model == "ft0" and res.task == "math" and res.samples == 4
    assert len(df) == 1 + 2 + 8 and np.isfinite(df.nls_mean).all()
    assert seen[-1] == 1.0 and all(b >= a for a, b in zip(seen, seen[1:]))
    with pytest.raises(ForgetlabError, match="pass model="):
        nonlinearity_scores(pool, "math", samples=2)


# ------------------------------------------------------------------ bad input

def test_bad_input_messages(tok):
    base = _llama(len(tok))
    ft = _perturbed(base)
    with pytest.raises(ProbeDataError, match="no probe samples"):
        nonlinearity_scores((base, ft, tok, []), "empty")
    with pytest.raises(ProbeDataError, match="only 5 probe samples"):
        nonlinearity_scores((base, ft, tok, PAIRS), "math", samples=6)
    with pytest.raises(ForgetlabError, match="Unknown level"):
        nonlinearity_scores((base, ft, tok, PAIRS), "math", levels=("block",), samples=2)
    with pytest.raises(ForgetlabError, match="alphas"):
        nonlinearity_scores((base, ft, tok, PAIRS), "math", alphas=(0.5, 1.0), samples=2)
    with pytest.raises(ForgetlabError, match="capture"):
        nonlinearity_scores((base, ft, tok, PAIRS), "math", capture="merged", samples=2)
    deeper = _llama(len(tok), layers=3)
    with pytest.raises(IncompatibleModelsError, match="structure"):
        nonlinearity_scores((base, deeper, tok, PAIRS), "math", samples=2)


def test_unknown_architecture_keeps_model_level_only(tok):
    """Falcon's fused query_key_value (multi-query: all q heads, then one k and one v) is not GPT-NeoX's per-head
    layout, so forgetlab refuses to slice it: submodule levels exit with a message naming the families."""
    from transformers import FalconConfig, FalconForCausalLM

    torch.manual_seed(0)
    base = FalconForCausalLM(FalconConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4)).eval()
    ft = _perturbed(base)
    with pytest.raises(ForgetlabError, match="'head' level is unavailable.*falcon.*Llama.*GPT-NeoX"):
        nonlinearity_scores((base, ft, tok, PAIRS), "math", levels=("model", "head"), samples=2)
    with pytest.raises(ForgetlabError, match="'layer' level is unavailable"):
        nonlinearity_scores((base, ft, tok, PAIRS), "math", samples=2)    # the default: every level
    df = nonlinearity_scores((base, ft, tok, PAIRS), "math", levels=("model",), samples=2).to_frame()
    assert len(df) == 1 and df.nls_mean.iloc[0] > 0


def _variant(kind, vocab):
    from transformers import (MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)

    torch.manual_seed(0)
    kw = dict(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**kw)).eval()
    if kind == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**kw, head_dim=8)).eval()
    return MistralForCausalLM(MistralConfig(**kw, head_dim=8)).eval()


@pytest.mark.parametrize("kind", ["qwen2", "mistral", "qwen3"])
def test_projection_shortcut_equals_direct_recomputation(tok, kind):
    """attn, mlp and heads come from projections interpolated between α = 0 and 1 (linear steps included, q/k
    norms re-applied per α for Qwen3); they must equal full forward passes with hooks (Qwen2 has q/k/v biases,
    Mistral a sliding-window config, Qwen3 q/k norms)."""
    base = _variant(kind, len(tok))
    ft = _perturbed(base, scale=1.0)
    args = dict(samples=4, alphas=(0.0, 0.2, 0.5, 0.8), batch_size=2)
    for levels in [("attn", "head", "mlp", "layer"), ("attn",)]:
        fast = nonlinearity_scores((base, ft, tok, PAIRS), "m", levels=levels, **args).to_frame()
        slow = direct_scores((base, ft, tok, PAIRS), "m", levels=levels, **args).to_frame()
        np.testing.assert_allclose(np.stack(fast.curve), np.stack(slow.curve), atol=2e-4)
        assert fast.nls_mean.min() > 1e-3


def test_unrecognised_mlp_is_rerun_whole(tok):
    """An MLP whose forward is not down(act(gate)·up) fails the one-time check against the capture pass and is
    re-run as a module: scores still equal direct recomputation (they would not through the shortcut)."""
    from transformers.models.llama.modeling_llama import LlamaMLP

    class ShiftedMLP(LlamaMLP):
        def forward(self, x):
            return super().forward(x) + torch.tanh(x)

    base = _llama(len(tok))
    for layer in base.model.layers:
        layer.mlp.__class__ = ShiftedMLP
    ft = _perturbed(base, scale=1.0, only=("mlp",))
    args = dict(samples=4, alphas=(0.0, 0.5), levels=("mlp",), batch_size=4)
    fast = nonlinearity_scores((base, ft, tok, PAIRS), "m", **args).to_frame()
    slow = direct_scores((base, ft, tok, PAIRS), "m", **args).to_frame()
    np.testing.assert_allclose(np.stack(fast.curve), np.stack(slow.curve), atol=2e-4)
