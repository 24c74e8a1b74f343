"""forgetlab.analysis.features: submodule feature capture, pooling, PCA + t-SNE, cluster distances."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from forgetlab.analysis.features import (FeatureSet, TsneResult, capture_features, cluster_distances, embed_tsne,
                                         feature_map, _pool_rows)
from forgetlab.core.errors import ForgetlabError


def test_pooling_hand_computed():
    x = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)  # sample 0: 0..3, sample 1: 4..7
    lengths, starts = torch.tensor([4, 3]), torch.tensor([2, 1])
    assert _pool_rows(x, lengths, starts, "answer").flatten().tolist() == [2.5, 5.5]  # mean(2,3), mean(5,6)
    assert _pool_rows(x, lengths, starts, "last").flatten().tolist() == [3.0, 6.0]


def test_capture_matches_a_manual_hook(pool):
    fs = capture_features(pool, ["math"], ["base", "ft0"], level="mlp", layer=1, pooling="last", samples=3)
    assert fs.X.shape == (6, 32) and list(fs.labels.model) == ["base"] * 3 + ["ft0"] * 3
    from forgetlab.core.submodules import encode_samples

    model = pool.load("ft0")
    enc = encode_samples(pool.tokenizer, pool.probes.task("math").probe[:3])
    got = {}
    h = model.model.layers[1].mlp.register_forward_hook(lambda m, a, o: got.__setitem__("o", o))
    with torch.no_grad():
        model(enc.input_ids[1:2, : int(enc.lengths[1])])
    h.remove()
    np.testing.assert_allclose(fs.X[4], got["o"][0, -1].numpy(), atol=1e-5)


def test_levels_and_head_features_sum_to_attention(pool):
    attn = capture_features(pool, ["copy"], ["ft1"], level="attn", layer=0, samples=4)
    heads = [capture_features(pool, ["copy"], ["ft1"], level="head", layer=0, head=h, samples=4)
             for h in range(4)]
    bias = 0.0  # Llama o_proj has no bias
    np.testing.assert_allclose(sum(h.X for h in heads) + bias, attn.X, atol=1e-5)
    model_level = capture_features(pool, ["copy"], ["ft1"], level="model", samples=4)
    assert model_level.layer is None and model_level.X.shape == (4, 32)


def test_tsne_one_point_per_sample_and_reproducible(pool):
    fs = capture_features(pool, None, None, level="layer", layer=-1, samples=8)
    assert len(fs) == 3 * 2 * 8 and fs.layer == 1
    a = embed_tsne(fs, perplexity=5, seed=3)
    b = embed_tsne(fs, perplexity=5, seed=3)
    c = embed_tsne(fs, perplexity=5, seed=4)
    assert len(a.coords) == len(fs) and list(a.coords.columns) == ["x", "y", "task", "model", "sample"]
    np.testing.assert_array_equal(a.coords[["x", "y"]].to_numpy(), b.coords[["x", "y"]].to_numpy())
    assert not np.allclose(a.coords[["x", "y"]].to_numpy(), c.coords[["x", "y"]].to_numpy())
    assert a.backend == "opentsne"
    assert len(a.distances) == 3 and set(a.cluster_summary().model) == {"base", "ft0", "ft1"}
    back = TsneResult.from_dict(a.to_dict())
    pd.testing.assert_frame_equal(back.coords, a.coords)


def test_sklearn_backend_and_separated_clusters():
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(0, 0.1, (20, 60)), rng.normal(5, 0.1, (20, 60))])
    labels = pd.DataFrame({"task": ["a"] * 20 + ["b"] * 20, "model": "m", "sample": list(range(40))})
    fs = FeatureSet(X, labels, "layer", 0, None, "answer")
    for backend in ("sklearn", "opentsne"):
        r = embed_tsne(fs, perplexity=10, seed=0, backend=backend)
        assert r.backend == backend and r.pca_dims == 40
        d = r.distances.iloc[0]
        # centroid distance in PCA space = distance of the generating means, √60·5 ≈ 38.7
        assert d.distance_pca == pytest.approx(np.sqrt(60) * 5, rel=0.02)
        within = r.coords.groupby("task")[["x", "y"]].std().to_numpy().max()
        assert d.distance_tsne > 3 * within


def test_cluster_distances_hand_computed():
    pts = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 3.0], [0.0, 5.0]])
    labels = pd.DataFrame({"task": ["a", "a", "b", "b"], "model": "m"})
    d = cluster_distances(pts, labels)
    assert d.distance.iloc[0] == pytest.approx(np.hypot(1.0, 4.0))


def test_tuple_input_with_merged_model_and_feature_map(pool):
    base = pool.load("base")
    data = ({"base": base, "merged": pool.load("ft0")}, pool.tokenizer,
            {t: pool.probes.task(t).probe for t in ("math", "copy")})
    r = feature_map(data, level="mlp", layer=0, samples=4, perplexity=3)
    assert set(r.coords.model) == {"base", "merged"} and len(r.coords) == 16


def test_bad_input(pool):
    with pytest.raises(ForgetlabError, match="layers 0..1"):
        capture_features(pool, ["math"], ["base"], level="layer", layer=5, samples=2)
    with pytest.raises(ForgetlabError, match="head="):
        capture_features(pool, ["math"], ["base"], level="head", layer=0, samples=2)
    with pytest.raises(ForgetlabError, match="Unknown level"):
        capture_features(pool, ["math"], ["base"], level="block", samples=2)
    with pytest.raises(ForgetlabError, match="no task"):
        capture_features(pool, ["nope"], ["base"], samples=2)
    with pytest.raises(ForgetlabError, match="probe samples"):
        capture_features(pool, ["math"], ["base"], samples=500)
    with pytest.raises(ForgetlabError, match="at least 4 points"):
        embed_tsne(capture_features(pool, ["math"], ["base"], samples=3))
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(LlamaConfig(vocab_size=len(pool.tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ForgetlabError, match="different submodule structure"):
        capture_features(({"a": pool.load("base"), "b": other}, pool.tokenizer,
                          {"math": pool.probes.task("math").probe}), samples=2)
