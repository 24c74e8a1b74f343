"""The 2024–25 closed-form merges (issue 26) against plain references written from the papers (numpy, float64,
computed another way than the methods), the issue's invariants, the engine on real checkpoints (HF folders and
PEFT adapters), pool-based RegMean / RegMean++ / Fisher against least squares and autograd, and bad input."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from forgetlab.core.checkpoints import open_checkpoint
from forgetlab.core.errors import ParameterError
from forgetlab.merge import merge_state_dicts, run
from forgetlab.merge.working_copy import TensorMerger

G = torch.Generator().manual_seed(7)


def _rand(*shape, scale=1.0):
    return scale * torch.randn(*shape, generator=G)


def _job(method, base, fts, name="model.layers.0.mlp.down_proj.weight", **params):
    return TensorMerger(method, params, n_models=len(fts))(name, base.clone(), *[f.clone() for f in fts])


def _np(t):
    return t.detach().double().numpy()


def _polar_np(a):
    p, _, qh = np.linalg.svd(a, full_matrices=False)
    return p @ qh


# ------------------------------------------------------------------------------------------- TSV-M


def _tsv_ref(taus, keep):
    us, ss, vs = [], [], []
    for t in taus:
        u, s, vh = np.linalg.svd(t, full_matrices=False)
        k = max(1, int(np.floor(keep * min(t.shape))))
        us.append(u[:, :k]), ss.append(s[:k]), vs.append(vh[:k].T)
    U, S, V = np.hstack(us), np.concatenate(ss), np.hstack(vs)
    return _polar_np(U) @ np.diag(S) @ _polar_np(V).T


@pytest.mark.parametrize("keep", [0.25, 0.5, 1.0 / 3])
def test_tsv_matches_reference(keep):
    base = _rand(12, 9)
    fts = [base + _rand(12, 9, scale=0.1) for _ in range(3)]
    got = _job("tsv", base, fts, alpha=0.7, keep=keep)
    exp = _np(base) + 0.7 * _tsv_ref([_np(f - base) for f in fts], keep)
    assert np.allclose(_np(got), exp, atol=2e-5)


def test_tsv_default_keep_is_one_over_t_and_other_tensors_take_task_arithmetic():
    base = _rand(10, 10)
    fts = [base + _rand(10, 10, scale=0.1) for _ in range(2)]
    assert torch.allclose(_job("tsv", base, fts), _job("tsv", base, fts, keep=0.5), atol=1e-6)
    b1 = _rand(10)
    f1 = [b1 + _rand(10, scale=0.1) for _ in range(2)]
    got = _job("tsv", b1, f1, name="model.norm.weight", alpha=0.5)
    assert torch.allclose(got, b1 + 0.5 * ((f1[0] - b1) + (f1[1] - b1)), atol=1e-6)
    emb = _rand(16, 8)
    fe = [emb + _rand(16, 8, scale=0.1) for _ in range(2)]       # the embedding is not a "2-D" weight
    got = _job("tsv", emb, fe, name="model.embed_tokens.weight")
    assert torch.allclose(got, emb + (fe[0] - emb) + (fe[1] - emb), atol=1e-6)


def test_tsv_keep_one_single_task_is_task_arithmetic():
    base = _rand(9, 14)
    ft = base + _rand(9, 14, scale=0.2)
    got = _job("tsv", base, [ft], alpha=0.8, keep=1.0)
    assert torch.allclose(got, base + 0.8 * (ft - base), atol=1e-5)


# ------------------------------------------------------------------------------------------- Iso-C / Iso-CTS


def test_iso_c_matches_reference_and_flattens_the_spectrum():
    base = _rand(11, 7)
    fts = [base + _rand(11, 7, scale=0.1) for _ in range(3)]
    got = _job("iso_c", base, fts, alpha=1.3)
    m = sum(_np(f - base) for f in fts)
    u, s, vh = np.linalg.svd(m, full_matrices=False)
    exp = _np(base) + 1.3 * s.mean() * (u @ vh)
    assert np.allclose(_np(got), exp, atol=2e-5)
    sv = np.linalg.svd(_np(got - base) / 1.3, compute_uv=False)
    assert np.allclose(sv, sv.mean(), rtol=1e-4)


def test_iso_c_of_an_isotropic_task_vector_is_task_arithmetic():
    q, _ = torch.linalg.qr(_rand(8, 8))
    base = _rand(8, 8)
    ft = base + 0.3 * q                                # all singular values 0.3
    got = _job("iso_c", base, [ft], alpha=0.6)
    assert torch.allclose(got, base + 0.6 * (ft - base), atol=1e-5)


def _iso_cts_ref(taus, common):
    T = len(taus)
    total = sum(taus)
    r = min(total.shape)
    kc = int(r * common)
    ts_total = round((r - kc) / T) * T
    kc = r - ts_total
    per = ts_total // T
    u, s, vh = np.linalg.svd(total, full_matrices=False)
    Uc = u[:, :kc]
    U, S, V = [Uc], [s[:kc]], [vh[:kc].T]
    for t in taus:
        proj = t - Uc @ Uc.T @ t                          # the common subspace projected out
        ut, st, vht = np.linalg.svd(proj, full_matrices=False)
        U.append(ut[:, :per]), S.append(st[:per]), V.append(vht[:per].T)
    S = np.concatenate(S)
    return S.mean() * _polar_np(np.hstack(U)) @ _polar_np(np.hstack(V)).T


@pytest.mark.parametrize("common", [0.8, 0.5])
def test_iso_cts_matches_reference(common):
    base = _rand(16, 12)
    fts = [base + _rand(16, 12, scale=0.1) for _ in range(2)]
    got = _job("iso_cts", base, fts, alpha=0.9, common=common)
    exp = _np(base) + 0.9 * _iso_cts_ref([_np(f - base) for f in fts], common)
    assert np.allclose(_np(got), exp, atol=2e-5)


# ------------------------------------------------------------------------------------------- CART


def test_cart_matches_reference_and_one_model_gives_it_back():
    base = _rand(20, 10)
    fts = [base + _rand(20, 10, scale=0.1) for _ in range(3)]
    got = _job("cart", base, fts, lam=0.5, rank=0.2)
    th = [_np(f) for f in fts]
    mean = sum(th) / 3
    exp = mean.copy()
    for t in th:
        u, s, vh = np.linalg.svd(t - mean, full_matrices=False)
        exp += 0.5 * (u[:, :2] * s[:2]) @ vh[:2]          # k = ⌊0.2·10⌋ = 2
    assert np.allclose(_np(got), exp, atol=2e-5)
    b = _rand(5)
    fb = [b + _rand(5) for _ in range(3)]
    assert torch.allclose(_job("cart", b, fb, name="model.norm.weight"), torch.stack(fb).mean(0), atol=1e-6)
    assert torch.allclose(_job("cart", base, fts[:1]), fts[0], atol=1e-6)


# ------------------------------------------------------------------------------------------- rank-deficient stacks


def _outside_span(delta, taus):
    """The share of ‖delta‖ outside the span of the τt: its part beyond their column space or their row space."""
    def basis(m):
        u, s, _ = np.linalg.svd(m, full_matrices=False)
        return u[:, : int((s > s[0] * 1e-5).sum())]
    p, q = basis(np.hstack(taus)), basis(np.vstack(taus).T)
    inside = p @ (p.T @ delta @ q) @ q.T
    return float(np.linalg.norm(delta - inside) / np.linalg.norm(delta))


def _low_rank(m, n, r, scale=0.1):
    return _rand(m, r, scale=scale) @ _rand(r, n)


@pytest.mark.parametrize("method,params", [("tsv", {}), ("tsv", {"keep": 1.0}), ("iso_cts", {}),
                                           ("iso_cts", {"common": 0.5}), ("iso_c", {}), ("cart", {"rank": 0.5})])
@pytest.mark.parametrize("case", ["identical", "collinear", "low_rank"])
def test_spectral_merges_of_degenerate_task_vectors_stay_in_their_span(method, params, case):
    """`models: [ft1, ft1_copy]` (identical τ), τ2 = −0.5·τ1 (collinear) or two rank-2 τ: the stacked singular vectors
    are rank-deficient, and their polar factor (tsv, iso_cts) or a flat spectrum (iso_c, iso_cts) used to put most
    of the update in arbitrary directions (0.53 of tsv's norm, 0.97 of iso_cts'); the merged Δ lies in the span of the
    τt (their column and row spaces)."""
    base = _rand(24, 16)
    t1 = _rand(24, 16, scale=0.1) if case != "low_rank" else _low_rank(24, 16, 2)
    t2 = {"identical": t1.clone(), "collinear": -0.5 * t1, "low_rank": _low_rank(24, 16, 2)}[case]
    got = _job(method, base, [base + t1, base + t2], **params)
    delta = _np(got - base) if method != "cart" else _np(got - (base + (t1 + t2) / 2))
    taus = [_np(t1), _np(t2)] if method != "cart" else [_np(t1 - t2) / 2]
    if np.linalg.norm(delta) < 1e-5 * np.linalg.norm(_np(t1)):     # nothing to place (cart: centred τs cancel)
        return
    assert _outside_span(delta, taus) < 1e-4


def test_tsv_of_identical_task_vectors_is_their_shared_truncation():
    """Two copies of one τ: each direction once, with its singular value (the polar factors of the doubled stacks
    restricted to their column space), i.e. τ's own top-k truncation."""
    base, tau = _rand(20, 12), _rand(20, 12, scale=0.1)
    got = _job("tsv", base, [base + tau, base + tau], keep=0.25)
    u, s, vh = np.linalg.svd(_np(tau), full_matrices=False)
    assert np.allclose(_np(got - base), (u[:, :3] * s[:3]) @ vh[:3], atol=2e-5)


