"""The sequential merges of issue 44, MagMax and OPCM: hand-computed merges of 2×2 weights, an independent numpy
reference of OPCM written from the paper (full SVD bases, the mask applied as written), the invariants (one model,
the merged norm, basis independence, the order), the engine on HF folders and PEFT adapters, and bad input.
fusion-bench's own implementations: tests/test_merge_fusionbench_sequential.py."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from forgetlab.cli import main
from forgetlab.core.checkpoints import open_checkpoint
from forgetlab.core.errors import ParameterError
from forgetlab.merge import METHODS, merge_state_dicts, run
from forgetlab.merge.methods.opcm import split_rank
from forgetlab.merge.mergekit_export import to_mergekit
from forgetlab.merge.recipe_io import load_recipe
from forgetlab.merge.working_copy import TensorMerger

W = "model.layers.0.mlp.up_proj.weight"
NORM = "model.layers.0.input_layernorm.weight"


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def _models(base: dict, *taus: dict) -> list[dict]:
    return [{n: base[n] + tau[n] for n in base} for tau in taus]


# ------------------------------------------------------------------------------------------------------- MagMax


def test_magmax_by_hand_keeps_the_largest_magnitude_and_the_later_model_at_ties():
    base = {W: _t([[1, 2], [3, 4]]), NORM: _t([1, 1])}
    tau1 = {W: _t([[0.25, -1], [2, 0]]), NORM: _t([0.5, -0.5])}
    tau2 = {W: _t([[-0.25, 0.5], [-3, 0.125]]), NORM: _t([0.5, 0.25])}
    got = merge_state_dicts("magmax", base, _models(base, tau1, tau2))           # λ = 0.5, the default
    # selected: [[-0.25 (tie: the later), -1], [-3, 0.125]] and [0.5 (tie, same sign), -0.5]
    assert torch.equal(got[W], _t([[1 - 0.125, 2 - 0.5], [3 - 1.5, 4 + 0.0625]]))
    assert torch.equal(got[NORM], _t([1.25, 0.75]))
    back = merge_state_dicts("magmax", base, _models(base, tau2, tau1), lam=1.0)  # reversed: ties go to τ1
    assert torch.equal(back[W], _t([[1.25, 1], [0, 4.125]]))


def test_magmax_of_one_model_is_the_base_plus_lambda_tau():
    g = torch.Generator().manual_seed(3)
    base = {W: torch.round(torch.randn(6, 4, generator=g) * 64) / 64, NORM: torch.ones(4)}
    tau = {W: torch.round(torch.randn(6, 4, generator=g) * 256) / 1024, NORM: torch.round(torch.randn(4, generator=g) * 256) / 1024}
    for lam in (0.5, 1.0, -0.25):
        got = merge_state_dicts("magmax", base, _models(base, tau), lam=lam)
        for n in base:
            assert torch.equal(got[n], base[n] + lam * tau[n]), (lam, n)   # dyadic values: exact


def test_magmax_equals_an_elementwise_reference_on_random_tensors():
    g = torch.Generator().manual_seed(4)
    base = {W: torch.randn(7, 5, generator=g)}
    taus = [{W: 0.1 * torch.randn(7, 5, generator=g)} for _ in range(4)]
    got = merge_state_dicts("magmax", base, _models(base, *taus), lam=0.8)
    stack = torch.stack([t[W] for t in taus])
    pick = stack.abs().argmax(0)                    # no ties among random floats
    ref = base[W] + 0.8 * torch.gather(stack, 0, pick[None])[0]
    torch.testing.assert_close(got[W], ref, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------------------- OPCM


def _norm(sd: dict) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in sd.values()))


def test_split_rank_counts_the_leading_singular_values_within_alpha():
    s = _t([4, 2, 1, 1])                         # cumulative shares 0.5, 0.75, 0.875, 1
    assert [split_rank(s, a) for a in (0.0, 0.49, 0.5, 0.8, 0.9, 1.0)] == [0, 0, 1, 2, 3, 4]


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_opcm_by_hand_on_two_models(alpha):
    """τ1 = diag(2, 1) (its own SVD: P = Q = I, shares 2/3 and 1). τ2 = [[1, 2], [2, 1]] in that basis: alpha = 0.5
    (k = 0) removes its diagonal, alpha = 1 (k = 2) all of it. The norm layer adds up. Then θ = θ0 + (mean ‖τt‖ /
    ‖U‖)·U, the norms over both tensors: ‖τ1‖² = 5 + 1, ‖τ2‖² = 10 + 4."""
    base = {W: _t([[1, -1], [0, 2]]), NORM: _t([1, 1])}
    tau1 = {W: _t([[2, 0], [0, 1]]), NORM: _t([1, 0])}
    tau2 = {W: _t([[1, 2], [2, 1]]), NORM: _t([0, 2])}
    got = merge_state_dicts("opcm", base, _models(base, tau1, tau2), alpha=alpha)
    u_w = _t([[2, 2], [2, 1]]) if alpha == 0.5 else _t([[2, 0], [0, 1]])
    u_n = _t([1, 2])
    scale = (math.sqrt(6) + math.sqrt(14)) / 2 / math.sqrt(float(u_w.pow(2).sum() + u_n.pow(2).sum()))
    torch.testing.assert_close(got[W], base[W] + scale * u_w, rtol=0, atol=1e-6)
    torch.testing.assert_close(got[NORM], base[NORM] + scale * u_n, rtol=0, atol=1e-6)


def test_opcm_of_one_model_is_that_model():
    """θ1 itself (fusion-bench's merged model starts as the first model), not θ0 + (θ1 − θ0) rounded twice."""
    g = torch.Generator().manual_seed(8)
    base = {W: 100 * torch.randn(5, 3, generator=g), NORM: 100 * torch.randn(3, generator=g)}
    ft = {n: 0.01 * torch.randn(t.shape, generator=g) for n, t in base.items()}     # far apart: θ0 + τ rounds
    assert not all(torch.equal(base[n] + (ft[n] - base[n]), ft[n]) for n in base)     # rounding would show
    got = merge_state_dicts("opcm", base, [ft], alpha=0.3)
    assert all(torch.equal(got[n], ft[n]) for n in base)


def _opcm_np(names, base, fts, alpha):
    """OPCM as the paper writes it, in float64: full SVD bases P, Q of the merged task vector M, X = Pᵀ·τ·Q with its
    diagonal and top-left k×k block zeroed, cleaned = P·X·Qᵀ; after each step M rescaled to the mean norm so far."""
    taus = [{n: ft[n].double().numpy() - base[n].double().numpy() for n in names} for ft in fts]
    norms = [math.sqrt(sum((t[n] ** 2).sum() for n in names)) for t in taus]
    merged, lam = dict(taus[0]), 1.0
    for t in range(1, len(taus)):
        new = {}
        for n in names:
            tau = taus[t][n]
            if tau.ndim == 2 and "lm_head" not in n and "embed" not in n:
                p, s, qh = np.linalg.svd(merged[n], full_matrices=True)
                share = np.cumsum(s) / s.sum()
                k = int((share <= alpha).sum())
                x = p.T @ tau @ qh.T
                np.fill_diagonal(x, 0.0)
                x[:k, :k] = 0.0
                tau = p @ x @ qh
            new[n] = lam * merged[n] + tau
        size = math.sqrt(sum((v ** 2).sum() for v in new.values()))
        avg = float(np.mean(norms[:t + 1]))
        lam = size / avg
        merged = {n: v / lam for n, v in new.items()}
    return {n: base[n].double().numpy() + merged[n] for n in names}


SHAPES = {"model.layers.0.self_attn.q_proj.weight": (6, 6), W: (8, 5), "model.layers.0.mlp.down_proj.weight": (5, 8),
          NORM: (6,), "model.embed_tokens.weight": (11, 6), "lm_head.weight": (11, 6)}


def _random_models(seed, n=3, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    base = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    return base, [{k: base[k] + 0.1 * torch.randn(s, generator=g) for k, s in shapes.items()} for _ in range(n)]


@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.8])
def test_opcm_equals_the_papers_formula_step_by_step(alpha):
    base, fts = _random_models(21)
    for t in (2, 3):
        got = merge_state_dicts("opcm", base, fts[:t], alpha=alpha)
        ref = _opcm_np(list(SHAPES), base, fts[:t], alpha)
        for n in SHAPES:
            np.testing.assert_allclose(got[n].double().numpy(), ref[n], rtol=0, atol=2e-6, err_msg=f"{t} {n}")


