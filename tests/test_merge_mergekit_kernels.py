"""The CPU kernels (`fast_kernel`) of mergekit's methods (issue 25) against their reference tensor functions: the
same job merged by `MethodSpec.apply` (the kernel) and by `MethodSpec.merge` (the reference), on random tensors with
and without ties (few distinct values: ties at every cut and every rank), zero task vectors and several shapes
(a row-major matrix, a long vector, a tall embedding-like matrix, one entry). The kernels are bit-identical to the
reference unless a test says otherwise."""
from __future__ import annotations

import pytest
import torch

from forgetlab.merge import select as K
from forgetlab.merge.registry import TensorJob, get_method, validate_params

SHAPES = [(300, 256), (K.BLOCK + 777,), (2 * K.BLOCK // 16 + 5, 16), (1,)]


def _job(method: str, params: dict, shape, n_models: int, seed: int, ties: bool) -> TensorJob:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=g) * 0.02
    fts = []
    for i in range(n_models):
        tau = torch.randn(shape, generator=g) * 0.002
        if ties:  # few distinct values: many entries tie in |τ|, in variance, in rank
            tau = torch.round(tau * 1500) / 1500
        if i == 1 and tau.numel() > 10:
            tau.reshape(-1)[: tau.numel() // 5] = 0  # a part no model changes, or only some do
        fts.append(base + tau)
    spec = get_method(method)
    return TensorJob("model.layers.0.mlp.up_proj.weight", base, fts, validate_params(spec, params, n_models))


def _copy(job: TensorJob) -> TensorJob:
    return TensorJob(job.name, job.base.clone(), [f.clone() for f in job.finetuned], dict(job.params))


def _both(method: str, params: dict, shape, n_models: int = 3, seed: int = 0, ties: bool = False):
    job = _job(method, params, shape, n_models, seed, ties)
    spec = get_method(method)
    assert spec.fast is not None, f"{method} has no CPU kernel"
    kernel_job = _copy(job)
    assert K.on_cpu_fast_path(kernel_job.base, *kernel_job.finetuned)
    fast = spec.fast(kernel_job)
    assert fast is not None, f"{method}'s kernel declined {params} on {shape}"
    return fast, spec.merge(_copy(job))


def _assert_same(fast, ref, atol=0.0):
    assert fast.shape == ref.shape
    if atol == 0.0:
        assert torch.equal(fast, ref), float((fast - ref).abs().max())
    else:
        torch.testing.assert_close(fast, ref, rtol=0, atol=atol)


GTA_CASES = [
    ("della", {"density": 0.5}), ("della", {"density": [0.3, 0.6, 0.5], "epsilon": 0.1, "seed": 9}),
    ("della", {"density": 0.4, "weights": [0.5, 1.5, 1.0], "lam": 0.7, "rescale": False}),
    ("della", {"density": 0.5, "normalize": False}), ("della", {"density": 1.0}),
    ("della_linear", {"density": 0.5}), ("della_linear", {"density": 0.3, "weights": [0.2, 0.3, 0.9], "lam": 1.3,
                                                        "normalize": True}),
    ("breadcrumbs_ties", {"density": 0.3, "gamma": 0.01}),
    ("breadcrumbs_ties", {"density": [0.1, 0.5, 0.9], "gamma": [0.0, 0.05, 0.1], "rescale": True,
                          "normalize": True, "weights": [1.0, 0.5, 2.0]}),
    ("breadcrumbs_ties", {"density": 1.0, "lam": 0.5}),
]


@pytest.mark.parametrize("method,params", GTA_CASES)
@pytest.mark.parametrize("ties", [False, True])
def test_gta_kernels_equal_the_reference(method, params, ties):
    for i, shape in enumerate(SHAPES):
        fast, ref = _both(method, params, shape, seed=i, ties=ties)
        _assert_same(fast, ref)


@pytest.mark.parametrize("params", [{"select_topk": 0.5}, {"select_topk": 1.0}, {"select_topk": 0.1},
                                    {"select_topk": 0.0}, {"select_topk": 0.999}])
@pytest.mark.parametrize("n_models", [2, 3, 4])
@pytest.mark.parametrize("ties", [False, True])
def test_sce_kernel_equals_the_reference(params, n_models, ties):
    for i, shape in enumerate(SHAPES):
        fast, ref = _both("sce", params, shape, n_models=n_models, seed=10 + i, ties=ties)
        _assert_same(fast, ref)


@pytest.mark.parametrize("method,params", [("ram", {}), ("ram", {"epsilon": 1e-3}), ("ramplus_tl", {}),
                                           ("ramplus_tl", {"r": 2.0, "alpha": 0.7, "epsilon": 5e-4})])
@pytest.mark.parametrize("n_models", [2, 3])
@pytest.mark.parametrize("ties", [False, True])
def test_ram_kernels_equal_the_reference(method, params, n_models, ties):
    for i, shape in enumerate(SHAPES):
        fast, ref = _both(method, params, shape, n_models=n_models, seed=20 + i, ties=ties)
        _assert_same(fast, ref)


@pytest.mark.parametrize("ties", [False, True])
def test_arcee_fusion_kernel_equals_the_reference(monkeypatch, ties):
    from forgetlab.merge.methods import gated
    for i, shape in enumerate(SHAPES + [(700, 300)]):
        fast, ref = _both("arcee_fusion", {"seed": 3}, shape, n_models=1, seed=30 + i, ties=ties)
        _assert_same(fast, ref)
    monkeypatch.setattr(gated, "QUANTILE_SAMPLE_SIZE", 5000)  # the sampled quantiles (above 1e6 entries in use)
    for i, shape in enumerate(SHAPES[:3]):
        fast, ref = _both("arcee_fusion", {"seed": 4}, shape, n_models=1, seed=40 + i, ties=ties)
        _assert_same(fast, ref)


@pytest.mark.parametrize("params", [{}, {"weights": [0.2, 0.5, 1.3, 0.7]}, {"eps": 1e-3},
                                    {"weights": [0.2, 0.5, 1.3, 0.7], "normalize_weights": False}])
@pytest.mark.parametrize("n_models", [2, 3, 4])
@pytest.mark.parametrize("ties", [False, True])
def test_multislerp_kernel_equals_the_reference(params, n_models, ties):
    params = dict(params)
    if "weights" in params:
        params["weights"] = params["weights"][:n_models]
    for i, shape in enumerate(SHAPES):
        fast, ref = _both("multislerp", params, shape, n_models=n_models, seed=50 + i, ties=ties)
        _assert_same(fast, ref)


def _multislerp_job(base, fts, params):
    spec = get_method("multislerp")
    return TensorJob("model.layers.0.mlp.up_proj.weight", base, fts, validate_params(spec, params, len(fts)))


def test_multislerp_kernel_edge_cases():
    spec = get_method("multislerp")
    g = torch.Generator().manual_seed(7)
    base = torch.randn(64, 32, generator=g)
    tau = torch.randn(64, 32, generator=g) * 0.01
    # two antipodal task vectors (exactly: a zero base) with equal weights: the weighted mean direction vanishes,
    # so both interpolate linearly (= θ0); likewise all-zero task vectors
    zero = torch.zeros_like(base)
    for fts in ([tau.clone(), -tau], [zero.clone(), zero.clone()]):
        job = _multislerp_job(zero, fts, {})
        fast, ref = spec.fast(_copy(job)), spec.merge(_copy(job))
        _assert_same(fast, ref)
        assert torch.equal(fast, zero)
    # three with a vanishing mean are refused by both, with the same error
    job = _multislerp_job(zero, [tau.clone(), -tau, zero.clone()], {})
    with pytest.raises(Exception, match="weighted mean of the models' directions is zero") as e_fast:
        spec.fast(_copy(job))
    with pytest.raises(type(e_fast.value)):
        spec.merge(_copy(job))
    # one model, or no base: the kernel declines (the reference runs)
    assert spec.fast(_copy(_multislerp_job(base, [base + tau], {}))) is None
    assert spec.fast(_copy(_multislerp_job(base, [base + tau, base + 2 * tau], {"use_base": False}))) is None
    # bf16 inputs do not take the kernel: apply gives the reference's tensor
    b16, f16 = base.bfloat16(), [(base + tau).bfloat16(), (base + 2 * tau + 0.001).bfloat16()]
    job = _multislerp_job(b16, f16, {})
    assert not K.on_cpu_fast_path(job.base, *job.finetuned)
    _assert_same(spec.apply(_copy(job)), spec.merge(_copy(job)))


@pytest.mark.parametrize("params", [{}, {"weights": [0.2, 0.9]}, {"weights": [1.0, 0.0]}, {"weights": [0.0, 1.0]}])
@pytest.mark.parametrize("ties", [False, True])
def test_nuslerp_kernel_equals_the_reference(params, ties):
    for i, shape in enumerate(SHAPES):
        fast, ref = _both("nuslerp", params, shape, n_models=2, seed=60 + i, ties=ties)
        _assert_same(fast, ref)


def test_nuslerp_kernel_edge_cases():
    spec = get_method("nuslerp")
    g = torch.Generator().manual_seed(8)
    base = torch.randn(64, 32, generator=g)
    tau = torch.randn(64, 32, generator=g) * 0.01
    zero = torch.zeros_like(base)
    cases = [(zero, [tau.clone(), 2 * tau]),  # exactly colinear task vectors: the linear branch
             (zero, [tau.clone(), -tau]),  # antipodal
             (base, [base.clone(), base.clone()]),  # zero task vectors
             (base, [base + tau, base.clone()])]  # one zero task vector
    for b, fts in cases:
        job = TensorJob("w", b, fts, validate_params(spec, {"weights": [0.3, 0.7]}, 2))
        fast, ref = spec.fast(_copy(job)), spec.merge(_copy(job))
        _assert_same(fast, ref)
    lin = TensorJob("w", zero, [tau.clone(), 2 * tau], validate_params(spec, {"weights": [0.3, 0.7]}, 2))
    torch.testing.assert_close(spec.fast(_copy(lin)), 0.3 * tau + 0.7 * 2 * tau, rtol=1e-6, atol=0)
    # per-row angles, or no base: the kernel declines (the reference runs)
    for params in ({"nuslerp_flatten": False}, {"nuslerp_flatten": False, "nuslerp_row_wise": True},
                   {"use_base": False}):
        job = TensorJob("w", base, [base + tau, base - tau], validate_params(spec, params, 2))
        assert spec.fast(_copy(job)) is None
    # bf16 inputs do not take the kernel: apply gives the reference's tensor
    job = TensorJob("w", base.bfloat16(), [(base + tau).bfloat16(), (base - 2 * tau).bfloat16()],
                    validate_params(spec, {}, 2))
    assert not K.on_cpu_fast_path(job.base, *job.finetuned)
    _assert_same(spec.apply(_copy(job)), spec.merge(_copy(job)))
