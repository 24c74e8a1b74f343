"""Parity with fusion-bench 0.2.33 (installed in its own venv by tools/fusionbench_env.sh): TSV-M, Iso-C, Iso-CTS,
RegMean and Fisher merging, tensor by tensor. The task vectors (and Grams / Fishers) are saved once, fusion-bench's
own functions run on them in ONE subprocess, and forgetlab's methods must give the same tensors.

Where forgetlab follows the issue instead of fusion-bench, the comparison says so: tensors that are not "2-D"
weights get θ0 + α·Σt τt in forgetlab (the TSV paper "defaults to task arithmetic" there) and the mean of the τt in
fusion-bench, so those are compared as T × fusion-bench's."""
from __future__ import annotations

import subprocess

import pytest
import torch

from forgetlab.merge import merge_state_dicts
from forgetlab.merge.methods.fisher import fisher_average
from forgetlab.merge.methods.regmean import regmean_solve
from tests.reference_tools import FUSIONBENCH_PYTHON, reference_env, skip_without_fusionbench


pytestmark = skip_without_fusionbench()

SCRIPT = r'''
import sys, torch
from fusion_bench.method.isotropic_merging.iso_utils import iso_c, iso_cts
from fusion_bench.method.task_singular_vector.utils.TSVM_utils import compute_and_sum_svd_mem_reduction
from fusion_bench.method.regmean.regmean import merging_with_regmean_weights
from fusion_bench.method.fisher_merging.fisher_merging import merging_with_fisher_weights
d = torch.load(sys.argv[1])
taus = d["taus"]
out = {}
out["tsv"] = compute_and_sum_svd_mem_reduction(taus, accelerator="cpu")
out["iso_c"] = iso_c(taus, accelerator="cpu")
out["iso_cts"] = iso_cts(taus, common_space_fraction=0.8, accelerator="cpu")
params = {"lin.weight": d["weights"], "lin.bias": d["biases"]}
out["regmean"] = merging_with_regmean_weights(params, [{"lin": g} for g in d["grams"]],
                                              reduce_non_diagonal_ratio=0.6)
out["fisher"] = merging_with_fisher_weights({"w": d["weights"]}, [{"w": f} for f in d["fishers"]],
                                            torch.ones(len(d["weights"])), normalize_fisher_weight=False,
                                            minimal_fisher_weight=1e-6)
torch.save(out, sys.argv[2])
'''



@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    g = torch.Generator().manual_seed(11)
    T = 3
    names = {"model.layers.0.self_attn.q_proj.weight": (24, 24), "model.layers.0.mlp.up_proj.weight": (36, 24),
             "model.layers.1.mlp.down_proj.weight": (24, 36), "model.layers.0.input_layernorm.weight": (24,)}
    base = {n: torch.randn(s, generator=g) for n, s in names.items()}
    fts = [{n: base[n] + 0.05 * torch.randn(s, generator=g) for n, s in names.items()} for _ in range(T)]
    taus = [{n: ft[n] - base[n] for n in names} for ft in fts]
    xs = [torch.randn(50, 16, generator=g) for _ in range(T)]
    grams = [x.T @ x / len(x) for x in xs]
    weights = [torch.randn(10, 16, generator=g) for _ in range(T)]
    biases = [torch.randn(10, generator=g) for _ in range(T)]
    fishers = [torch.rand(10, 16, generator=g) ** 4 for _ in range(T)]
    root = tmp_path_factory.mktemp("fb")
    torch.save({"taus": taus, "grams": grams, "weights": weights, "biases": biases, "fishers": fishers},
               root / "in.pt")
    (root / "run.py").write_text(SCRIPT)
    r = subprocess.run([str(FUSIONBENCH_PYTHON), str(root / "run.py"), str(root / "in.pt"), str(root / "out.pt")], env=reference_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(base=base, fts=fts, T=T, grams=grams, weights=weights, biases=biases, fishers=fishers,
                out=torch.load(root / "out.pt"))


@pytest.mark.parametrize("method,params", [("tsv", {"alpha": 1.0}), ("iso_c", {"alpha": 1.0}),
                                           ("iso_cts", {"alpha": 1.0, "common": 0.8})])
def test_spectral_methods_match_fusion_bench(reference, method, params):
    base, fts, T = reference["base"], reference["fts"], reference["T"]
    got = merge_state_dicts(method, base, fts, **params)
    theirs = reference["out"][method]
    for n in base:
        if base[n].dim() == 2:
            assert torch.allclose(got[n] - base[n], theirs[n], atol=2e-5), (method, n)
        else:       # fusion-bench averages the other tensors; forgetlab sums them (task arithmetic)
            assert torch.allclose(got[n] - base[n], T * theirs[n], atol=1e-6), (method, n)


def test_regmean_matches_fusion_bench(reference):
    ws = reference["weights"]
    got = regmean_solve(ws, reference["grams"], 0.6, transposed=True)
    assert torch.allclose(got, reference["out"]["regmean"]["lin.weight"], atol=1e-4)
    assert torch.allclose(torch.stack(reference["biases"]).mean(0), reference["out"]["regmean"]["lin.bias"])


def test_fisher_matches_fusion_bench(reference):
    got = fisher_average(reference["weights"], reference["fishers"], 1e-6)
    assert torch.allclose(got, reference["out"]["fisher"]["w"], atol=1e-5)