def test_opcm_merged_task_vector_has_the_mean_norm_and_the_embeddings_and_head_add_up():
    base, fts = _random_models(22)
    got = merge_state_dicts("opcm", base, fts)
    taus = [{n: ft[n] - base[n] for n in base} for ft in fts]
    merged = {n: got[n] - base[n] for n in base}
    assert _norm(merged) == pytest.approx(sum(_norm(t) for t in taus) / 3, rel=1e-5)
    head, emb = "lm_head.weight", "model.embed_tokens.weight"
    for n in (head, emb, NORM):                  # no projection: parallel to Σ τt
        plain = sum(t[n] for t in taus)
        cos = torch.nn.functional.cosine_similarity(merged[n].view(1, -1), plain.view(1, -1))
        assert float(cos) == pytest.approx(1.0, abs=1e-6), n


def test_opcm_does_not_depend_on_the_basis_of_the_weights():
    """Q·τt·Rᵀ for orthogonal Q, R (every model alike) merges to Q·merged·Rᵀ: the projection uses the merged task
    vector's singular subspaces, not the coordinates."""
    shapes = {W: (8, 5), NORM: (5,)}
    base, fts = _random_models(23, shapes=shapes)
    g = torch.Generator().manual_seed(1)
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=g))
    r, _ = torch.linalg.qr(torch.randn(5, 5, generator=g))
    rot = [{W: base[W] + q @ (ft[W] - base[W]) @ r.T, NORM: ft[NORM]} for ft in fts]
    a = merge_state_dicts("opcm", base, fts)
    b = merge_state_dicts("opcm", base, rot)
    torch.testing.assert_close(b[W] - base[W], q @ (a[W] - base[W]) @ r.T, rtol=0, atol=1e-5)
    torch.testing.assert_close(b[NORM], a[NORM], rtol=0, atol=1e-6)


