"""Merge methods on small tensors: hand-computed cases, invariants, and references computed another way."""
from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge import METHODS, merge_state_dicts
from forgetlab.merge import select
from forgetlab.merge.methods import consensus, interpolation, pcb, ties
from forgetlab.merge.methods.dare import dare
from forgetlab.merge.registry import tensor_generator
from forgetlab.merge.methods.fapm import fapm_mask, fapm_prune, fapm_scores

T = torch.tensor


def sd(**kw):
    return {k: T(v, dtype=torch.float32) for k, v in kw.items()}


# ------------------------------------------------------------------ hand-computed cases, one per method

def test_linear_hand_computed():
    out = merge_state_dicts("linear", sd(w=[0.0, 0.0]), [sd(w=[1.0, 2.0]), sd(w=[3.0, 6.0])], weights=[1, 3])
    assert torch.allclose(out["w"], T([2.5, 5.0]))  # (1·1 + 3·3)/4, (2 + 18)/4
    raw = interpolation.linear([T([1.0]), T([3.0])], [1, 3], normalize=False)
    assert raw.item() == 10.0


def test_wise_ft_hand_computed():
    out = merge_state_dicts("wise_ft", sd(w=[0.0, 2.0]), [sd(w=[4.0, 6.0])], alpha=0.25)
    assert torch.allclose(out["w"], T([1.0, 3.0]))


