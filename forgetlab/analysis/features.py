"""Submodule features across tasks and models, and their t-SNE map.

`capture_features` runs each model (base, fine-tuned, merged: any set) on the probe samples of each task and
reads one submodule's output with a forward hook: the decoder's last hidden state (``model``), a decoder layer
(``layer``), its attention (``attn``), its MLP (``mlp``) or one head's contribution to the attention output
(``head``, see `forgetlab.core.submodules.head_outputs`) or, in a mixture of experts, one expert's output on the
tokens the model's router sent it, without the routing weight (``expert``, see
`forgetlab.core.submodules.one_expert`). Each sample becomes one vector: the mean over its answer tokens
(``pooling="answer"``) or its last token (``pooling="last"``); at the expert level only the tokens routed to the
expert count, and a sample none of whose pooled tokens reached it gets the zero vector.

`embed_tsne` standardises nothing and reduces with PCA to at most 50 dimensions, then runs t-SNE (openTSNE;
scikit-learn's TSNE when openTSNE is missing), seeded. It returns the 2-D coordinates with their (task, model)
labels and, per model, the distances between task clusters: the Euclidean distance between the centroids of two
tasks' points, in the t-SNE plane and in the PCA space, and their average over task pairs.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
import torch

from forgetlab.analysis.base import ANALYSES, Analysis, Output
from forgetlab.analysis.features_memory import estimate_features
from forgetlab.analysis.features_results import FeatureSet, TsneResult, takeaway
from forgetlab.core.anatomy import Anatomy
from forgetlab.core.errors import MissingDependencyError, ParameterError
from forgetlab.core.memory import dtype_name, job_dtype
from forgetlab.core.progress import Progress, report, scaled
from forgetlab.core.settings import count_field, device_field, dtype_field, setting
from forgetlab.core.submodules import (encode_samples, head_outputs, last_hidden, one_expert, select_pairs,
                                       first_tensor, strip_kwargs)
from forgetlab.plots.features import figures

FEATURE_LEVELS = ("model", "layer", "attn", "mlp", "head", "expert")
POOLINGS = ("answer", "last")
BACKENDS = ("auto", "opentsne", "sklearn")
SEED_MAX = 2**32 - 1        # numpy's legacy seeding, which scikit-learn's PCA and both t-SNEs use


def _resolve(pool_or_data, models, tasks, device, dtype):
    """({label: model, or None for a pool model loaded when its turn comes}, the loader, tokenizer,
    {task: pairs}, template). The loader gives a label's model and a function releasing it once its features
    are taken: a pool model is loaded in `dtype` (`ModelPool.load`) and unloaded after, so the job holds one
    model at a time; a given model is used as it is (cast to `dtype` only when one is given)."""
    if isinstance(pool_or_data, (tuple, list)):
        if len(pool_or_data) != 3:
            raise ParameterError("Pass a ModelPool or a ({name: model}, tokenizer, {task: pairs}) tuple.")
        mods, tok, pairs = pool_or_data
        mods = dict(mods)
        if models is not None:
            mods = {m: mods[m] for m in models}
        pairs = dict(pairs)
        if tasks is not None:
            missing = [t for t in tasks if t not in pairs]
            if missing:
                raise ParameterError(f"No probe data for task(s) {missing}; known: {', '.join(pairs)}.")
            pairs = {t: pairs[t] for t in tasks}

        def given(name):
            model = mods[name]
            if dtype is not None and next(model.parameters()).dtype != dtype:
                model = copy.deepcopy(model).to(dtype)
            return model, lambda: None

        return mods, given, tok, pairs, None
    pool = pool_or_data
    dt = job_dtype(dtype, device)
    names = list(models) if models is not None else ["base", *pool.model_names]
    for n in names:
        pool.checkpoint(n)          # an unknown name is refused before any model is loaded

    def load(name):
        return pool.load(name, device=device, dtype=dt), lambda: pool.unload(name)

    tasks = list(tasks) if tasks is not None else list(pool.probes.tasks)
    pairs = {t: pool.probes.task(t).probe for t in tasks}
    return dict.fromkeys(names), load, pool.tokenizer, pairs, getattr(pool.probes, "template", None)


def _pool_rows(x: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor, pooling: str,
               keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[b, s, h] → [b, h]: mean over answer positions [start, length) or the last real token; with ``keep``
    ([b, s] bool: an expert's routed tokens) only the kept ones count (the zero vector where none is)."""
    if pooling == "last":
        if keep is not None:
            x = x * keep[:, :, None].to(x.dtype)
        return x[torch.arange(x.shape[0]), lengths - 1]
    pos = torch.arange(x.shape[1])[None, :]
    m = (pos >= starts[:, None]) & (pos < lengths[:, None])
    m = (m if keep is None else m & keep).to(x.dtype)
    return (x * m[:, :, None]).sum(1) / m.sum(1, keepdim=True).clamp_min(1)


