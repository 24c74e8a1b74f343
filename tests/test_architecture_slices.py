"""Head, attention, MLP, layer and expert NLS of every tested decoder family against an independent reference that
uses transformers alone: the module inputs captured with plain hooks, a deep copy of the base model with θ0 + α·τ
written into that submodule's parameters, the transformers module re-run on the captured inputs, head h's
contribution read with every other head's output-projection columns (and its bias) zeroed, expert e's output read
from the experts module with the captured routing and weight 1 on e, 0 on the others; d(α) and NLS in numpy."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from forgetlab.analysis.linearity import nonlinearity_scores
from forgetlab.core.data import TaskPair
from forgetlab.core.submodules import encode_samples
from tests.architectures import FAMILIES, MOE_FAMILIES, tiny_model

PAIRS = [TaskPair(f"{a}+{b}=", str(a + b)) for a, b in [(1, 2), (3, 4), (5, 6), (7, 1), (2, 8)]]
ALPHAS = tuple(round(0.1 * i, 1) for i in range(10))
SAMPLES = 3


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return AutoTokenizer.from_pretrained(str(tiny_llama.base))


def _pair(family, tok):
    """A base of `family` (float64; float32 for a mixture of experts, whose grouped experts kernel takes no
    float64) and a fine-tuned copy: every parameter moved by seeded noise."""
    base = tiny_model(family, len(tok), bos=tok.bos_token_id, eos=tok.eos_token_id, pad=tok.pad_token_id)
    if family not in MOE_FAMILIES:
        base = base.double()
    ft = copy.deepcopy(base)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ft.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype) * (p.abs().mean() + 0.02))
    return base, ft


def _parts(model):
    """layer i → its decoder layer, attention, output projection (+ whether Conv1D), MLP and experts module: found
    by hand per family's transformers module names, not through forgetlab."""
    inner = getattr(model, "model", None) or getattr(model, "transformer", None) or getattr(model, "gpt_neox")
    layers = getattr(inner, "layers", None) or getattr(inner, "h")
    out = []
    for layer in layers:
        attn = getattr(layer, "self_attn", None) or getattr(layer, "attn", None) or getattr(layer, "attention")
        o = getattr(attn, "o_proj", None) or getattr(attn, "c_proj", None) or getattr(attn, "dense")
        mlp = layer.mlp
        out.append(dict(layer=layer, attn=attn, o=o, conv1d=type(o).__name__ == "Conv1D", mlp=mlp,
                        experts=getattr(mlp, "experts", None)))
    return out


def _capture(model, ids):
    """Each layer's, attention's, MLP's and experts module's (args, kwargs) in one forward pass of `model`."""
    got, handles = [], []
    for parts in _parts(model):
        slot = {}
        got.append(slot)
        for name in ("layer", "attn", "mlp", "experts"):
            if parts[name] is not None:
                def pre(mod, args, kwargs, slot=slot, name=name):
                    slot[name] = (tuple(args), dict(kwargs))
                handles.append(parts[name].register_forward_pre_hook(pre, with_kwargs=True))
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for h in handles:
        h.remove()
    return got


def _set(copy_model, base, ft, module, alpha):
    """`module` of the copy (a module of `copy_model`) to θ0 + α·(θ1 − θ0), its parameters found by name."""
    names = {id(p): n for n, p in copy_model.named_parameters()}
    p0, p1 = dict(base.named_parameters()), dict(ft.named_parameters())
    with torch.no_grad():
        for p in module.parameters():
            n = names[id(p)]
            p.copy_(p0[n] + alpha * (p1[n] - p0[n]))


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _head_output(parts, args, kwargs, head, head_dim):
    """Head `head`'s contribution: the attention re-run with every other head's output-projection columns (rows
    of a Conv1D) and the bias zeroed."""
    o = parts["o"]
    w, b = o.weight.detach().clone(), None if o.bias is None else o.bias.detach().clone()
    keep = torch.zeros_like(w)
    cols = slice(head * head_dim, (head + 1) * head_dim)
    if parts["conv1d"]:
        keep[cols, :] = 1
    else:
        keep[:, cols] = 1
    try:
        with torch.no_grad():
            o.weight.mul_(keep)
            if b is not None:
                o.bias.zero_()
            return _first(parts["attn"](*args, **kwargs))
    finally:
        with torch.no_grad():
            o.weight.copy_(w)
            if b is not None:
                o.bias.copy_(b)


def _expert_output(parts, args, kwargs, expert):
    """Expert `expert` alone on the tokens the router sent it: the experts module with the captured top-k
    indices and weight 1 where the index is `expert`, 0 elsewhere."""
    x, index = args[0], args[1]
    weights = (index == expert).to(x.dtype)
    return _first(parts["experts"](x, index, weights))


