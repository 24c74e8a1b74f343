"""The CPU kernels of the merge methods (forgetlab.merge.select and each family's `fast_kernel`) against the exact
reference implementations they replace (torch.kthvalue, select.topk_mask, ties.ties_combine), including ties, k = 0 / 1 / n and zero tensors,
and the device (torch) code path of every method run on the CPU against the kernels."""
from __future__ import annotations

import pytest
import torch

from forgetlab.merge import merge_state_dicts
from forgetlab.merge import select as K
from forgetlab.merge.methods import breadcrumbs, consensus, dare, fapm, pcb
from forgetlab.merge.methods import ties as ties_family
from forgetlab.merge.registry import tensor_generator
from forgetlab.merge.core import all_finite
from forgetlab.merge.methods.ties import ties_combine


def _tensors(n, seed=0, ties=False, shape=None):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=g) * 0.01
    if ties:  # few distinct magnitudes: many entries tie at any cut
        t = torch.round(t * 300) / 300
    return t.reshape(shape) if shape else t


def _ref_kth(x: torch.Tensor, k: int) -> float:
    return float(torch.kthvalue(x.reshape(-1), x.numel() - k + 1).values)


@pytest.mark.parametrize("n", [1, 7, 4096, 5000, 70_000, 300_001])
@pytest.mark.parametrize("ties", [False, True])
def test_kth_largest_is_exact(n, ties):
    x = _tensors(n, seed=n, ties=ties)
    a = x.numpy()
    for k in sorted({1, min(2, n), max(1, n // 5), max(1, n // 2), max(1, n - 1), n}):
        v, n_ge = K.kth_largest(a, k)
        assert v == _ref_kth(x, k)
        assert n_ge == int((x >= v).sum())
        va, n_ge_a = K.kth_largest(a, k, absolute=True)
        assert va == _ref_kth(x.abs(), k)
        assert n_ge_a == int((x.abs() >= va).sum())


def test_kth_largest_with_infinite_scores_and_biased_columns():
    # FAPM scores hold −∞; columns of very different scale defeat a sample that walks one column only
    x = torch.randn(512, 640) * torch.logspace(-3, 3, 640)
    x[:, ::7] = float("-inf")
    for k in (1, 1000, x.numel() // 10, x.numel() - 5):
        v, _ = K.kth_largest(x.reshape(-1).numpy(), k, row=640)
        assert v == _ref_kth(x, k)


def _ref_keep(t, k, score=None):
    s = t.abs() if score is None else score
    return t * K.topk_mask(s, k)


@pytest.mark.parametrize("n", [5, 4096, 200_003])
@pytest.mark.parametrize("ties", [False, True])
def test_keep_top_matches_topk_mask(n, ties):
    t = _tensors(n, seed=3, ties=ties)
    for k in (0, 1, n // 10, n // 2, n - 1, n):
        got = K.keep_top_(t.clone(), k)
        want = _ref_keep(t, k)
        assert torch.equal(got, want)
        assert torch.equal(torch.signbit(got), torch.signbit(want))  # −0.0 where the reference has it
        assert int((got != 0).sum()) == min(k, int((t != 0).sum()))


def test_keep_top_with_a_separate_score_and_edge_tensors():
    t = _tensors(100_000, seed=5, shape=(250, 400))
    score = torch.round(_tensors(100_000, seed=6, shape=(250, 400)) * 50)  # heavy ties
    score[0, :10] = float("-inf")
    for k in (0, 1, 3, 10_000, 99_999, 100_000, 200_000):
        assert torch.equal(K.keep_top_(t.clone(), k, score), _ref_keep(t, k, score))
    zeros = torch.zeros(10_000)
    assert torch.equal(K.keep_top_(zeros.clone(), 2000), zeros)
    one = torch.tensor([0.5])
    assert torch.equal(K.keep_top_(one.clone(), 1), one)
    assert torch.equal(K.keep_top_(one.clone(), 0), torch.zeros(1))


def test_threshold_matches_threshold_mask():
    t = _tensors(150_000, seed=8, ties=True)
    for thr in (None, 0.0, 0.01, 0.5):
        want = t * K.threshold_mask(t.abs(), thr)
        assert torch.equal(K.threshold_(t.clone(), thr), want)


@pytest.mark.parametrize("weights", [None, [1.0, 1.0, 1.0], [0.5, 2.0, 1.0], [1.0, -1.0, 0.5]])
@pytest.mark.parametrize("lam", [1.0, 0.7])
def test_ties_combine_into_is_bit_identical(weights, lam):
    n = 3 * K.BLOCK + 123  # several blocks and a short last one
    base = _tensors(n, seed=1)
    taus = [K.keep_top_(_tensors(n, seed=10 + i, ties=True), n // 5) for i in range(3)]
    # exact cancellations (S = 0 with non-zero terms: the elected sign is +) and all-zero entries
    taus[1][:50] = -taus[0][:50]
    taus[2][:50] = 0
    for t in taus:
        t[60:80] = 0
    want = base + lam * ties_combine([t.clone() for t in taus], weights)
    got = ties_family.ties_combine_into_(base.clone(), [t.clone() for t in taus], weights, lam)
    assert torch.equal(got, want)
    raw = [_tensors(n, seed=10 + i, ties=True) for i in range(3)]
    for t in raw:
        t[60:80] = 0
    want = base + lam * ties_combine([_ref_keep(t, n // 5) for t in raw], weights)
    cuts = [K.top_cut_(t, n // 5) for t in raw]
    got = ties_family.ties_combine_into_(base.clone(), raw, weights, lam, cuts)
    assert torch.equal(got, want)


def test_ties_combine_into_single_model_and_small_tensor():
    base, tau = torch.randn(10), torch.randn(10)
    tau[3] = 0
    want = base + 0.5 * ties_combine([tau.clone()])
    assert torch.equal(ties_family.ties_combine_into_(base.clone(), [tau.clone()], None, 0.5), want)


def test_all_finite():
    assert all_finite(torch.randn(1000))
    assert all_finite(torch.full((4,), 3e38))  # the sum overflows, every entry is finite
    for bad in (float("nan"), float("inf"), float("-inf")):
        t = torch.randn(1000)
        t[500] = bad
        assert not all_finite(t)
    assert all_finite(torch.zeros(0))
    assert all_finite(torch.arange(5))


def _state(seed, shapes):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * 0.02 for n, s in shapes.items()}


SHAPES = {"model.embed_tokens.weight": (300, 256), "model.layers.0.mlp.up_proj.weight": (64, 48),
          "model.layers.0.input_layernorm.weight": (48,), "model.layers.1.self_attn.q_proj.weight": (48, 48),
          "model.norm.weight": (48,), "lm_head.weight": (300, 48)}

FAST_METHODS = [
    ("ties", {"keep": 0.2}), ("ties", {"keep": 0.2, "weights": [0.5, 1.5, 1.0], "lam": 0.8}),
    ("ties", {"keep": 0.0}), ("ties", {"keep": 1.0}), ("ties", {"keep": 0.3, "scope": "global"}),
    ("dare_ties", {"drop": 0.9, "seed": 3}), ("dare_linear", {"drop": 0.9}), ("consensus", {}),
    ("consensus", {"lam": [0.2, 0.5, 1.0], "k": 1, "alpha": 0.5}), ("breadcrumbs", {}),
    ("breadcrumbs", {"keep": 0.3, "gamma": 0.05, "lam": 0.5}), ("fapm", {}), ("fapm", {"score": "magnitude"}),
    ("fapm", {"score": "relative", "ratio": 0.5}), ("pcb", {"scope": "tensor"}), ("pcb", {"scope": "global"}),
    ("pcb", {"scope": "tensor", "keep": 0.5, "lam": [0.5, 1.0, 1.5]}),
    # issue 41: the sparsity knob per model (mergekit's per-model density and gamma)
    ("ties", {"keep": [0.1, 0.5, 1.0], "weights": [1.0, 0.5, 2.0]}), ("ties", {"keep": [0.0, 0.3, 0.8]}),
    ("ties", {"keep": [0.1, 0.6, 0.9], "scope": "global"}), ("dare_ties", {"drop": [0.2, 0.5, 0.9], "seed": 3}),
    ("dare_linear", {"drop": [0.0, 0.5, 1.0]}), ("breadcrumbs", {"keep": [0.1, 0.3, 0.5], "gamma": [0.0, 0.05, 0.1]}),
]


@pytest.mark.parametrize("method,params", FAST_METHODS)
def test_device_path_on_cpu_gives_the_same_merge(monkeypatch, method, params):
    """The torch code path that a CUDA merge takes, run on the CPU, against the CPU kernels."""
    base = _state(0, SHAPES)
    fts = []
    for i in range(3):
        d = _state(1 + i, SHAPES)
        fts.append({n: base[n] + 0.1 * d[n] for n in base})
    fts[2]["model.layers.0.input_layernorm.weight"] = base["model.layers.0.input_layernorm.weight"].clone()  # τ = 0
    fast = merge_state_dicts(method, base, fts, **params)
    monkeypatch.setattr(K, "DEVICE_PATH_ON_CPU", True)
    device_path = merge_state_dicts(method, base, fts, **params)
    for n in base:
        torch.testing.assert_close(fast[n], device_path[n], rtol=0, atol=1e-7, msg=n)


def test_tensor_reader_slots_and_prefetch_read_what_plain_reads_read(tiny_llama):
    """Reused slots + a prefetching thread give, entry by entry, the tensors that plain reads give."""
    from forgetlab.core import checkpoints as ck
    from forgetlab.merge.core import CheckpointSource, TensorReader, check_compatible

    base_ck = ck.open_checkpoint(tiny_llama.base)
    base = CheckpointSource(base_ck)
    models = [CheckpointSource(ck.open_checkpoint(p, base=base_ck)) for p in tiny_llama.finetuned.values()]
    entries = [e for e in check_compatible(base, models) if e.dtype.is_floating_point]
    plain = [(b.clone(), [f.clone() for f in fts]) for _, b, fts in TensorReader(base, models)(entries)]
    fast = TensorReader(base, models, reuse=True, prefetch=True)
    for _ in fast(entries[:3]):  # a first pass leaves slots of various sizes behind
        pass
    seen = 0
    for (e, b, fts), (pb, pfts) in zip(fast(entries), plain):
        assert torch.equal(b, pb) and all(torch.equal(f, p) for f, p in zip(fts, pfts)), e.name
        b.add_(1.0)  # the consumer works in place on what it was given: later entries are unaffected
        seen += 1
    assert seen == len(entries)


@pytest.mark.parametrize("drop", [0.0, 0.3, 0.9, 1.0])
def test_dare_in_place_draws_the_same_mask(drop):
    n = 2 * K.BLOCK + 77
    tau = _tensors(n, seed=2, shape=(n,))
    want = dare.dare(tau.clone(), drop, tensor_generator(7, "w", 1))
    got = dare.dare_(tau.clone(), drop, tensor_generator(7, "w", 1))
    assert torch.equal(got, want)


@pytest.mark.parametrize("lam,k,alpha", [(0.4, 2, 1.0), ([0.2, 0.5, 1.5], 1, 0.7), (0.4, 3, 0.5)])
def test_consensus_into_is_bit_identical(lam, k, alpha):
    from forgetlab.merge.methods.consensus import consensus_merge
    n = K.BLOCK + 999
    base = _tensors(n, seed=4)
    taus = [_tensors(n, seed=20 + i, ties=True) for i in range(3)]
    taus[0][:30] = 0
    want = base + consensus_merge([t.clone() for t in taus], lam, k, alpha)
    lams = [lam] * 3 if isinstance(lam, float) else lam
    assert torch.equal(consensus.consensus_into_(base.clone(), taus, lams, k, alpha), want)


@pytest.mark.parametrize("score", ["fapm", "magnitude", "relative"])
@pytest.mark.parametrize("ratio", [0.0, 0.5, 0.9, 1.0])
def test_fapm_prune_in_place_equals_fapm_prune(score, ratio):
    from forgetlab.merge.methods.fapm import fapm_prune
    n = K.BLOCK + 4321
    for zero_base in (False, True):
        w0 = torch.zeros(n) if zero_base else _tensors(n, seed=30, ties=True)
        if not zero_base:
            w0[:100] = 0  # W0 = 0: S = −∞ where τ ≠ 0
        tau = _tensors(n, seed=31, ties=True)
        tau[50:150] = 0  # τ = 0 (also where W0 = 0: the 0/0 entries)
        want = fapm_prune(tau.clone(), w0, ratio, score)
        w0_abs = w0.abs()
        mean0 = float(w0_abs.mean()) if bool(w0_abs.mean() > 0) else None
        got = fapm.fapm_prune_(tau.clone(), w0_abs, mean0, ratio, score, torch.empty(n))
        assert torch.equal(got, want), (score, ratio, zero_base)


@pytest.mark.parametrize("keep,gamma", [(0.1, 0.01), (0.3, 0.0), (0.5, 0.5), (0.0, 0.2), (1e-6, 0.01), (0.9, 0.1)])
@pytest.mark.parametrize("ties", [False, True])
def test_breadcrumbs_in_place_equals_breadcrumbs(keep, gamma, ties):
    n = 3 * K.BLOCK + 11
    tau = _tensors(n, seed=40, ties=ties)
    tau[:500] = 0
    want = breadcrumbs.breadcrumbs(tau.clone(), keep, gamma)
    n_top, n_keep = breadcrumbs.breadcrumbs_counts(n, keep, gamma)
    got = breadcrumbs.breadcrumbs_(tau.clone(), n_top, n_keep)
    assert torch.equal(got, want)
    small = torch.tensor([0.3, -0.1, 0.3, 0.0, -0.3])
    for k1, k2 in [(5, 1), (3, 1), (2, 0), (0, 0), (4, 2)]:
        want = small * (K.topk_mask(small.abs(), k1) & ~K.topk_mask(small.abs(), k2))
        assert torch.equal(breadcrumbs.breadcrumbs_(small.clone(), k2, k1 - k2), want), (k1, k2)


@pytest.mark.parametrize("n_tasks", [2, 3])
@pytest.mark.parametrize("keep", [0.0, 0.2, 1.0])
def test_pcb_merge_into_matches_pcb_merge(n_tasks, keep):
    n = K.BLOCK + 5000
    base = _tensors(n, seed=50)
    taus = [_tensors(n, seed=51 + i) for i in range(n_tasks)]
    taus[0][:40] = 0
    lams = [0.7, 1.3, 1.0][:n_tasks]
    want = base + pcb.pcb_merge([t.clone() for t in taus], keep, lams)
    got = pcb.pcb_merge_into_(base.clone(), taus, keep, lams)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    st = pcb.pcb_stats(taus, 0.3)  # global scope: statistics given, β computed block by block
    want = base + pcb.pcb_merge([t.clone() for t in taus], 0.3, lams, st)
    torch.testing.assert_close(pcb.pcb_merge_into_(base.clone(), taus, 0.3, lams, st), want, rtol=0, atol=1e-7)
    # the statistics of the blocked passes equal pcb_stats (sums in float64, in another order)
    lo, hi = pcb.pcb_minmax(taus)
    assert lo == st.lo and hi == st.hi
    zp, zi = pcb.pcb_zsums(taus, lo, hi)
    for p in zp:
        assert zp[p] == pytest.approx(st.z_pair[p], rel=1e-12)
    assert zi == pytest.approx(st.z_intra, rel=1e-12)


def test_pcb_constant_products():
    taus = [torch.zeros(300), torch.full((300,), 0.5)]
    base = torch.zeros(300)
    want = base + pcb.pcb_merge([t.clone() for t in taus], 0.2, [1.0, 1.0])
    torch.testing.assert_close(pcb.pcb_merge_into_(base.clone(), taus, 0.2, [1.0, 1.0]), want, rtol=0, atol=0)


@pytest.mark.parametrize("n", [1000, (1 << 20) + 4097])
def test_the_gpus_sort_selection_gives_kthvalues_value(n):
    """`_smallest(by_sort=True)` (what a CUDA tensor takes: torch.sort, ~20× faster there than torch.kthvalue on
    one slice) against torch.kthvalue, with ties and signed zeros, and through the bracketed k-th largest."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    x[: n // 10] = 0.5                                     # ties
    x[n // 10: n // 10 + 7] = -0.0
    for j in (1, 2, n // 3, n // 10, n - 1, n):
        assert K._smallest(x, j, by_sort=True).item() == torch.kthvalue(x, j).values.item()
    import unittest.mock as mock

    real = K._smallest
    with mock.patch.object(K, "_smallest", lambda v, j: real(v, j, by_sort=True)):
        for k in (1, n // 7, n // 2, n):
            assert K._kth_largest_tensor(x, k).item() == torch.kthvalue(x, n - k + 1).values.item()


def test_radix_select_counts_on_the_values_device_path_as_the_cpu_kernels_do(monkeypatch):
    """RadixSelect fed through its torch path (the GPU's: histograms counted where the values are) and through the
    numpy path give the exact k-th largest of the whole stream."""
    g = torch.Generator().manual_seed(3)
    chunks = [torch.rand(s, generator=g) for s in (70_000, 5, 300_000, 1)]
    chunks[1][:] = 0.25                                    # ties across chunks
    chunks[0][:100] = 0.25
    whole = torch.cat(chunks)
    for k in (1, 17, whole.numel() // 3, whole.numel()):
        found = []
        for device_path in (False, True):
            monkeypatch.setattr(K, "DEVICE_PATH_ON_CPU", device_path)
            sel = K.RadixSelect(k)
            for _ in range(2):
                for c in chunks:
                    sel.add(c)
                sel.advance()
            found.append(sel.value)
        assert found[0] == found[1] == torch.sort(whole, descending=True).values[k - 1].item()