@torch.no_grad()
def _model_features(model, anatomy: Optional[Anatomy], ids, level, layer, head):
    """The submodule's output ``[batch, seq, hidden]`` on ``ids`` and the tokens that count (an expert's routed
    tokens ``[batch, seq]``; None: all)."""
    if level == "model":
        return last_hidden(model, anatomy, ids), None
    mods = dict(model.named_modules())
    got: dict[str, Any] = {}
    if level == "expert":
        target = mods[anatomy.experts_path(layer)]

        def routed(mod, args, kwargs):
            names = ("hidden_states", "top_k_index")
            got["in"] = list(args[:2]) + [kwargs.get(n) for n in names[len(args[:2]):]]
        handle = target.register_forward_pre_hook(routed, with_kwargs=True)
    elif level == "head":
        target = mods[anatomy.attn_path(layer)]

        def pre(mod, args, kwargs):
            got["args"] = tuple(args)
            got["kw"] = strip_kwargs(kwargs)
        handle = target.register_forward_pre_hook(pre, with_kwargs=True)
    else:
        target = mods[anatomy.module_path(level, layer)]
        handle = target.register_forward_hook(lambda m, a, o: got.__setitem__("out", first_tensor(o)))
    try:
        last_hidden(model, anatomy, ids)
    finally:
        handle.remove()
    if level == "head":
        return head_outputs(anatomy, target, got["args"], got["kw"])[:, head], None
    if level == "expert":
        y, routed = one_expert(target, got["in"][0], got["in"][1], head)
        return y.reshape(*ids.shape, -1), routed.reshape(ids.shape).cpu()
    return got["out"], None


def _check_anatomy(anatomy: Optional[Anatomy], name: str, model) -> None:
    """Refuse a model whose submodule structure differs from the first model's."""
    if anatomy is None:
        return
    try:
        other = Anatomy.from_model(model)
    except ParameterError:
        other = None
    if other is None or not anatomy.same_structure(other):
        raise ParameterError(f"Model {name!r} has a different submodule structure "
                             f"({other.describe() if other else 'unknown'}) from the first "
                             f"({anatomy.describe()}); compare models of one architecture.")


def _check_position(anatomy: Optional[Anatomy], level: str, layer: Optional[int],
                    head: Optional[int]) -> tuple[Optional[int], Optional[int]]:
    """(layer, head) of the submodule read: the layer counted from 0 (None at the model level), the head (None
    below the head level); a ParameterError for one the model does not have."""
    if level == "model":
        return None, None
    n = anatomy.num_layers
    if layer is None or not (-n <= layer < n):
        raise ParameterError(f"Layer {layer!r} does not exist: this model has layers 0..{n - 1} (or -1 for last).")
    anatomy.check_level(level)
    if level == "head" and (head is None or not (0 <= head < anatomy.num_heads)):
        raise ParameterError(f"The head level needs head= one of 0..{anatomy.num_heads - 1}.")
    if level == "expert" and (head is None or not (0 <= head < anatomy.num_experts)):
        raise ParameterError(f"The expert level needs head= the expert's index, one of 0..{anatomy.num_experts - 1}.")
    return layer % n, head if level in ("head", "expert") else None


