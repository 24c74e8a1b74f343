"""Parity of the sequential merges with fusion-bench 0.2.33 (its own venv, tools/fusionbench_env.sh), tensor by
tensor: MagMax (`MagMaxAlgorithm` with its defaults, and `magmax_merge`) and OPCM (`opcm_general.OPCM`, the
authors' continual merging), on a small Llama-named module. The models are saved once, fusion-bench's own
algorithms run on them in ONE subprocess, and forgetlab's `magmax` and `opcm` must give the same tensors.

OPCM is compared after every step t = 1…T (fusion-bench merging the first t models, in order), as the sequence
analysis' merge chain calls it. fusion-bench's `fusion_bench.method.opcm` package imports its CLIP variant first,
whose task pool does not import with the venv's transformers; the script loads `opcm_general` (the same maths,
without CLIP evaluation) past that package `__init__`.

Where forgetlab differs from fusion-bench (not exercised here, tested in tests/test_merge_sequential.py): the output
head `lm_head` (an nn.Linear, projected by fusion-bench) takes the rule of the other tensors in forgetlab, as in
every spectral merge; so does GPT-2's Conv1D weight the other way round (2-D, projected by forgetlab, summed by
fusion-bench, which projects nn.Linear only); a tied embedding counts once in forgetlab's norms and twice in
fusion-bench's state dict; and where the merged task vector is still zero, forgetlab adds τt whole while
fusion-bench zeroes its diagonal in an arbitrary basis."""
from __future__ import annotations

import subprocess

import pytest
import torch

from forgetlab.merge import merge_state_dicts

from tests.reference_tools import FUSIONBENCH_PYTHON, reference_env, skip_without_fusionbench

pytestmark = skip_without_fusionbench()

SCRIPT = r'''
import copy, os, sys, types
import torch
from torch import nn
import fusion_bench.method as fm
from fusion_bench import BaseModelPool
from fusion_bench.method.magmax import MagMaxAlgorithm, magmax_merge

pkg = types.ModuleType("fusion_bench.method.opcm")       # skip the package __init__ (its CLIP variant)
pkg.__path__ = [os.path.join(os.path.dirname(fm.__file__), "opcm")]
sys.modules["fusion_bench.method.opcm"] = pkg
from fusion_bench.method.opcm.opcm_general import OPCM


def net():
    m = nn.Module()
    m.model = nn.Module()
    m.model.embed_tokens = nn.Embedding(40, 16)
    m.model.layers = nn.ModuleList()
    for _ in range(2):
        layer = nn.Module()
        layer.self_attn = nn.Module()
        layer.self_attn.q_proj = nn.Linear(16, 16)
        layer.mlp = nn.Module()
        layer.mlp.up_proj = nn.Linear(16, 24, bias=False)
        layer.mlp.down_proj = nn.Linear(24, 16, bias=False)
        layer.input_layernorm = nn.LayerNorm(16)
        m.model.layers.append(layer)
    m.model.norm = nn.LayerNorm(16)
    return m


def load(sd):
    m = net()
    m.load_state_dict(sd)
    return m


d = torch.load(sys.argv[1])
base, fts = d["base"], d["fts"]


def pool(n):
    return BaseModelPool({"_pretrained_": load(base), **{f"m{i}": load(sd) for i, sd in enumerate(fts[:n])}})


out = {"magmax_default": MagMaxAlgorithm().run(pool(len(fts))).state_dict(),
       "magmax_1": magmax_merge(load(base), [load(fts[0])], scaling_factor=0.7).state_dict()}
for alpha in d["alphas"]:
    for n in range(1, len(fts) + 1):
        algo = OPCM(alpha=alpha, shuffle_order=False, save_on_every_step=False, evaluate_on_every_step=False)
        out[f"opcm_{alpha}_{n}"] = algo.run(pool(n)).state_dict()
torch.save({k: {n: t.detach().clone() for n, t in v.items()} for k, v in out.items()}, sys.argv[2])
'''