def test_opcm_follows_the_order_of_the_models():
    base, fts = _random_models(24)
    a = merge_state_dicts("opcm", base, fts)
    b = merge_state_dicts("opcm", base, fts[::-1])
    assert not torch.allclose(a[W], b[W], atol=1e-4)
    da, db = a[NORM] - base[NORM], b[NORM] - base[NORM]      # sums: parallel, only the global scale differs
    torch.testing.assert_close(db, da * (db.norm() / da.norm()), rtol=0, atol=1e-6)


def test_opcm_adds_a_task_vector_whole_where_the_merged_one_is_still_zero():
    """A weight that the first fine-tune left unchanged: nothing to project away from (fusion-bench would zero the
    diagonal of τ2 in whatever basis its SVD of the zero matrix returns)."""
    base = {W: torch.zeros(2, 2), NORM: torch.zeros(2)}
    tau1 = {W: torch.zeros(2, 2), NORM: _t([3, 4])}
    tau2 = {W: _t([[1, 2], [3, 4]]), NORM: _t([0, 0])}
    got = merge_state_dicts("opcm", base, _models(base, tau1, tau2))
    scale = (5 + math.sqrt(30)) / 2 / math.sqrt(30 + 25)
    torch.testing.assert_close(got[W], scale * tau2[W], rtol=0, atol=1e-6)
    torch.testing.assert_close(got[NORM], scale * tau1[NORM], rtol=0, atol=1e-6)
    zero = merge_state_dicts("opcm", base, _models(base, tau1, tau1))       # a rank-deficient U: no NaN, in its span
    assert torch.equal(zero[W], torch.zeros(2, 2))


def test_opcm_needs_the_whole_model_so_it_is_not_a_per_tensor_merger():
    assert METHODS["opcm"].global_pass and not METHODS["magmax"].global_pass
    with pytest.raises(ParameterError, match="forgetlab.merge.run"):
        TensorMerger("opcm", {}, n_models=2)
    TensorMerger("magmax", {}, n_models=2)


# ------------------------------------------------------------------------------------------- engine, CLI, refusals


def _folder(path: Path) -> dict:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("method,params", [("magmax", {}), ("opcm", {"alpha": 0.7})])
def test_streamed_merge_equals_in_memory(tiny_llama, tmp_path, method, params):
    base = open_checkpoint(tiny_llama.base)
    b = base.state_dict(torch.float32)
    fts = [open_checkpoint(p).state_dict(torch.float32) for p in tiny_llama.finetuned.values()]
    res = run({"method": method, "base": str(tiny_llama.base),
               "models": [str(p) for p in tiny_llama.finetuned.values()], "params": params}, tmp_path / method)
    assert res.global_pass == (method == "opcm")
    got = _folder(res.out_dir)
    mem = merge_state_dicts(method, b, fts, **params)
    for n in got:
        torch.testing.assert_close(got[n], mem[n], rtol=0, atol=1e-6, msg=n)