# ------------------------------------------------------------------------------------------- LiNeS


def _lines_lambda(name, L, alpha, beta):
    m = re.search(r"layers\.(\d+)\.", name)
    ell = int(m.group(1)) + 1 if m else (L if ("norm" in name or "lm_head" in name) else 1)
    return alpha + beta * (ell - 1) / (L - 1)


def test_lines_scales_each_layer_of_the_summed_task_vectors(tiny_llama):
    base = open_checkpoint(tiny_llama.base)
    fts = [open_checkpoint(p) for p in tiny_llama.finetuned.values()]
    b = base.state_dict(torch.float32)
    f = [c.state_dict(torch.float32) for c in fts]
    got = merge_state_dicts("lines", b, f, config=base.config, alpha=0.3, beta=0.6, weights=[1.0, 0.5])
    L = base.config.num_hidden_layers
    lams = set()
    for n in b:
        lam = _lines_lambda(n, L, 0.3, 0.6)
        lams.add(round(lam, 6))
        exp = b[n] + lam * ((f[0][n] - b[n]) + 0.5 * (f[1][n] - b[n]))
        assert torch.allclose(got[n].float(), exp, atol=1e-6), n
    assert lams == {0.3, 0.9}                               # two layers: ℓ = 1 and ℓ = L


# ------------------------------------------------------------------------------------------- Localize-and-Stitch