def _nls(feats, mask):
    """{α: [samples, seq, hidden]} → NLS per sample (numpy; NaN where f(0) = f(1))."""
    f = {a: (t.detach().double().reshape(mask.shape[0], mask.shape[1], -1) * mask[:, :, None]).numpy()
         for a, t in feats.items()}
    den = np.sqrt(((f[0.0] - f[1.0]) ** 2).sum(axis=(1, 2)))
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.stack([np.sqrt(((f[a] - f[1.0]) ** 2).sum(axis=(1, 2))) / den for a in ALPHAS], axis=1)
    d[den <= 1e-12] = np.nan
    return np.abs(d - (1.0 - np.asarray(ALPHAS))[None, :]).sum(axis=1)


def _reference(family, base, ft, tok, head_dim, num_heads, num_experts):
    enc = encode_samples(tok, PAIRS[:SAMPLES])
    ids, mask = enc.input_ids, enc.mask().double()
    caps = _capture(ft, ids)
    out = {}
    work = copy.deepcopy(base)
    for i, (parts, cap) in enumerate(zip(_parts(work), caps)):
        feats: dict = {}
        for alpha in (1.0,) + ALPHAS:
            _set(work, base, ft, parts["layer"], alpha)   # every part of layer i at θ0 + α·τ
            with torch.no_grad():
                feats.setdefault(("layer", i, None), {})[alpha] = _first(parts["layer"](*cap["layer"][0],
                                                                                        **cap["layer"][1]))
                feats.setdefault(("attn", i, None), {})[alpha] = _first(parts["attn"](*cap["attn"][0],
                                                                                      **cap["attn"][1]))
                feats.setdefault(("mlp", i, None), {})[alpha] = _first(parts["mlp"](*cap["mlp"][0], **cap["mlp"][1]))
                for h in range(num_heads):
                    feats.setdefault(("head", i, h), {})[alpha] = _head_output(parts, *cap["attn"], h, head_dim)
                for e in range(num_experts):
                    feats.setdefault(("expert", i, e), {})[alpha] = _expert_output(parts, *cap["experts"], e)
        _set(work, base, base, parts["layer"], 0.0)
        out.update({k: _nls(v, mask) for k, v in feats.items()})
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_every_level_equals_the_patching_reference(family, tok):
    base, ft = _pair(family, tok)
    moe = family in MOE_FAMILIES
    levels = ("layer", "attn", "mlp", "head") + (("expert",) if moe else ())
    res = nonlinearity_scores((base, ft, tok, PAIRS), "math", levels=levels, samples=SAMPLES, batch_size=8)
    a = res.scores[0]
    from forgetlab.core.anatomy import Anatomy

    anat = Anatomy.from_model(base)
    ref = _reference(family, base, ft, tok, anat.head_dim, anat.num_heads, anat.num_experts if moe else 0)
    got = {(s.level, s.layer, s.head): s.nls for s in res.scores}
    assert set(got) == set(ref), (sorted(set(got) ^ set(ref)))
    assert a.nls.shape == (SAMPLES,)
    for key, want in ref.items():
        np.testing.assert_allclose(got[key], want, atol=1e-5, rtol=0, err_msg=f"{family} {key}")
    finite = np.concatenate([v for v in ref.values()])
    assert np.isfinite(finite).mean() > 0.9 and np.nanmax(finite) > 0.01   # the reference is not vacuous


def test_expert_level_is_refused_on_a_dense_model(tok):
    from forgetlab.core.errors import ForgetlabError

    base, ft = _pair("llama", tok)
    with pytest.raises(ForgetlabError, match="no experts.*'expert' level is for a mixture of experts"):
        nonlinearity_scores((base, ft, tok, PAIRS), "math", levels=("expert",), samples=2)


def test_default_levels_are_the_models_own(tok):
    """Without levels=, a MoE is scored at every level including expert; a dense model at the dense ones."""
    for family, want in (("mixtral", {"model", "layer", "attn", "mlp", "head", "expert"}),
                         ("phi3", {"model", "layer", "attn", "mlp", "head"})):
        base, ft = _pair(family, tok)
        res = nonlinearity_scores((base, ft, tok, PAIRS), "math", samples=2, alphas=(0.0, 0.5))
        assert set(res.levels) == want and {s.level for s in res.scores} == want


# ------------------------------------------------------------------ t-SNE features at head and expert level

def test_pooling_keeps_only_routed_tokens():
    from forgetlab.analysis.features import _pool_rows

    x = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)  # sample 0: 0..3, sample 1: 4..7
    lengths, starts = torch.tensor([4, 3]), torch.tensor([1, 1])
    keep = torch.tensor([[True, False, True, True], [True, False, False, True]])
    # sample 0: answer tokens 1..3, routed 2 and 3 → mean(2, 3); sample 1: answer 1..2, none routed → 0
    assert _pool_rows(x, lengths, starts, "answer", keep).flatten().tolist() == [2.5, 0.0]
    assert _pool_rows(x, lengths, starts, "last", keep).flatten().tolist() == [3.0, 0.0]