def capture_features(pool_or_data, tasks: Optional[Sequence[str]] = None, models: Optional[Sequence[str]] = None, *,
                     level: str = "layer", layer: Optional[int] = -1, head: Optional[int] = None,
                     pooling: str = "answer", samples: Optional[int] = 30, batch_size: int = 8,
                     max_length: int = 128, device: Optional[str] = None, dtype=None,
                     progress: Progress = None) -> FeatureSet:
    """One pooled feature vector per (model, task, probe sample) for a chosen submodule (module docstring).

    ``pool_or_data``: a ModelPool (``models`` are pool names, default base + every fine-tuned model; ``tasks``
    default every task) or a ``({label: model}, tokenizer, {task: pairs})`` tuple (e.g. with a merged model).
    ``layer`` may be negative (−1 = last layer); ``head`` is needed for the ``head`` level (the head) and the
    ``expert`` level (the expert's index).
    ``dtype`` (None: bfloat16 on cuda, float32 elsewhere; a tuple's models keep theirs unless one is given) is
    the precision the models run in; the pooling and everything after it are in float32. From a pool the models
    are loaded one at a time and released after their features are taken. Its peak:
    `forgetlab.analysis.features_memory`.
    """
    if level not in FEATURE_LEVELS:
        raise ParameterError(f"Unknown level {level!r}; choose one of {', '.join(FEATURE_LEVELS)}.")
    if pooling not in POOLINGS:
        raise ParameterError(f"pooling must be one of {', '.join(POOLINGS)}; got {pooling!r}.")
    mods, load, tok, pairs, template = _resolve(pool_or_data, models, tasks, device, dtype)
    if not mods:
        raise ParameterError("No models to capture features from.")
    if not pairs:
        raise ParameterError("No tasks to capture features for; the pool has no probe data.")
    encs = {t: encode_samples(tok, select_pairs(p, samples, t), max_length=max_length, template=template)
            for t, p in pairs.items()}
    names = list(mods)
    first, release_first = load(names[0])
    try:
        try:
            anatomy = Anatomy.from_model(first)
        except ParameterError:
            if level != "model":
                raise
            anatomy = None
        for name, m in mods.items():       # given models are all at hand: check them before any work
            if m is not None:
                _check_anatomy(anatomy, name, m)
        layer, head = _check_position(anatomy, level, layer, head)
    except BaseException:
        release_first()
        raise
    rows, labels = [], []
    total = sum(len(range(0, len(e), batch_size)) for e in encs.values()) * len(mods)
    done = 0
    for k, mname in enumerate(names):
        if k == 0:
            model, release, first = first, release_first, None
        else:
            model, release = load(mname)
        try:
            if k > 0 and mods[mname] is None:
                _check_anatomy(anatomy, mname, model)
            dev = next(model.parameters()).device
            for t, enc in encs.items():
                for a in range(0, len(enc), batch_size):
                    chunk = enc.chunk(a, min(a + batch_size, len(enc)))
                    feats, keep = _model_features(model, anatomy, chunk.input_ids.to(dev), level, layer, head)
                    rows.append(_pool_rows(feats.float().cpu(), chunk.lengths, chunk.answer_starts, pooling, keep))
                    del feats
                    labels += [{"task": t, "model": mname, "sample": a + i} for i in range(len(chunk))]
                    done += 1
                    report(progress, done / total, f"{mname}: {t}")
        finally:
            del model
            release()
    X = torch.cat(rows).numpy().astype(np.float64)
    return FeatureSet(X, pd.DataFrame(labels), level, layer, head, pooling)


def pca_reduce(X: np.ndarray, dims: int = 50, seed: int = 0) -> np.ndarray:
    """Centre and project onto the top min(dims, n_samples, n_features) principal components (scikit-learn PCA)."""
    from sklearn.decomposition import PCA

    k = int(min(dims, X.shape[0], X.shape[1]))
    if k < 1:
        raise ParameterError("No features to reduce.")
    if k == X.shape[1] and k <= dims:
        return X - X.mean(0, keepdims=True)
    return PCA(n_components=k, random_state=seed).fit_transform(X)


def tsne_2d(Y: np.ndarray, perplexity: float = 30.0, seed: int = 0, backend: str = "auto",
            n_jobs: int = 1) -> tuple[np.ndarray, str]:
    """2-D t-SNE of ``Y`` with openTSNE (or scikit-learn when asked or when openTSNE is missing); seeded, so the
    same input and seed give the same map. Returns (coordinates, backend used)."""
    if backend not in BACKENDS:
        raise ParameterError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}.")
    n = Y.shape[0]
    if n < 4:
        raise ParameterError(f"t-SNE needs at least 4 points; got {n}. Use more samples, tasks or models.")
    perp = float(min(perplexity, (n - 1) / 3.0))
    if backend in ("auto", "opentsne"):
        try:
            from openTSNE import TSNE as OTSNE
        except ImportError:
            if backend == "opentsne":
                raise MissingDependencyError("openTSNE is not installed: pip install openTSNE") from None
        else:
            emb = OTSNE(n_components=2, perplexity=perp, random_state=seed, n_jobs=n_jobs, verbose=False,
                        neighbors="exact" if n < 1000 else "auto",
                        negative_gradient_method="bh" if n < 1000 else "fft").fit(np.ascontiguousarray(Y))
            return np.asarray(emb), "opentsne"
    from sklearn.manifold import TSNE

    out = TSNE(n_components=2, perplexity=perp, random_state=seed, init="pca", n_jobs=n_jobs).fit_transform(Y)
    return np.asarray(out), "sklearn"