def _stitch_ref(base, taus, masks):
    num = sum(m * t for m, t in zip(masks, taus))
    return base + num / np.maximum(1, sum(masks))


def test_localize_stitch_per_tensor_matches_reference():
    base = _rand(40)
    fts = [base + _rand(40) for _ in range(3)]
    got = _job("localize_stitch", base, fts, name="model.norm.weight", keep=0.25, scope="tensor")
    taus = [_np(f - base) for f in fts]
    masks = [(np.abs(t) >= np.sort(np.abs(t))[-10]).astype(float) for t in taus]
    assert np.allclose(_np(got), _stitch_ref(_np(base), taus, masks), atol=1e-6)
    assert torch.allclose(_job("localize_stitch", base, fts[:1], keep=1.0, scope="tensor"), fts[0], atol=1e-6)


def test_localize_stitch_global_threshold_over_the_whole_model(tiny_llama):
    base = open_checkpoint(tiny_llama.base)
    b = base.state_dict(torch.float32)
    f = [open_checkpoint(p).state_dict(torch.float32) for p in tiny_llama.finetuned.values()]
    got = merge_state_dicts("localize_stitch", b, f, keep=0.1)
    names = list(b)
    cuts = []
    for ft in f:
        allabs = np.concatenate([np.abs(_np(ft[n] - b[n])).ravel() for n in names])
        cuts.append(np.sort(allabs)[-int(0.1 * allabs.size)])
    for n in names:
        taus = [_np(ft[n] - b[n]) for ft in f]
        masks = [(np.abs(t) >= c).astype(float) for t, c in zip(taus, cuts)]
        assert np.allclose(_np(got[n]), _stitch_ref(_np(b[n]), taus, masks), atol=1e-6), n


