"""Submodule-linearity merging on fused and quirky decoder families (Phi-3's fused qkv, GPT-NeoX's per-head
query_key_value, Gemma-2's soft-capping and sliding windows, Mixtral's experts): weights finite at every level,
the merge runs, and a head's block of a fused projection is merged with that head's own weights."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from forgetlab.merge.methods.slwm import slwm_merge
from tests.conftest import make_tiny_pool

FAMILIES = ("phi3", "gpt_neox", "gemma2", "mixtral")


@pytest.fixture(scope="module", params=FAMILIES)
def fam_pool(request, tmp_path_factory):
    from forgetlab.core.pool import ModelPool

    tiny = make_tiny_pool(tmp_path_factory.mktemp(f"slwm_{request.param}"), request.param, scale=0.05)
    return request.param, ModelPool.from_yaml(tiny.pool_yaml)


@pytest.mark.parametrize("level", ["layer", "attn_mlp", "head_mlp"])
def test_weights_finite_and_merge_runs(fam_pool, level):
    family, pool = fam_pool
    merged, table = slwm_merge(pool, ["math", "copy"], models=["ft0", "ft1"], level=level, samples=3)
    base = pool.load("base").state_dict()
    assert set(merged) == set(base)
    assert len(table) and np.isfinite(table[["math", "copy"]].to_numpy()).all()
    assert all(torch.isfinite(t).all() for t in merged.values())
    if level != "head_mlp":
        return
    from forgetlab.core.anatomy import Anatomy

    an = Anatomy.from_model(pool.load("base"))
    heads = table[(table.module == "head") & (table.layer == 1)][["math", "copy"]].to_numpy()
    assert np.ptp(heads[:, 0]) > 1e-3          # heads get their own weights, so a wrong slice would show
    th = [pool.load(m).state_dict() for m in ("ft0", "ft1")]
    for h in range(an.num_heads):
        w = table[(table.module == "head") & (table.layer == 1) & (table["head"] == h)][["math", "copy"]]
        w = w.to_numpy()[0]
        q = an.head_slices(1, h)[0]            # head h's query rows (of the fused qkv where there is one)
        want = q.take(base[q.name]) + sum(float(w[j]) * (q.take(th[j][q.name]) - q.take(base[q.name]))
                                          for j in range(2))
        torch.testing.assert_close(q.take(merged[q.name]), want, atol=1e-5, rtol=1e-4)