def _lora(tiny_llama, root: Path, seed: int) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny_llama.base)),
                           LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], lora_dropout=0.0))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(str(root / f"lora{seed}"))
    return root / f"lora{seed}"


def test_both_merge_lora_adapters_as_their_task_vectors(tiny_llama, tmp_path):
    """An adapter's τ is its ΔW (rank 2 here): OPCM projects away from a rank-2 merged update, only over its two
    nonzero directions, and every tensor the adapters leave alone stays θ0."""
    loras = [_lora(tiny_llama, tmp_path, s) for s in (1, 2)]
    base = open_checkpoint(tiny_llama.base)
    b = base.state_dict(torch.float32)
    dense = [open_checkpoint(p, base=base).state_dict(torch.float32) for p in loras]
    for method in ("magmax", "opcm"):
        res = run({"method": method, "base": str(tiny_llama.base), "models": [str(p) for p in loras]},
                  tmp_path / method)
        got = _folder(res.out_dir)
        mem = merge_state_dicts(method, b, dense)
        q = "model.layers.0.self_attn.q_proj.weight"
        assert not torch.equal(got[q], b[q]) and torch.equal(got["model.norm.weight"], b["model.norm.weight"])
        for n in got:
            torch.testing.assert_close(got[n], mem[n], rtol=0, atol=1e-6, msg=(method, n))


def test_cli_merges_and_mergekit_export_refuses(tiny_llama, tmp_path, capsys):
    models = [str(p) for p in tiny_llama.finetuned.values()]
    for method in ("magmax", "opcm"):
        recipe = tmp_path / f"{method}.yaml"
        recipe.write_text(f"method: {method}\nbase: {tiny_llama.base}\nmodels: [{', '.join(models)}]\n")
        assert main(["merge", str(recipe), str(tmp_path / f"out-{method}")]) == 0
        assert (tmp_path / f"out-{method}" / "recipe.yaml").exists()
        with pytest.raises(ParameterError, match="no mergekit counterpart"):
            to_mergekit(load_recipe({"method": method, "base": str(tiny_llama.base), "models": models}))
    capsys.readouterr()
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"method: opcm\nbase: {tiny_llama.base}\nmodels: [{models[0]}]\nparams: {{alpha: 1.5}}\n")
    assert main(["merge", str(bad), str(tmp_path / "out-bad")]) == 2
    assert "alpha must lie in [0.0, 1.0]" in capsys.readouterr().err and not (tmp_path / "out-bad").exists()


@pytest.mark.parametrize("method,params,word", [("opcm", {"alpha": -0.1}, "alpha"), ("magmax", {"lam": 11}, "lam"),
                                                ("opcm", {"lam": 1.0}, "no parameter 'lam'")])
def test_bad_parameters_are_refused(method, params, word):
    base, fts = _random_models(25, n=2)
    with pytest.raises(ParameterError, match=word):
        merge_state_dicts(method, base, fts, **params)


@pytest.mark.parametrize("method", ["magmax", "opcm"])
def test_merge_page_offers_and_runs_them_from_the_registry(tiny_llama, tmp_path, monkeypatch, method):
    """The Merge page lists the registry: each method shows its parameter with its default and merges, the models
    in the order picked (one model too: a merge chain's first stage)."""
    import yaml

    from tests.jobs_helper import finish_cleanly, start_page

    at = start_page("merge", tiny_llama.pool_yaml, tmp_path, monkeypatch)
    at.session_state["app_max_general"], at.session_state["app_max_task"] = 1, 1
    at.run()
    at.selectbox(key="merge_method").set_value(method).run()
    spec = METHODS[method]
    assert [at.number_input(key=f"merge_{method}_{p.name}").value for p in spec.params] == [0.5]
    for models in (["ft1", "ft0"], ["ft0"]):
        name = f"page-{method}-{len(models)}"
        at.multiselect(key="merge_models").set_value(models).run()
        at.text_input(key=f"merge_name_{method}").set_value(name)
        at.button(key="merge_run").click().run()
        finish_cleanly(at, "merge")
        assert not at.exception and not at.error, (method, [e.value for e in at.error])
        recipe = yaml.safe_load((tmp_path / "merges" / name / "recipe.yaml").read_text())
        assert recipe["method"] == method
        assert [Path(m).name if isinstance(m, str) else Path(m["model"]).name for m in recipe["models"]] == models
