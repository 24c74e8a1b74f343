"""Task vectors streamed from disk against the same numbers computed on whole state dicts."""
from __future__ import annotations

import pytest
import torch

from forgetlab.core.taskvectors import checkpoint_distance, cosine_matrix, distance, task_vector_norms
from forgetlab.core.checkpoints import open_checkpoint
from forgetlab.core.pool import ModelPool


def _full_tau(pool, name):
    base = open_checkpoint(pool.base_ref).state_dict()
    tuned = pool.checkpoint(name).state_dict()
    return {k: tuned[k] - base[k] for k in base}, base


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_gpt2"])
def test_norms_and_cosines_match_whole_vectors(fixture, request):
    pool = ModelPool.from_yaml(request.getfixturevalue(fixture).pool_yaml)
    taus = {}
    for name in pool.model_names:
        tau, base = _full_tau(pool, name)
        taus[name] = torch.cat([t.reshape(-1) for t in tau.values()])
        norms = task_vector_norms(pool, name)
        assert norms.total == pytest.approx(float(taus[name].norm()), rel=1e-5)
        row = norms.to_frame().set_index("name").loc[next(iter(tau))]
        assert row["norm"] == pytest.approx(float(next(iter(tau.values())).norm()), rel=1e-6)
        by_level = norms.by_level()
        assert (by_level["norm"] ** 2).sum() == pytest.approx(norms.total ** 2, rel=1e-5)
        assert set(by_level["module"]) >= {"attn", "mlp"}
    cos = cosine_matrix(pool).to_frame()
    a, b = taus["ft0"], taus["ft1"]
    assert cos.loc["ft0", "ft1"] == pytest.approx(float(a @ b / (a.norm() * b.norm())), abs=1e-6)
    assert cos.loc["ft0", "ft0"] == pytest.approx(1.0)


def test_distance_hand_computed():
    theta0 = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0, 0.0]), "z": torch.zeros(2)}
    theta = {"a": torch.tensor([3.0, 9.0]), "b": torch.tensor([1.0, 2.0]), "z": torch.ones(2)}
    # a: ‖(0,5)‖/5 = 1; b: ‖(0,2)‖/1 = 2; z has base norm 0 and is left out → (1 + 2) / 2
    assert distance(theta, theta0) == pytest.approx(1.5)


def test_checkpoint_distance_matches_in_memory(tiny_llama):
    pool = ModelPool.from_yaml(tiny_llama.pool_yaml)
    base = pool.base.state_dict()
    tuned = pool.checkpoint("ft0").state_dict()
    assert checkpoint_distance(pool, "ft0") == pytest.approx(distance(tuned, base), rel=1e-6)


def test_distance_is_nan_wherever_no_partition_counts(tiny_llama, tmp_path):
    """One rule for the empty case (docs/methods.md#distance): no tensor with a non-zero base norm → NaN, in
    memory, streamed from checkpoints, and in a LoRA run's records (forgetlab.core.taskvectors.DistanceSum)."""
    import math

    from forgetlab.core.taskvectors import DistanceSum

    zeros = {"a": torch.zeros(3), "b": torch.zeros(2)}
    assert math.isnan(distance({"a": torch.ones(3), "b": torch.ones(2)}, zeros))
    assert math.isnan(distance({"c": torch.ones(3)}, {"a": torch.ones(3)}))        # no tensor in common
    acc = DistanceSum()
    acc.add(2.0, 0.0)
    assert math.isnan(acc.value)
    acc.add(1.0, 4.0)
    assert acc.value == pytest.approx(0.25) and acc.count == 1