def test_hma_blocks_and_hand_computed():
    a = [0.1, 0.2, 0.3]
    assert [interpolation.hma_alpha_for(i, 6, a) for i in range(6)] == [0.1, 0.1, 0.2, 0.2, 0.3, 0.3]
    # 7 layers into 3 blocks by layer midpoints: ⌊(i + ½)·3/7⌋ → sizes 2, 3, 2
    assert [interpolation.block_of(i, 7, 3) for i in range(7)] == [0, 0, 1, 1, 1, 2, 2]
    assert interpolation.hma_alpha_for(None, 6, a) == 0.1
    assert interpolation.hma_alpha_for("last", 6, a) == 0.3
    names = ["model.embed_tokens.weight", "model.layers.0.mlp.w", "model.layers.3.mlp.w", "model.layers.5.mlp.w",
             "model.norm.weight", "lm_head.weight"]
    base = {n: torch.zeros(2) for n in names}
    ft = {n: torch.full((2,), 10.0) for n in names}
    out = merge_state_dicts("hma", base, [ft], alphas=a, config=SimpleNamespace(num_hidden_layers=6))
    got = [round(float(out[n][0]), 5) for n in names]
    assert got == [1.0, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_task_arithmetic_hand_computed():
    out = merge_state_dicts("task_arithmetic", sd(w=[1.0, 1.0]), [sd(w=[2.0, 1.0]), sd(w=[1.0, 3.0])],
                            lam=0.5, weights=[1, 2])
    assert torch.allclose(out["w"], T([1.5, 3.0]))  # 1 + 0.5·([1,0] + 2·[0,2])


TIES_TAUS = [[3.0, -1.0, 0.5, -2.0], [-1.0, 2.0, 0.2, -4.0], [2.0, -3.0, -0.1, 1.0]]


def test_ties_hand_computed():
    # keep 0.5 of 4 → 2 per task: [3,0,0,-2], [0,2,0,-4], [2,-3,0,0]; sums [5,-1,0,-6] → signs [+,-,+,-]
    out = merge_state_dicts("ties", sd(w=[0.0] * 4), [sd(w=t) for t in TIES_TAUS], keep=0.5)
    assert torch.allclose(out["w"], T([2.5, -3.0, 0.0, -3.0]))
    out2 = merge_state_dicts("ties", sd(w=[1.0] * 4), [sd(w=[x + 1 for x in t]) for t in TIES_TAUS], keep=0.5, lam=2)
    assert torch.allclose(out2["w"], T([6.0, -5.0, 1.0, -5.0]))


def test_ties_sign_tie_goes_positive_and_disjoint_mean_counts_agreeing_only():
    stack = T([[1.0, 2.0], [-1.0, 0.0]])
    sign = ties.elect_sign(stack)
    assert sign.tolist() == [1.0, 1.0]
    assert ties.disjoint_mean(stack, sign).tolist() == [1.0, 2.0]  # zero never counts as agreeing


def test_dare_hand_computed_against_the_generator():
    tau = torch.arange(1.0, 9.0)
    g = torch.Generator().manual_seed(7)
    out = dare(tau, 0.5, g)
    u = torch.rand(8, generator=torch.Generator().manual_seed(7))
    assert torch.equal(out, torch.where(u >= 0.5, tau * 2.0, torch.zeros(8)))


def test_dare_linear_and_dare_ties_in_state_dicts_follow_their_formulas():
    base = sd(w=[0.0] * 64)
    fts = [{"w": torch.randn(64, generator=torch.Generator().manual_seed(i))} for i in range(2)]
    # forgetlab's DARE before issue 25: survivors × 1/(1 − p), dare_ties the disjoint mean
    out = merge_state_dicts("dare_linear", base, fts, drop=0.3, seed=5, rescale="inverse")
    parts = [dare(f["w"], 0.3, tensor_generator(5, "w", i)) for i, f in enumerate(fts)]
    assert torch.allclose(out["w"], parts[0] + parts[1])
    out_t = merge_state_dicts("dare_ties", base, fts, drop=0.3, seed=5, rescale="inverse", normalize=True)
    assert torch.allclose(out_t["w"], ties.ties_combine(parts))
    # mergekit's defaults: survivors keep the L1 norm of τ, dare_ties sums the agreeing entries
    l1 = [dare(f["w"], 0.3, tensor_generator(5, "w", i), "l1") for i, f in enumerate(fts)]
    for f, part in zip(fts, l1):
        assert torch.isclose(part.abs().sum(), f["w"].abs().sum())
    assert torch.allclose(merge_state_dicts("dare_linear", base, fts, drop=0.3, seed=5)["w"], l1[0] + l1[1])
    assert torch.allclose(merge_state_dicts("dare_ties", base, fts, drop=0.3, seed=5)["w"],
                          ties.ties_combine(l1, normalize=False))


def test_breadcrumbs_hand_computed():
    tau = [10.0, -1.0, 2.0, -3.0, 4.0, 0.5, 6.0, -7.0, 8.0, 9.0]
    out = merge_state_dicts("breadcrumbs", sd(w=[0.0] * 10), [sd(w=tau)], keep=0.5, gamma=0.1)
    assert out["w"].tolist() == [0.0, 0.0, 0.0, 0.0, 4.0, 0.0, 6.0, -7.0, 8.0, 9.0]


def test_consensus_hand_computed():
    # total [2, 3.1, 0]; m1 = [T, F, T], m2 = [T, T, T]; count [2, 1, 2] ≥ 2 → [T, F, T]
    out = merge_state_dicts("consensus", sd(w=[0.0] * 3), [sd(w=[1.0, 0.1, 2.0]), sd(w=[1.0, 3.0, -2.0])])
    assert torch.allclose(out["w"], T([2.0, 0.0, 0.0]))
    masks = consensus.tall_masks([T([1.0, 0.1, 2.0]), T([1.0, 3.0, -2.0])], 0.4)
    assert [m.tolist() for m in masks] == [[True, False, True], [True, True, True]]


def _pcb_reference(taus: list[list[float]], keep: float, lam: float) -> list[float]:
    """PCB of docs/methods.md with Python floats and math.exp (no torch): the reference computed another way."""
    n, d = len(taus), len(taus[0])

    def norm(x):
        lo, hi = min(x), max(x)
        return [0.0] * len(x) if hi == lo else [(v - lo) / (hi - lo) for v in x]

    def softmax(x):
        e = [math.exp(v) for v in x]
        s = sum(e)
        return [v / s for v in e]

    betas = []
    for i in range(n):
        intra = softmax([n * v for v in norm([a * a for a in taus[i]])])
        inter = [0.0] * d
        for j in range(n):
            s = softmax(norm([a * b for a, b in zip(taus[i], taus[j])]))
            inter = [x + y for x, y in zip(inter, s)]
        betas.append([a * b for a, b in zip(intra, inter)])
    k = max(1, int(keep * d))
    bhat = []
    for b in betas:
        thr = sorted(b, reverse=True)[k - 1]
        bhat.append([v if v >= thr else 0.0 for v in b])
    out = []
    for e in range(d):
        den = sum(bhat[i][e] for i in range(n))
        out.append(0.0 if den == 0 else lam * sum(bhat[i][e] * taus[i][e] for i in range(n)) / den)
    return out


@pytest.mark.parametrize("scope", ["tensor", "global"])
def test_pcb_against_a_pure_python_reference(scope):
    taus = [[0.3, -1.2, 0.05, 2.0, -0.4, 0.9], [-0.5, 0.8, 0.1, 1.5, 0.6, -1.1], [0.2, 0.1, -0.9, 0.4, 1.3, 0.0]]
    ref = _pcb_reference(taus, 0.5, 0.7)
    out = merge_state_dicts("pcb", sd(w=[0.0] * 6), [sd(w=t) for t in taus], keep=0.5, lam=0.7, scope=scope)
    assert torch.allclose(out["w"], T(ref), atol=1e-6)


def test_fapm_hand_computed_scores_and_masks():
    w0, tau = T([1.0, 2.0, 0.0, 4.0]), T([0.5, 0.5, 0.1, -2.0])
    s = fapm_scores(tau, w0)  # mean|W0| = 1.75
    assert torch.allclose(s[[0, 1, 3]], T([-0.375, 0.0625, 1.125]))
    assert s[2] == float("-inf")
    assert fapm_prune(tau, w0, 0.5).tolist() == [0.0, 0.5, 0.0, -2.0]
    assert fapm_prune(tau, w0, 0.5, score="magnitude").tolist() == [0.5, 0.0, 0.0, -2.0]
    assert fapm_prune(tau, w0, 0.5, score="relative").tolist() == [0.5, 0.5, 0.0, 0.0]
    assert fapm_mask(tau, w0, 0.5).tolist() == [False, True, False, True]
    out = merge_state_dicts("fapm", {"w": w0}, [{"w": w0 + tau}], ratio=0.5)
    assert torch.allclose(out["w"], w0 + T([0.0, 0.5, 0.0, -2.0]))


def test_fapm_zero_task_vector_and_zero_base_entries_give_no_nan():
    w0, tau = T([0.0, 0.0, 1.0]), T([0.0, 1.0, 0.0])
    s = fapm_scores(tau, w0, "fapm")
    assert not torch.isnan(s).any()
    assert s[0] == 0 and s[1] == float("-inf")


# ------------------------------------------------------------------ invariants

def _rand_sd(seed, shapes={"a": (5, 7), "b": (11,)}):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def test_wise_ft_endpoints():
    b, f = _rand_sd(0), _rand_sd(1)
    for k in b:
        assert torch.equal(merge_state_dicts("wise_ft", b, [f], alpha=0)[k], b[k])
        assert torch.equal(merge_state_dicts("wise_ft", b, [f], alpha=1)[k], f[k])


def test_fapm_ratio_endpoints():
    b, f = _rand_sd(0), _rand_sd(1)
    r0, r1 = merge_state_dicts("fapm", b, [f], ratio=0), merge_state_dicts("fapm", b, [f], ratio=1)
    for k in b:
        assert torch.allclose(r0[k], f[k], atol=1e-6)
        assert torch.equal(r1[k], b[k])


def test_ties_one_model_keep_one_is_task_arithmetic():
    b, f = _rand_sd(0), _rand_sd(1)
    t, ta = merge_state_dicts("ties", b, [f], keep=1.0, lam=0.8), merge_state_dicts("task_arithmetic", b, [f], lam=0.8)
    for k in b:
        assert torch.allclose(t[k], ta[k], atol=1e-6)


@pytest.mark.parametrize("method", ["dare_linear", "dare_ties"])
def test_dare_drop_zero_is_task_arithmetic_or_ties(method):
    b, fs = _rand_sd(0), [_rand_sd(1), _rand_sd(2)]
    ref = "task_arithmetic" if method == "dare_linear" else "ties"
    extra = {} if method == "dare_linear" else {"keep": 1.0, "normalize": False}  # mergekit's dare_ties: a sum
    out, exp = merge_state_dicts(method, b, fs, drop=0.0), merge_state_dicts(ref, b, fs, **extra)
    for k in b:
        assert torch.allclose(out[k], exp[k], atol=1e-6)


def test_dare_same_seed_same_mask_other_seed_other_mask():
    b, fs = _rand_sd(0), [_rand_sd(1)]
    x = merge_state_dicts("dare_linear", b, fs, drop=0.5, seed=3)
    y = merge_state_dicts("dare_linear", b, fs, drop=0.5, seed=3)
    z = merge_state_dicts("dare_linear", b, fs, drop=0.5, seed=4)
    assert all(torch.equal(x[k], y[k]) for k in b)
    assert not torch.equal(x["a"], z["a"])
    kept = (x["a"] != b["a"]).float().mean().item()
    assert 0.2 < kept < 0.8  # about half of 35 entries survive


@pytest.mark.parametrize("scope", ["tensor", "global"])
def test_pcb_keep_one_identical_task_vectors(scope):
    b, f = _rand_sd(0), _rand_sd(1)
    out = merge_state_dicts("pcb", b, [f, f, f], keep=1.0, lam=0.6, scope=scope)
    for k in b:
        assert torch.allclose(out[k], b[k] + 0.6 * (f[k] - b[k]), atol=1e-5)


def test_topk_mask_is_exact_with_ties():
    s = T([1.0, 3.0, 3.0, 3.0, 0.0])
    assert select.topk_mask(s, 2).tolist() == [False, True, True, False, False]
    assert int(select.topk_mask(torch.randn(1000), 137).sum()) == 137


def test_keep_count_follows_mergekit_rule():
    assert select.keep_count(10, 0.0) == 0
    assert select.keep_count(10, 0.01) == 1   # at least one entry when keep > 0
    assert select.keep_count(10, 0.25) == 2
    assert select.keep_count(10, 1.0) == 10


def test_pcb_stats_match_torch_softmax():
    taus = [torch.randn(50, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    st = pcb.pcb_stats(taus, 0.2)
    betas = pcb.pcb_balance(taus, st)
    n01 = lambda x: (x - x.min()) / (x.max() - x.min())  # noqa: E731
    ref = torch.softmax(2 * n01(taus[0] ** 2), 0) * (torch.softmax(n01(taus[0] ** 2), 0) +
                                                     torch.softmax(n01(taus[0] * taus[1]), 0))
    assert torch.allclose(betas[0], ref, rtol=1e-5)


def test_every_registered_method_has_help_defaults_and_a_description():
    for name, spec in METHODS.items():
        assert spec.description and spec.name == name
        for p in spec.params:
            assert p.help, (name, p.name)


def test_every_registered_method_has_an_entry_in_docs_methods_md():
    """docs/methods.md names every method the registry finds: its anchor (`docs/methods.md#<name>`, which the code
    cites) and its name in a heading."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "methods.md").read_text(encoding="utf-8")
    anchors = set(re.findall(r'<a id="([^"]+)"', text))
    headings = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    no_anchor = [n for n in METHODS.names() if n not in anchors]
    no_heading = [n for n in METHODS.names() if f"`{n}`" not in headings]
    assert not no_anchor and not no_heading, (f"docs/methods.md lacks the anchor of {no_anchor} and a heading naming "
                                              f"{no_heading}: document every registered method there")


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("method,params,word", [
    ("ties", {"keep": 1.5}, "keep"), ("dare_linear", {"drop": -0.1}, "drop"), ("fapm", {"ratio": 2}, "ratio"),
    ("wise_ft", {"alpha": 1.2}, "alpha"), ("breadcrumbs", {"keep": 0.995, "gamma": 0.01}, r"keep \+ gamma"),
    ("pcb", {"scope": "layer"}, "scope"), ("fapm", {"score": "nope"}, "score"),
])
def test_parameters_out_of_range_are_refused(method, params, word):
    b, f = _rand_sd(0), _rand_sd(1)
    with pytest.raises(ParameterError, match=word):
        merge_state_dicts(method, b, [f], **params)


def test_unknown_method_or_parameter_lists_the_valid_ones():
    b, f = _rand_sd(0), _rand_sd(1)
    with pytest.raises(ParameterError, match="task_arithmetic") as e:
        merge_state_dicts("tiez", b, [f])
    assert "ties" in str(e.value)
    with pytest.raises(ParameterError, match="keep, lam, scope, weights"):
        merge_state_dicts("ties", b, [f], density=0.2)


def test_no_finetuned_model_and_too_many_for_wise_ft():
    b, f = _rand_sd(0), _rand_sd(1)
    with pytest.raises(ParameterError, match="at least one fine-tuned model"):
        merge_state_dicts("task_arithmetic", b, [])
    with pytest.raises(ParameterError, match="at most 1"):
        merge_state_dicts("wise_ft", b, [f, f])


def test_mismatched_shapes_name_the_tensor_and_both_shapes():
    from forgetlab.core.errors import IncompatibleModelsError
    b = _rand_sd(0)
    f = dict(_rand_sd(1), b=torch.zeros(12))
    with pytest.raises(IncompatibleModelsError, match=r"Tensor b has shape \(11,\).*\(12,\)"):
        merge_state_dicts("task_arithmetic", b, [f])


def test_wrong_number_of_per_model_weights():
    b, f = _rand_sd(0), _rand_sd(1)
    with pytest.raises(ParameterError, match="3 values for 2"):
        merge_state_dicts("task_arithmetic", b, [f, f], weights=[1, 2, 3])


@pytest.mark.parametrize("kind", ["normal", "heavy_ties", "sparse"])
@pytest.mark.parametrize("device_path", [False, True])
def test_fast_kth_largest_is_exact_on_large_tensors(kind, device_path, monkeypatch):
    monkeypatch.setattr(select, "DEVICE_PATH_ON_CPU", device_path)   # the torch selection (GPUs), or numpy's
    g = torch.Generator().manual_seed(0)
    n = 1_100_000  # above the 2**20 size where the sampled bracket starts
    if kind == "normal":
        x = torch.randn(n, generator=g).abs()
    elif kind == "heavy_ties":
        x = torch.randint(0, 5, (n,), generator=g).float()
    else:  # mostly zeros, a few large values: the sample bracket fails and the fallback runs
        x = torch.zeros(n)
        x[torch.randint(0, n, (3000,), generator=g)] = torch.rand(3000, generator=g) + 1
    for k in (1, 2999, n // 5, n):
        exp = torch.kthvalue(x, n - k + 1).values
        assert select.kth_largest(x, k)[0] == exp
        assert int(select.topk_mask(x, k).sum()) == k


def test_linear_weights_summing_to_zero_are_refused_before_merging():
    b, f = _rand_sd(0), _rand_sd(1)
    with pytest.raises(ParameterError, match="sum to 0"):
        merge_state_dicts("linear", b, [f, f], weights=[1, -1])
    out = merge_state_dicts("linear", b, [f, f], weights=[1, -1], normalize=False)
    assert torch.allclose(out["a"], torch.zeros_like(out["a"]))


def _sizes(num_layers, num_blocks=3):
    blocks = [interpolation.block_of(i, num_layers, num_blocks) for i in range(num_layers)]
    assert blocks == sorted(blocks)  # contiguous
    return [blocks.count(b) for b in range(num_blocks)]


def test_hma_split_follows_the_mofo_rebuttal():
    # MoFO rebuttal, LLaMA-2-7B (32 layers): layers 0-10 / 11-20 / 21-31
    blocks = [interpolation.block_of(i, 32, 3) for i in range(32)]
    assert blocks == [0] * 11 + [1] * 10 + [2] * 11
    # its OpenLLaMA note (26 layers, 1-8 / 9-17 / 18-26 = 8/9/9) cannot come from the same near-equal rule:
    # the rule gives 9/8/9 — layer 9 (1-based) moves to the input block; docs/merging.md explains
    assert _sizes(26) == [9, 8, 9]
    # numpy.array_split, the old rule, gave 11/11/10 and 9/9/8
    import numpy as np
    assert [len(c) for c in np.array_split(range(32), 3)] == [11, 11, 10] != _sizes(32)
    # spare layers go to the outer blocks symmetrically; one spare goes to the middle
    assert _sizes(28) == [9, 10, 9] and _sizes(30) == [10, 10, 10] and _sizes(6, 2) == [3, 3]
    assert _sizes(5, 5) == [1, 1, 1, 1, 1]


def test_hma_refuses_more_alphas_than_layers():
    from forgetlab.core.errors import ParameterError

    with pytest.raises(ParameterError, match="HMA got 4 α values but the model has 2 decoder layers"):
        merge_state_dicts("hma", {"model.layers.0.w": torch.zeros(2), "model.layers.1.w": torch.zeros(2)},
                          [{"model.layers.0.w": torch.ones(2), "model.layers.1.w": torch.ones(2)}],
                          alphas=[0.1, 0.2, 0.3, 0.4], config=SimpleNamespace(num_hidden_layers=2))


def test_hma_gives_tied_lm_head_the_embedding_alpha(tiny_gpt2, tmp_path):
    from forgetlab.core.checkpoints import load_model, open_checkpoint

    base_model = load_model(tiny_gpt2.base, device="cpu")
    ft_model = load_model(tiny_gpt2.finetuned["ft0"], device="cpu")
    cfg = base_model.config
    assert cfg.tie_word_embeddings
    base_sd = {k: v.clone() for k, v in base_model.state_dict().items()}
    ft_sd = {k: v.clone() for k, v in ft_model.state_dict().items()}
    assert "lm_head.weight" in base_sd  # the state-dict path holds the tied tensor under both names
    a = [0.1, 0.5]
    out = merge_state_dicts("hma", base_sd, [ft_sd], alphas=a, config=cfg)
    want = base_sd["transformer.wte.weight"] + 0.1 * (ft_sd["transformer.wte.weight"] - base_sd["transformer.wte.weight"])
    torch.testing.assert_close(out["transformer.wte.weight"], want)
    torch.testing.assert_close(out["lm_head.weight"], want)  # not the last block's 0.5
    base_model.load_state_dict(out)
    torch.testing.assert_close(base_model.transformer.wte.weight.detach(), want)
    # the streaming path (checkpoint files store wte only) gives the same embedding
    assert "lm_head.weight" not in open_checkpoint(tiny_gpt2.base).names()
    from forgetlab.merge import run
    res = run({"method": "hma", "base": str(tiny_gpt2.base), "models": [str(tiny_gpt2.finetuned["ft0"])],
               "params": {"alphas": a}}, tmp_path / "hma")
    torch.testing.assert_close(open_checkpoint(res.out_dir).read("transformer.wte.weight"), want)
    # the final norm keeps the last block's α
    torch.testing.assert_close(out["transformer.ln_f.weight"],
                               base_sd["transformer.ln_f.weight"] + 0.5 * (ft_sd["transformer.ln_f.weight"]
                                                                           - base_sd["transformer.ln_f.weight"]))
