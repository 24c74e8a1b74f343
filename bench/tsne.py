"""openTSNE against scikit-learn's TSNE on the same 5,000 points (PCA-reduced to 50 dimensions), same seed,
perplexity and thread count; prints both times and their ratio, and how well each separates the clusters.

    /work/venv/bin/python bench/tsne.py [--points 5000 --threads 1]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
import torch

from forgetlab.analysis.features import cluster_distances, pca_reduce, tsne_2d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=5000)
    ap.add_argument("--dims", type=int, default=256, help="feature dimensions before PCA")
    ap.add_argument("--clusters", type=int, default=6)
    ap.add_argument("--perplexity", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    centres = rng.normal(0, 3, (args.clusters, args.dims))
    labels = rng.integers(0, args.clusters, args.points)
    X = centres[labels] + rng.normal(0, 1, (args.points, args.dims))
    Y = pca_reduce(X, 50, args.seed)
    frame = pd.DataFrame({"task": labels.astype(str), "model": "m"})
    print(f"{args.points} points, {args.dims} dims → PCA {Y.shape[1]}; perplexity {args.perplexity}; "
          f"n_jobs = {args.threads}; seed {args.seed}")
    times, seps = {}, {}
    for backend in ("opentsne", "sklearn"):
        t0 = time.perf_counter()
        xy, used = tsne_2d(Y, args.perplexity, args.seed, backend, n_jobs=args.threads)
        times[backend] = time.perf_counter() - t0
        d = cluster_distances(xy, frame)["distance"].mean()
        spread = np.mean([xy[labels == c].std(0).mean() for c in range(args.clusters)])
        seps[backend] = d / spread
        print(f"{used:9s}: {times[backend]:7.2f} s   mean centroid distance / within-cluster spread = "
              f"{seps[backend]:.1f}")
    print(f"scikit-learn time / openTSNE time = {times['sklearn'] / times['opentsne']:.2f} "
          "(above 1: openTSNE is faster)")


if __name__ == "__main__":
    main()
