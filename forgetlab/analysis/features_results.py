"""What a feature map holds (`forgetlab.analysis.features`): the pooled features of every (model, task, probe
sample) and their t-SNE map with the distances between task clusters. Plots and the Runs page read these without
importing the analysis."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd

from forgetlab.core.anatomy import part_words


@dataclass
class FeatureSet:
    """Pooled features: ``X`` [samples × features] and ``labels`` (task, model, sample) per row."""

    X: np.ndarray
    labels: pd.DataFrame
    level: str
    layer: Optional[int]
    head: Optional[int]
    pooling: str

    def __len__(self) -> int:
        return int(self.X.shape[0])

    def to_frame(self) -> pd.DataFrame:
        """The labels with the features as columns f0, f1, …"""
        feats = pd.DataFrame(self.X, columns=[f"f{i}" for i in range(self.X.shape[1])])
        return pd.concat([self.labels.reset_index(drop=True), feats], axis=1)


@dataclass
class TsneResult:
    """t-SNE coordinates (x, y, task, model, sample) and the distances between task clusters."""

    coords: pd.DataFrame
    distances: pd.DataFrame
    backend: str
    perplexity: float
    pca_dims: int
    seed: int
    meta: dict = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        """The coordinates with their labels."""
        return self.coords.copy()

    def cluster_summary(self) -> pd.DataFrame:
        """Per model: the average distance between task clusters (t-SNE plane and PCA space)."""
        if self.distances.empty:
            return pd.DataFrame(columns=["model", "mean_distance_tsne", "mean_distance_pca", "pairs"])
        g = self.distances.groupby("model", sort=False)
        return pd.DataFrame({"mean_distance_tsne": g["distance_tsne"].mean(),
                             "mean_distance_pca": g["distance_pca"].mean(),
                             "pairs": g.size()}).reset_index()

    def to_dict(self) -> dict:
        """JSON-ready: the coordinates, the distances and the t-SNE settings."""
        return {"coords": self.coords.to_dict(orient="list"), "distances": self.distances.to_dict(orient="list"),
                "backend": self.backend, "perplexity": self.perplexity, "pca_dims": self.pca_dims,
                "seed": self.seed, "meta": self.meta}

    @classmethod
    def from_dict(cls, d: dict) -> "TsneResult":
        """The result of `to_dict`."""
        return cls(pd.DataFrame(d["coords"]), pd.DataFrame(d["distances"]), d["backend"], d["perplexity"],
                   d["pca_dims"], d["seed"], d.get("meta", {}))


def submodule_words(result: TsneResult) -> str:
    """The submodule a map read, in words ("layer 3", "layer 3's MLP", "the last hidden state")."""
    level = result.meta.get("level")
    if level in (None, "model"):
        return "the last hidden state"
    return part_words(result.meta.get("layer"), level, result.meta.get("head"))


def takeaway(result: TsneResult) -> list[str]:
    """The map in two sentences: the model whose task clusters sit furthest apart — the mean distance between task
    centres in PCA space (`cluster_summary`, in the features' own units; t-SNE distances are only indicative) —
    beside the model where they sit closest, then that model's most and least separated pair of tasks. Nothing
    with fewer than two tasks."""
    summary = result.cluster_summary().dropna(subset=["mean_distance_pca"])
    if summary.empty:
        return []
    far = summary.loc[summary["mean_distance_pca"].idxmax()]
    near = summary.loc[summary["mean_distance_pca"].idxmin()]
    first = (f"Read at {submodule_words(result)}, the tasks sit furthest apart in the {far['model']} model: "
             f"{far['mean_distance_pca']:.3g} on average between task centres (distance in the "
             f"{result.pca_dims}-dimension PCA space)")
    first += (f", and closest in the {near['model']} model ({near['mean_distance_pca']:.3g})." if len(summary) > 1
              and near["model"] != far["model"] else ".")
    pairs = result.distances[result.distances["model"] == far["model"]].dropna(subset=["distance_pca"])
    if len(pairs) < 2:
        return [first]
    a, b = pairs.loc[pairs["distance_pca"].idxmax()], pairs.loc[pairs["distance_pca"].idxmin()]
    return [first, f"There, {a['task_a']} and {a['task_b']} are the most separated pair ({a['distance_pca']:.3g}), "
                   f"{b['task_a']} and {b['task_b']} the least ({b['distance_pca']:.3g})."]