@pytest.mark.parametrize("family", ["gpt2", "phi3", "gpt_neox", "gemma2", "olmo2", "granite"])
def test_head_features_sum_to_the_attention_features(family, tok):
    from forgetlab.analysis.features import capture_features

    base, ft = _pair(family, tok)
    data = ({"ft": ft}, tok, {"math": PAIRS})
    attn = capture_features(data, level="attn", layer=0, samples=4)
    heads = [capture_features(data, level="head", layer=0, head=h, samples=4) for h in range(4)]
    o = _parts(ft)[0]["o"]
    bias = 0.0 if o.bias is None else o.bias.detach().double().numpy()
    np.testing.assert_allclose(sum(h.X for h in heads) + bias, attn.X, atol=1e-5)
    assert np.abs(heads[0].X - heads[1].X).max() > 1e-4


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_expert_features_are_the_expert_on_its_routed_last_token(family, tok):
    """pooling="last": expert e's output (act(x·W_gateᵀ) ⊙ x·W_upᵀ)·W_downᵀ from its 3-D weight slices on the
    last token when the router sent that token to e, else the zero vector."""
    from forgetlab.analysis.features import capture_features

    base, ft = _pair(family, tok)
    enc = encode_samples(tok, PAIRS[:4])
    experts = _parts(ft)[1]["experts"]
    caps = _capture(ft, enc.input_ids)
    x, index = caps[1]["experts"][0][:2]
    s = enc.input_ids.shape[1]
    rows = torch.arange(4) * s + enc.lengths - 1                  # each sample's last real token
    hit = 0
    for e in range(4):
        fs = capture_features(({"ft": ft}, tok, {"math": PAIRS}), level="expert", layer=1, head=e,
                              pooling="last", samples=4)
        gate, up = (x[rows] @ experts.gate_up_proj[e].T).chunk(2, dim=-1)
        want = (experts.act_fn(gate) * up) @ experts.down_proj[e].T
        routed = (index[rows] == e).any(-1)
        want = (want * routed[:, None]).detach().numpy()
        np.testing.assert_allclose(fs.X, want, atol=1e-5)
        hit += int(routed.sum())
    assert 0 < hit < 16
    with pytest.raises(Exception, match="expert's index"):
        capture_features(({"ft": ft}, tok, {"math": PAIRS}), level="expert", layer=1, head=9, samples=2)


def test_expert_rows_unchanged_expert_and_heatmap(tok):
    """An expert the fine-tune left alone scores NaN (like any unchanged submodule); the table names experts in its
    head column and the heatmap gives each expert its own row after the heads."""
    from forgetlab.analysis.linearity_results import NonlinearityResult, takeaway
    from forgetlab.core.anatomy import part_words
    from forgetlab.plots.linearity import nls_heatmap

    base, ft = _pair("mixtral", tok)
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            getattr(ft.model.layers[0].mlp.experts, name)[3].copy_(getattr(base.model.layers[0].mlp.experts, name)[3])
    res = nonlinearity_scores((base, ft, tok, PAIRS), "math", levels=("expert", "head"), samples=3,
                              alphas=(0.0, 0.5))
    assert np.isnan(res.get("expert", 0, 3).nls).all() and np.isfinite(res.get("expert", 0, 2).nls).all()
    df = res.to_frame()
    assert sorted(df[df.level == "expert"].module)[0] == "model.layers.0.mlp.experts.0"
    assert res.by_level().set_index("level").loc["expert", "unchanged"] == 1
    assert part_words(1, "expert", 2) == "layer 1's expert 2" and takeaway(res)
    rows = list(nls_heatmap(res).data[0].y)
    assert rows == [f"head {h}" for h in range(4)] + [f"expert {e}" for e in range(4)]
    back = NonlinearityResult.from_dict(res.to_dict())
    assert back.get("expert", 1, 2).nls_mean == pytest.approx(res.get("expert", 1, 2).nls_mean)


@pytest.mark.parametrize("family", ["phi3", "gemma2", "mixtral"])
def test_cached_scores_equal_direct_recomputation(family, tok):
    """`direct_scores` (a full forward pass per α with only that submodule moved; a head: only its slices) agrees
    with the cached-input scores on fused and soft-capped attention and on experts."""
    from forgetlab.analysis.linearity_reference import direct_scores

    base, ft = _pair(family, tok)
    levels = ("attn", "mlp", "head") + (("expert",) if family in MOE_FAMILIES else ())
    kw = dict(levels=levels, samples=2, alphas=(0.0, 0.3, 0.7))
    fast = {(s.level, s.layer, s.head): s.nls for s in nonlinearity_scores((base, ft, tok, PAIRS), "math", **kw).scores}
    slow = {(s.level, s.layer, s.head): s.nls for s in direct_scores((base, ft, tok, PAIRS), "math", **kw).scores}
    assert set(fast) == set(slow)
    for key in fast:
        np.testing.assert_allclose(fast[key], slow[key], atol=1e-5, err_msg=str(key))