# ------------------------------------------------------------------------------------------- engine, adapters, knots


def _make_lora(pool, tmp_path, seed, name):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(pool.base))
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                  lora_dropout=0.0))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    out = tmp_path / name
    peft_model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def loras(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    return [_make_lora(tiny_llama, root, s, f"lora{s}") for s in (1, 2)]


def _folder(path: Path) -> dict:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _ties_np(vs, keep):
    trimmed = []
    for v in vs:
        k = max(1, int(keep * v.size))
        cut = np.sort(np.abs(v).ravel())[-k]
        trimmed.append(np.where(np.abs(v) >= cut, v, 0.0))
    st = np.stack(trimmed)
    sign = np.where(st.sum(0) >= 0, 1.0, -1.0)
    agree = (np.sign(st) == sign)
    return (st * agree).sum(0) / np.maximum(1, agree.sum(0))


def test_knots_on_lora_adapters(tiny_llama, loras, tmp_path):
    base = open_checkpoint(tiny_llama.base)
    cks = [open_checkpoint(p, base=base) for p in loras]
    target = cks[0].delta_names()[0]
    deltas = [_np(c.delta(target)) for c in cks]
    res = run({"method": "knots", "base": str(tiny_llama.base), "models": [str(p) for p in loras],
               "params": {"method": "task_arithmetic", "lam": 0.7}}, tmp_path / "ta")
    got = _folder(res.out_dir)
    assert np.allclose(_np(got[target]), _np(base.read(target)) + 0.7 * sum(deltas), atol=1e-5)
    assert torch.equal(got["model.embed_tokens.weight"], base.read("model.embed_tokens.weight"))
    res = run({"method": "knots", "base": str(tiny_llama.base), "models": [str(p) for p in loras],
               "params": {"method": "ties", "keep": 0.3}}, tmp_path / "ties")
    got = _folder(res.out_dir)
    n = deltas[0].shape[1]
    u, s, vh = np.linalg.svd(np.hstack(deltas), full_matrices=False)
    r = int((s > s[0] * max(u.shape[0], vh.shape[1]) * np.finfo(np.float32).eps).sum())
    vs = [vh[:r, i * n:(i + 1) * n] for i in range(2)]
    exp = _np(base.read(target)) + (u[:, :r] * s[:r]) @ _ties_np(vs, 0.3)
    assert np.allclose(_np(got[target]), exp, atol=2e-4)


def test_bad_input_exits_2(tiny_llama, loras, tmp_path, capsys):
    import yaml

    from forgetlab.cli import main

    def recipe(method, models, **params):
        p = tmp_path / f"{method}-{len(list(tmp_path.iterdir()))}.yaml"
        p.write_text(yaml.safe_dump({"method": method, "base": str(tiny_llama.base),
                                     "models": [str(m) for m in models], "params": params}))
        return str(p)

    cases = [("tsv", [loras[0]], "adapter"), ("knots", list(tiny_llama.finetuned.values()), "LoRA adapters"),
             ("regmean", list(tiny_llama.finetuned.values()), "pool"),
             ("fisher", list(tiny_llama.finetuned.values()), "pool")]
    for method, models, msg in cases:
        out = tmp_path / f"out-{method}"
        assert main(["merge", recipe(method, models), str(out)]) == 2
        assert msg in capsys.readouterr().err
        assert not out.exists()
    from forgetlab.merge.mergekit_export import to_mergekit
    from forgetlab.merge.recipe_io import load_recipe
    for method in ("lines", "tsv", "iso_c", "iso_cts", "cart", "localize_stitch", "knots", "regmean", "fisher"):
        r = load_recipe({"method": method, "base": str(tiny_llama.base), "models": [str(tiny_llama.finetuned["ft0"])]})
        with pytest.raises(ParameterError, match="no mergekit counterpart"):
            to_mergekit(r)


def test_streamed_merges_equal_in_memory(tiny_llama, tmp_path):
    base = open_checkpoint(tiny_llama.base)
    b = base.state_dict(torch.float32)
    f = [open_checkpoint(p).state_dict(torch.float32) for p in tiny_llama.finetuned.values()]
    for method, params in [("tsv", {"keep": 0.25}), ("iso_c", {"alpha": 1.2}), ("iso_cts", {}),
                           ("cart", {"rank": 0.3}), ("lines", {"beta": 0.4}),
                           ("localize_stitch", {"keep": 0.2})]:
        res = run({"method": method, "base": str(tiny_llama.base),
                   "models": [str(p) for p in tiny_llama.finetuned.values()], "params": params},
                  tmp_path / method)
        got = _folder(res.out_dir)
        mem = merge_state_dicts(method, b, f, config=base.config, **params)
        for n in b:
            assert torch.allclose(got[n].float(), mem[n].float(), atol=1e-6), (method, n)


# ------------------------------------------------------------------------------------------- pool methods


def _ids(pool, task, samples):
    from forgetlab.core.submodules import encode_samples, select_pairs
    return encode_samples(pool.tokenizer, select_pairs(pool.probes.tasks[task].probe, samples, task), max_length=128)


def _inputs(model, module_path, enc):
    """Inputs of one module on the encoded samples (real tokens), captured with a plain hook."""
    seen = []
    mod = model.get_submodule(module_path)
    h = mod.register_forward_hook(lambda m, i, o: seen.append(i[0].detach()))
    try:
        with torch.no_grad():
            for a in range(len(enc)):
                one = enc.chunk(a, a + 1)
                model(input_ids=one.input_ids)
    finally:
        h.remove()
    return torch.cat([s[0] for s in seen]).double().numpy()


def _lstsq_merge(xs, ws):
    """argmin Σt ‖Xt·W − Xt·Wtᵀ‖² / nt (plain least squares on stacked, normalised inputs); W stored (out, in)."""
    a = np.vstack([x / np.sqrt(len(x)) for x in xs])
    b = np.vstack([x @ w.T / np.sqrt(len(x)) for x, w in zip(xs, ws)])
    return np.linalg.lstsq(a, b, rcond=None)[0].T


def test_regmean_is_least_squares_on_each_models_inputs(pool, tiny_llama, tmp_path):
    names = ["ft0", "ft1"]
    res = run({"method": "regmean", "base": str(tiny_llama.base), "models": [str(tiny_llama.finetuned[n]) for n in names],
               "params": {"alpha": 1.0, "samples": 4, "tasks": "math,copy"}}, tmp_path / "rm", pool=pool)
    got = _folder(res.out_dir)
    path = "model.layers.1.mlp.up_proj"        # 32 inputs: well determined by the probe tokens
    xs = [_inputs(pool.load(n), path, _ids(pool, t, 4)) for n, t in zip(names, ["math", "copy"])]
    ws = [_np(dict(pool.load(n).named_parameters())[path + ".weight"]) for n in names]
    assert np.allclose(_np(got[path + ".weight"]), _lstsq_merge(xs, ws), atol=2e-4)
    norm = "model.layers.0.input_layernorm.weight"
    mean = (dict(pool.load("ft0").named_parameters())[norm] + dict(pool.load("ft1").named_parameters())[norm]) / 2
    assert torch.allclose(got[norm], mean.detach(), atol=1e-6)


def test_regmean_pp_first_layer_reads_the_averaged_embeddings(pool, tiny_llama, tmp_path):
    import copy
    names = ["ft0", "ft1"]
    res = run({"method": "regmean_pp", "base": str(tiny_llama.base),
               "models": [str(tiny_llama.finetuned[n]) for n in names],
               "params": {"alpha": 1.0, "samples": 4, "tasks": "math,copy"}}, tmp_path / "pp", pool=pool)
    got = _folder(res.out_dir)
    emb = "model.embed_tokens.weight"
    mean_emb = sum(dict(pool.load(n).named_parameters())[emb].detach() for n in names) / 2
    path = "model.layers.0.mlp.up_proj"       # after attention: inputs span all 32 directions
    xs = []
    for n, t in zip(names, ["math", "copy"]):
        m = copy.deepcopy(pool.load(n))
        with torch.no_grad():
            m.get_submodule("model.embed_tokens").weight.copy_(mean_emb)
        xs.append(_inputs(m, path, _ids(pool, t, 4)))
    ws = [_np(dict(pool.load(n).named_parameters())[path + ".weight"]) for n in names]
    assert np.allclose(_np(got[path + ".weight"]), _lstsq_merge(xs, ws), atol=2e-4)
    assert torch.allclose(got[emb], mean_emb, atol=1e-6)


@pytest.mark.parametrize("method", ["regmean", "regmean_pp", "fisher"])
def test_pool_methods_one_model_in_gives_it_back(pool, tiny_llama, tmp_path, method):
    params = {"samples": 3, "tasks": "math"}
    if method != "fisher":
        params["alpha"] = 1.0
    res = run({"method": method, "base": str(tiny_llama.base), "models": [str(tiny_llama.finetuned["ft0"])],
               "params": params}, tmp_path / method, pool=pool)
    got = _folder(res.out_dir)
    ft = open_checkpoint(tiny_llama.finetuned["ft0"]).state_dict(torch.float32)
    for n, t in ft.items():
        assert torch.allclose(got[n].float(), t, atol=2e-4), n


def test_fisher_weights_by_squared_answer_gradients(pool, tiny_llama, tmp_path):
    from forgetlab.core.data import encode_pairs
    from forgetlab.core.submodules import select_pairs

    names, tasks = ["ft0", "ft1"], ["math", "copy"]
    res = run({"method": "fisher", "base": str(tiny_llama.base), "models": [str(tiny_llama.finetuned[n]) for n in names],
               "params": {"samples": 3, "tasks": ",".join(tasks), "eps": 1e-8}}, tmp_path / "fi", pool=pool)
    got = _folder(res.out_dir)
    import copy
    fishers = []
    for n, t in zip(names, tasks):
        m = copy.deepcopy(pool.load(n))
        acc = {k: torch.zeros_like(p) for k, p in m.named_parameters()}
        exs = encode_pairs(pool.tokenizer, select_pairs(pool.probes.tasks[t].probe, 3, t), max_length=128)
        for e in exs:
            ids = torch.tensor([e.input_ids])
            labels = torch.tensor([e.labels])
            out = m(input_ids=ids, labels=labels)          # HF's mean NLL over answer tokens
            n_ans = int((labels[0, 1:] != -100).sum())
            m.zero_grad()
            (out.loss * n_ans).backward()
            for k, p in m.named_parameters():
                acc[k] += p.grad.detach() ** 2
        fishers.append({k: v / len(exs) for k, v in acc.items()})
    thetas = [dict(pool.load(n).named_parameters()) for n in names]
    for k in ["model.layers.0.mlp.up_proj.weight", "model.norm.weight", "model.embed_tokens.weight"]:
        w = [fishers[i][k] + 1e-8 for i in range(2)]
        exp = (w[0] * thetas[0][k].detach() + w[1] * thetas[1][k].detach()) / (w[0] + w[1])
        assert torch.allclose(got[k], exp, atol=1e-5, rtol=1e-4), k


def test_fisher_eps_zero_is_the_limit_of_the_formula(pool, tiny_llama, tmp_path):
    """eps = 0 lies in fisher's documented range: it used to make 0/0 where no Fisher covers an entry (the rows of
    tokens no probe pair uses) and stop with "NaN/Inf … from finite inputs … use smaller coefficients". It is the
    limit eps → 0⁺: Σt Ft⊙θt / Σt Ft where some Ft > 0, the mean of the θt where all are 0."""
    from forgetlab.merge.methods.fisher import fisher_average

    th = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 6.0, 9.0])]
    f = [torch.tensor([1.0, 0.0, 0.0]), torch.tensor([3.0, 2.0, 0.0])]
    assert torch.allclose(fisher_average(th, f, 0.0), torch.tensor([2.5, 6.0, 6.0]))
    assert torch.allclose(fisher_average(th, f, 1e-12), torch.tensor([2.5, 6.0, 6.0]))
    res = run({"method": "fisher", "base": str(tiny_llama.base), "models": [str(p) for p in tiny_llama.finetuned.values()],
               "params": {"samples": 2, "tasks": "math,copy", "eps": 0.0}}, tmp_path / "fi", pool=pool)
    got = _folder(res.out_dir)
    near = _folder(run({"method": "fisher", "base": str(tiny_llama.base),
                        "models": [str(p) for p in tiny_llama.finetuned.values()],
                        "params": {"samples": 2, "tasks": "math,copy", "eps": 1e-30}}, tmp_path / "fn", pool=pool).out_dir)
    for k in got:
        assert torch.isfinite(got[k]).all(), k
        assert torch.allclose(got[k], near[k], atol=1e-6), k