def cluster_distances(points: np.ndarray, labels: pd.DataFrame) -> pd.DataFrame:
    """Per model and pair of tasks: the Euclidean distance between the two tasks' centroids in ``points``."""
    rows = []
    for model, grp in labels.groupby("model", sort=False):
        cents = {t: points[idx.to_numpy()].mean(0) for t, idx in grp.groupby("task", sort=False).groups.items()}
        for a, b in combinations(cents, 2):
            rows.append({"model": model, "task_a": a, "task_b": b,
                         "distance": float(np.linalg.norm(cents[a] - cents[b]))})
    return pd.DataFrame(rows, columns=["model", "task_a", "task_b", "distance"])


def check_tsne(perplexity: float = 30.0, seed: int = 0, pca_dims: int = 50) -> None:
    """ParameterError unless the t-SNE settings are ones scikit-learn and openTSNE accept: a finite perplexity > 0,
    at least one PCA dimension, and a seed from 0 to 2**32 − 1 (numpy's legacy seeding)."""
    if not 0 < float(perplexity) < float("inf"):
        raise ParameterError(f"perplexity must be a finite number > 0 (about the number of neighbours each point "
                             f"keeps; 30 is usual); got {perplexity}.")
    if int(pca_dims) < 1:
        raise ParameterError(f"pca_dims must be at least 1 (the dimensions PCA keeps before t-SNE; 50 is usual); "
                             f"got {pca_dims}.")
    if isinstance(seed, bool) or not 0 <= int(seed) <= SEED_MAX:
        raise ParameterError(f"seed must be a whole number from 0 to 2**32 − 1 (numpy's seeds, which PCA and t-SNE "
                             f"use); got {seed!r}.")


def embed_tsne(features: FeatureSet, *, perplexity: float = 30.0, seed: int = 0, pca_dims: int = 50,
               backend: str = "auto", progress: Progress = None) -> TsneResult:
    """PCA to ``pca_dims`` dimensions, then seeded 2-D t-SNE; coordinates with (task, model) labels and the
    distances between task clusters per model (module docstring). Settings are checked by `check_tsne`."""
    check_tsne(perplexity, seed, pca_dims)
    if len(features) == 0:
        raise ParameterError("No features to embed.")
    report(progress, 0.05, "PCA")
    labels = features.labels.reset_index(drop=True)
    Y = pca_reduce(features.X, pca_dims, seed)
    report(progress, 0.2, "t-SNE")
    xy, used = tsne_2d(Y, perplexity, seed, backend)
    coords = labels.assign(x=xy[:, 0], y=xy[:, 1])[["x", "y", "task", "model", "sample"]]
    d_t = cluster_distances(xy, labels).rename(columns={"distance": "distance_tsne"})
    d_p = cluster_distances(Y, labels).rename(columns={"distance": "distance_pca"})
    dist = d_t.merge(d_p, on=["model", "task_a", "task_b"], how="outer")
    report(progress, 1.0, "done")
    return TsneResult(coords, dist, used, float(min(perplexity, (len(features) - 1) / 3.0)), int(Y.shape[1]), seed,
                      {"level": features.level, "layer": features.layer, "head": features.head,
                       "pooling": features.pooling})


def feature_map(pool_or_data, tasks=None, models=None, *, level: str = "layer", layer: Optional[int] = -1,
                head: Optional[int] = None, pooling: str = "answer", samples: Optional[int] = 30,
                perplexity: float = 30.0, seed: int = 0, pca_dims: int = 50, backend: str = "auto",
                device: Optional[str] = None, dtype=None, progress: Progress = None) -> TsneResult:
    """`capture_features` (in `dtype`) then `embed_tsne`, in one call (what the Features page and CLI run)."""
    check_tsne(perplexity, seed, pca_dims)                 # before the features are captured, not after
    fs = capture_features(pool_or_data, tasks, models, level=level, layer=layer, head=head, pooling=pooling,
                          samples=samples, device=device, dtype=dtype, progress=scaled(progress, 0.0, 0.6))
    result = embed_tsne(fs, perplexity=perplexity, seed=seed, pca_dims=pca_dims, backend=backend,
                        progress=scaled(progress, 0.6, 1.0))
    result.meta.update(models=list(dict.fromkeys(fs.labels["model"])), tasks=list(dict.fromkeys(fs.labels["task"])),
                       samples=samples, dtype=dtype_name(job_dtype(dtype, device)))
    return result