SHAPES = {"model.embed_tokens.weight": (40, 16), "model.norm.weight": (16,), "model.norm.bias": (16,)}
for _i in range(2):
    SHAPES.update({f"model.layers.{_i}.self_attn.q_proj.weight": (16, 16),
                   f"model.layers.{_i}.self_attn.q_proj.bias": (16,),
                   f"model.layers.{_i}.mlp.up_proj.weight": (24, 16),
                   f"model.layers.{_i}.mlp.down_proj.weight": (16, 24),
                   f"model.layers.{_i}.input_layernorm.weight": (16,),
                   f"model.layers.{_i}.input_layernorm.bias": (16,)})
T = 3
ALPHAS = (0.5, 0.9)


def _dyadic(shape, gen, scale: int) -> torch.Tensor:
    """Random multiples of 1/scale: sums and differences of them are exact in float32, so ties of |τ| are exact."""
    return torch.round(torch.randn(shape, generator=gen) * scale / 16) / scale


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    g = torch.Generator().manual_seed(5)
    base = {n: _dyadic(s, g, 64) for n, s in SHAPES.items()}
    taus = [{n: _dyadic(s, g, 1024) for n, s in SHAPES.items()} for _ in range(T)]
    for n in SHAPES:                       # exact ties of magnitude with opposite signs: the later model wins
        flat0, flat1 = taus[0][n].view(-1), taus[1][n].view(-1)
        flat1[::5] = -flat0[::5]
    fts = [{n: base[n] + tau[n] for n in SHAPES} for tau in taus]
    root = tmp_path_factory.mktemp("fb_seq")
    torch.save({"base": base, "fts": fts, "alphas": list(ALPHAS)}, root / "in.pt")
    (root / "run.py").write_text(SCRIPT)
    r = subprocess.run([str(FUSIONBENCH_PYTHON), str(root / "run.py"), str(root / "in.pt"), str(root / "out.pt")], env=reference_env(),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(base=base, fts=fts, taus=taus, out=torch.load(root / "out.pt"))


def test_the_inputs_hold_ties_of_magnitude_with_opposite_signs(reference):
    tau0, tau1 = reference["taus"][0], reference["taus"][1]
    n = "model.layers.0.mlp.up_proj.weight"
    tie = (tau0[n].abs() == tau1[n].abs()) & (tau0[n] != tau1[n])
    assert tie.sum() >= 50


def test_magmax_matches_fusion_bench_with_its_defaults(reference):
    base, fts, theirs = reference["base"], reference["fts"], reference["out"]["magmax_default"]
    got = merge_state_dicts("magmax", base, fts)             # forgetlab's default λ against fusion-bench's 0.5
    assert set(got) == set(theirs)
    for n in base:
        assert torch.equal(got[n], theirs[n]), n           # dyadic inputs: the same floats, ties included
    one = merge_state_dicts("magmax", base, fts[:1], lam=0.7)
    for n in base:
        torch.testing.assert_close(one[n], reference["out"]["magmax_1"][n], rtol=0, atol=1e-7)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_opcm_matches_fusion_bench_after_every_step(reference, alpha):
    base, fts, out = reference["base"], reference["fts"], reference["out"]
    for n_models in range(1, T + 1):
        got = merge_state_dicts("opcm", base, fts[:n_models], alpha=alpha)
        theirs = out[f"opcm_{alpha}_{n_models}"]
        for n in base:
            if n_models == 1:
                assert torch.equal(got[n], theirs[n]), n    # the first model itself
            else:
                torch.testing.assert_close(got[n] - base[n], theirs[n] - base[n], rtol=0, atol=2e-6,
                                           msg=f"{alpha} {n_models} {n}")
        if n_models > 1:                                    # the projection did act: not task arithmetic rescaled
            q = "model.layers.0.self_attn.q_proj.weight"
            plain = sum(fts[i][q] - base[q] for i in range(n_models))
            cos = torch.nn.functional.cosine_similarity((got[q] - base[q]).view(1, -1), plain.view(1, -1))
            assert float(cos) < 0.999