def test_fisher_with_a_nan_fine_tune_names_the_model_and_tensor(tiny_llama, tmp_path):
    """A NaN in a fine-tune's later layer makes its whole Fisher NaN; the merge used to stop at the first tensor
    with "produced NaN/Inf … from finite inputs … use smaller coefficients". It names the model and the tensor."""
    import shutil
    import warnings

    from safetensors.torch import save_file

    from forgetlab.core.errors import CheckpointError
    from forgetlab.core.pool import ModelPool

    root = tmp_path / "pool"
    shutil.copytree(tiny_llama.root, root)
    f = root / "ft1" / "model.safetensors"
    sd = load_file(str(f))
    bad = "model.layers.1.mlp.down_proj.weight"
    sd[bad][0, 0] = float("nan")
    save_file(sd, str(f), metadata={"format": "pt"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = ModelPool.from_yaml(root / "pool.yaml")
    with pytest.raises(CheckpointError) as err:
        run({"method": "fisher", "base": str(root / "base"), "models": [str(root / "ft0"), str(root / "ft1")],
             "params": {"samples": 2, "tasks": "math,copy"}}, tmp_path / "out", pool=p)
    msg = str(err.value)
    assert "ft1" in msg and bad in msg and "smaller coefficients" not in msg
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("method", ["regmean", "regmean_pp", "fisher", "slwm"])
def test_pool_methods_name_themselves_for_a_model_outside_the_pool(pool, tiny_llama, tmp_path, method):
    """The pool-membership check is shared (slwm.pool_names_for); regmean's message used to start with "slwm:"."""
    import shutil

    outside = tmp_path / "ft0-copy"
    shutil.copytree(tiny_llama.finetuned["ft0"], outside)
    with pytest.raises(ParameterError) as err:
        run({"method": method, "base": str(tiny_llama.base), "models": [str(outside), str(tiny_llama.finetuned["ft1"])],
             "params": {"samples": 2}}, tmp_path / "out", pool=pool)
    assert str(err.value).startswith(f"{method}: model ") and "not a member of the pool" in str(err.value)