# ------------------------------------------------------------------------------------------ the analysis


@dataclass
class FeaturesSettings:
    """What a feature map captures and embeds: `models` × `tasks` probe samples at a submodule `level`
    (`layer`, `head`), pooled per sample, then PCA and t-SNE. None takes every model / task."""

    models: Optional[tuple[str, ...]] = setting(None, help="models (default: base and every fine-tuned model)")
    tasks: Optional[tuple[str, ...]] = setting(None, help="tasks (default: all)")
    level: str = setting("layer", help="submodule", choices=FEATURE_LEVELS)
    layer: Optional[int] = setting(-1, help="layer index (negative counts from the end)")
    head: Optional[int] = setting(None, help="head index for --level head; the expert's index for --level expert")
    pooling: str = setting("answer", help="mean over the answer tokens, or the last token", choices=POOLINGS)
    samples: Optional[int] = count_field(None, "probe samples per task (default: all)")
    perplexity: float = setting(30.0, help="t-SNE's neighbourhood size: about how many neighbours each point keeps "
                                           "close (capped at (points − 1) / 3)")
    pca_dims: int = setting(50, help="dimensions PCA keeps before t-SNE")
    seed: int = setting(0, help="seed of PCA and t-SNE (a whole number from 0 to 2**32 − 1)", range=(0, SEED_MAX))
    backend: str = setting("auto", help="t-SNE implementation (auto: openTSNE when installed)", choices=BACKENDS)
    device: Optional[str] = device_field()
    dtype: Optional[str] = dtype_field("the models' forward passes (the pooled features, PCA and t-SNE are "
                                       "float32)")


def _arguments(settings: FeaturesSettings) -> dict:
    """`feature_map`'s keyword arguments from the settings (tasks and models as lists)."""
    values = asdict(settings)
    for name in ("models", "tasks"):
        values[name] = list(values[name]) if values[name] is not None else None
    return values


def check_settings(settings: FeaturesSettings, pool=None) -> None:
    """What the declarations cannot say: the t-SNE settings (`check_tsne`); with the pool, the models and tasks
    it has."""
    check_tsne(settings.perplexity, settings.seed, settings.pca_dims)
    if pool is not None:
        known = {"model": ["base", *pool.model_names], "task": list(pool.task_names)}
        for what, chosen in (("model", settings.models), ("task", settings.tasks)):
            missing = [c for c in (chosen or []) if c not in known[what]]
            if missing:
                raise ParameterError(f"The pool has no {what} {missing[0]!r}; its {what}s are: "
                                     f"{', '.join(known[what]) or 'none'}.")


def compute(pool, settings: FeaturesSettings, progress: Progress = None, executor=None) -> TsneResult:
    """`feature_map` with these settings."""
    values = _arguments(settings)
    return feature_map(pool, values.pop("tasks"), values.pop("models"), progress=progress, **values)


def estimate(pool, settings: FeaturesSettings):
    """The map's peak (`estimate_features`)."""
    return estimate_features(pool, **_arguments(settings))


def recipe(result: TsneResult) -> dict:
    """What a saved feature map records: what it captured (models, tasks, submodule, samples, dtype) and the
    t-SNE settings."""
    return {**result.meta, "perplexity": result.perplexity, "seed": result.seed, "pca_dims": result.pca_dims}


def cli_report(result: TsneResult) -> list:
    """The CLI's lines: the points and how they were mapped, then the distances between task clusters."""
    return [f"{len(result.coords)} points, t-SNE by {result.backend} (perplexity {result.perplexity:g}, PCA "
            f"{result.pca_dims} dims)", "average distance between task clusters:", result.cluster_summary()]


ANALYSIS = ANALYSES.add("features", Analysis(
    "features", "feature map", FeaturesSettings, compute, TsneResult,
    help="t-SNE map of a submodule's features across tasks and models",
    description="Capture a submodule's output on each task's probe samples for each model, pool it (answer tokens "
                "or last token), reduce with PCA to 50 dimensions, map with t-SNE, and report the distances "
                "between task clusters.",
    checks=check_settings, estimate_fn=estimate, figures_fn=figures, recipe=recipe, report=cli_report,
    saved_table=TsneResult.cluster_summary, takeaway_fn=takeaway,
    outputs=(Output("--distances", "CSV file for the task-cluster distances", lambda r: r.distances),)))
