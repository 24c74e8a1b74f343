"""`slices` (mergekit's frankenmerges): output layers taken layer by layer from layer ranges of several models.

Output slice k stacks its sources' layers [start, end) after the layers of the slices before it; layer i of a
slice is the method merging layer start + i of every source (passthrough: copying the one source), with the
slice's parameters and gradients running over the slice (t = i/(n − 1)). Tensors outside the layers come from
the first slice's sources (embeddings) and the last slice's (final norm, lm_head), at t = 0, as mergekit's
planner takes them. Each source is read through `RenamedSource`, which gives a model's layer a+i under the
output name of layer j, so the engine's tensor-by-tensor merge (`merge_tensors`) runs unchanged.
"""
from __future__ import annotations

import re
from typing import Any, Iterator

from forgetlab.core import checkpoints as ck
from forgetlab.core.errors import IncompatibleModelsError
from forgetlab.merge.core import CheckpointSource, Entry, merge_tensors, tied_head
from forgetlab.merge.layers import FIRST, layer_from_name

_LAYER = re.compile(r"((?:^|\.)(?:layers|h|layer|blocks)\.)(\d+)(\.)")


def with_layer(name: str, index: int) -> str:
    """`name` with its layer index replaced by `index`."""
    return _LAYER.sub(lambda m: f"{m.group(1)}{index}{m.group(3)}", name, count=1)


class RenamedSource:
    """A merge source whose tensors are another source's under other names (output name → source name)."""

    def __init__(self, inner: CheckpointSource, names: dict[str, str]):
        self.inner, self.names = inner, names
        self.label, self.is_lora, self.ckpt = inner.label, inner.is_lora, inner.ckpt

    def nbytes(self, name: str) -> int:
        return self.inner.nbytes(self.names[name])

    def read(self, name: str, device: str = "cpu", buffer=None):
        return self.inner.read(self.names[name], device, buffer)

    def read_raw(self, name: str):
        return self.inner.read_raw(self.names[name])

    def delta(self, name: str, device: str = "cpu"):
        return self.inner.delta(self.names[name], device)


def _layers(entries: dict[str, Entry]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for n in entries:
        m = _LAYER.search(n)
        if m:
            out.setdefault(int(m.group(2)), []).append(n)
    return out


def output_layers(recipe) -> int:
    """Number of decoder layers of the output."""
    return sum(sl.n_layers for sl in recipe.slices)


def sliced_stream(recipe, spec, sources: dict[str, CheckpointSource], base: CheckpointSource, device: str,
                  out_dtype, progress=None, filter_names_of=None) -> tuple[list[ck.TensorInfo], Iterator]:
    """(plan of the output tensors, a generator of (name, merged tensor)) for a recipe with slices; `sources`
    maps every model reference of the slices to its opened source; `base` gives config and outside tensors'
    names; `filter_names_of` (forgetlab.merge.layers.filter_names) gives the names a filter is matched against."""
    base_entries = base.entries()
    tied = tied_head(base)
    if tied:
        base_entries.pop(tied, None)
    outside = [e for n, e in base_entries.items() if not _LAYER.search(n)]
    pre = [e for e in outside if layer_from_name(e.name) == FIRST]
    post = [e for e in outside if layer_from_name(e.name) != FIRST]
    segments: list[tuple[Any, list[Entry], dict, float]] = []   # (slice recipe, entries, out→in per source, t)

    def renamed(sub, names_of):
        srcs = [sources[sub.base]] + [sources[m.model] for m in sub.models]
        maps = [names_of(s) for s in srcs]
        return RenamedSource(srcs[0], maps[0]), [RenamedSource(s, m) for s, m in zip(srcs[1:], maps[1:])]

    first, last = recipe.slice_recipe(0), recipe.slice_recipe(len(recipe.slices) - 1)
    for sub, ents in ((first, pre), (last, post)):
        ident = {e.name: e.name for e in ents}
        segments.append((sub, ents, lambda s, ident=ident: ident, 0.0))
    layer_segments = []
    j = 0
    for k, sl in enumerate(recipe.slices):
        sub = recipe.slice_recipe(k)
        order = [sub.base] + [m.model for m in sub.models]
        start = {s.model: s.layer_range[0] for s in sl.sources}
        for i in range(sl.n_layers):
            t = i / (sl.n_layers - 1) if sl.n_layers > 1 else 1.0
            src0 = sources[order[0]]
            layer_names = _layers(src0.entries()).get(start[order[0]] + i)
            if not layer_names:
                raise IncompatibleModelsError(f"{order[0]} has no layer {start[order[0]] + i} (slice {k + 1} asks for "
                                              f"layers {sl.sources[0].layer_range}); check the layer_range.")
            ents, maps = [], {}
            for n in layer_names:
                out_name = with_layer(n, j)
                e = src0.entries()[n]
                ents.append(Entry(out_name, e.shape, e.dtype))
            for model in order:
                src, a = sources[model], start[model] + i
                have = src.entries()
                m = {}
                for e in ents:
                    src_name = with_layer(e.name, a)
                    if src_name not in have or tuple(have[src_name].shape) != tuple(e.shape):
                        raise IncompatibleModelsError(f"{model} has no tensor {src_name} of shape {tuple(e.shape)} "
                                                      f"(slice {k + 1}, layer {a}): slice models of one architecture.")
                    m[e.name] = src_name
                maps[model] = m
            layer_segments.append((sub, ents, lambda s, maps=maps, sub=sub: maps[_ref_of(s, sources)], t))
            j += 1
    segments = [segments[0], *layer_segments, segments[1]]
    plan = [ck.TensorInfo(e.name, e.shape, out_dtype if (out_dtype and e.dtype.is_floating_point) else e.dtype)
            for _, ents, _, _ in segments for e in ents]

    def stream():
        cache: dict = {}
        total = max(1, len(segments))
        for n, (sub, ents, names_of, t) in enumerate(segments):
            if not ents:
                continue
            b, ms = renamed(sub, names_of)
            params_for = (lambda name, layer, nl, sub=sub, t=t: sub.params_at(
                filter_names_of(name) if filter_names_of else name, t, cache=cache.setdefault(id(sub), {})))
            yield from merge_tensors(spec, None, b, ms, ents, device=device, out_dtype=out_dtype,
                                     params_for=params_for)
            if progress is not None:
                progress((n + 1) / total, f"slice tensors {n + 1}/{total}")
    return plan, stream()


def _ref_of(src: CheckpointSource, sources: dict[str, CheckpointSource]) -> str:
    for ref, s in sources.items():
        if s is src:
            return ref
    raise KeyError(src.label)
