"""Issue 28: the prepare hooks of fisher, regmean, regmean_pp and slwm hold few models at once. Each leaves the
pool's loaded models as it found them (a model the caller loaded stays, and is used, not loaded twice), loads at
most one fine-tuned model at a time (regmean_pp and slwm read the fine-tunes from their checkpoints and load
none), and gives the same numbers, bit for bit, whichever way the models are reached."""
from __future__ import annotations

import pytest
import torch

from forgetlab.core.pool import ModelPool
from forgetlab.merge.registry import PrepareContext, get_method, validate_params
from tests.pool_helper import LoadWatch

F32 = ("cpu", torch.float32)


def _prepare(pool, method: str):
    spec = get_method(method)
    params = validate_params(spec, {"samples": 4, "tasks": "math,copy"}, n_models=2)
    return spec.prepare(PrepareContext(pool, None, [], ["ft0", "ft1"], params))


def _tensors(prepared) -> dict[str, torch.Tensor]:
    return {k: getattr(v, "grams", v) for k, v in prepared.items()}


def _same(a, b) -> None:
    a, b = _tensors(a), _tensors(b)
    assert set(a) == set(b) and a
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("method", ["fisher", "regmean"])
def test_one_fine_tune_at_a_time_and_the_callers_models_stay(tiny_llama, method):
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    watch = LoadWatch(pool)
    with watch.watching():
        alone = _prepare(pool, method)
    assert watch.names == ["ft0", "ft1"] and watch.peak == 1       # one fine-tune loaded at a time
    assert pool.loaded() == []                                      # none left behind

    mine = pool.load("ft1")
    flags = [p.requires_grad for p in mine.parameters()]
    watch = LoadWatch(pool)
    with watch.watching():
        again = _prepare(pool, method)
    assert watch.peak == 2                                          # the caller's ft1 + ft0 while it is used
    assert pool.loaded() == [("ft1", *F32)] and pool.load("ft1") is mine
    assert [p.requires_grad for p in mine.parameters()] == flags                # the caller's model as it was
    assert all(p.grad is None for p in mine.parameters())                      # (fisher's gradients: on a copy)
    _same(alone, again)


def test_regmean_pp_reads_the_fine_tunes_from_their_checkpoints(tiny_llama, monkeypatch):
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    mine = pool.load("base")
    watch = LoadWatch(pool)
    with watch.watching():
        lazy = _prepare(pool, "regmean_pp")
    assert watch.names == [] and pool.loaded() == [("base", *F32)] and pool.load("base") is mine
    assert torch.equal(mine.model.layers[0].mlp.up_proj.weight, ModelPool.from_yaml(tiny_llama.pool_yaml)
                       .load("base").model.layers[0].mlp.up_proj.weight)   # the merged copy was its own

    # a checkpoint that cannot be read tensor by tensor (an adapter, GGUF): the model is borrowed whole
    import forgetlab.merge.methods.regmean as regmean

    monkeypatch.setattr(regmean, "stored_params", lambda *a, **k: None)     # working_copy's, as regmean_pp reads it
    watch = LoadWatch(pool)
    with watch.watching():
        loaded = _prepare(pool, "regmean_pp")
    assert watch.names == ["ft0", "ft1"] and pool.loaded() == [("base", *F32)]
    _same(lazy, loaded)


@pytest.mark.parametrize("level", ["attn_mlp", "head_mlp"])
def test_slwm_weights_load_no_fine_tune_and_equal_those_of_loaded_models(tiny_llama, monkeypatch, level):
    from forgetlab.merge.methods.slwm import slwm_weights

    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    mine = pool.load("ft0")
    kw = dict(models=["ft0", "ft1"], level=level, samples=5, batch_size=2)     # 3 batches per task, grouped
    watch = LoadWatch(pool)
    with watch.watching():
        lazy = slwm_weights(pool, ["math", "copy"], **kw)
    assert watch.names == [] and pool.loaded() == [("ft0", *F32)] and pool.load("ft0") is mine

    base = pool.load("base")                      # the tuple form: models in memory, one batch at a time
    ref = slwm_weights((base, [pool.load("ft0"), pool.load("ft1")], pool.tokenizer,
                        [pool.probes.tasks[t].probe for t in ("math", "copy")]), ["math", "copy"],
                       models=["ft0", "ft1"], level=level, samples=5, batch_size=2)
    pool.unload()

    import forgetlab.merge.methods.slwm as slwm

    monkeypatch.setattr(slwm, "stored_params", lambda *a, **k: None)          # working_copy's, as slwm reads it
    watch = LoadWatch(pool)
    with watch.watching():
        loaded = slwm_weights(pool, ["math", "copy"], **kw)
    assert watch.names == ["base", "ft0", "ft1"] and pool.loaded() == []
    for other in (ref, loaded):
        assert [s.label for s in other.submodules] == [s.label for s in lazy.submodules]
        for s, o in zip(lazy.submodules, other.submodules):
            assert (s.gram == o.gram).all() and (s.weights == o.weights).all(), s.label
