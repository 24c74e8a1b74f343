"""Mixture-of-experts checkpoints merged as the fused tensors transformers loads (docs/methods.md#architectures).

A checkpoint on disk stores one tensor per expert and projection (Mixtral's `block_sparse_moe.experts.{e}.w1/w2/w3`,
Qwen2-MoE/Qwen3-MoE/OLMoE's `mlp.experts.{e}.gate_proj/up_proj/down_proj`); transformers ≥ 5 loads each layer's
experts as ONE tensor: `mlp.experts.gate_up_proj` [E, 2I, H] (per expert the gate rows then the up rows, stacked
over the experts) and `mlp.experts.down_proj` [E, H, I]. Its checkpoint conversion mapping
(`transformers.conversion_mapping.get_checkpoint_conversion_mapping`) says so with WeightConverters made of
MergeModulelist(dim=0) (stack over experts) and Concatenate(dim=1) (the parts' rows). mergekit 0.1.5 and
forgetlab's in-memory analyses (working copies of the loaded model) merge that fused tensor, so the streaming merge
does too: `expert_groups` reads the groups from the conversion mapping (refusing a converter made of other
operations rather than guessing), `FusedSource` shows a merge source's expert tensors as the fused ones, and
`ExpertGroup.split` writes a merged fused tensor back as the checkpoint's per-expert tensors (same names, shapes
and dtypes). A fused tensor holds E experts' worth of memory while it is merged.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import torch
from transformers.conversion_mapping import get_checkpoint_conversion_mapping
from transformers.core_model_loading import Concatenate, MergeModulelist, WeightConverter

from forgetlab.core.checkpoints import TensorInfo
from forgetlab.core.errors import CheckpointError


@dataclass(frozen=True)
class ExpertGroup:
    """One fused tensor of a loaded model and the checkpoint tensors it is made of.

    `members[e][p]` is expert e's tensor for part p (gate then up for gate_up_proj; one part for down_proj);
    `rows[p]` is part p's first dimension. The fused tensor is [E, Σ rows, *rest]: expert e's block is its parts
    concatenated along their first dimension, the experts stacked along dim 0."""

    name: str
    members: tuple[tuple[str, ...], ...]
    rows: tuple[int, ...]
    rest: tuple[int, ...]
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.members), sum(self.rows), *self.rest)

    def member_names(self) -> list[str]:
        """The checkpoint's names, in the order `split` yields them (expert by expert, parts in order)."""
        return [n for parts in self.members for n in parts]

    def member_shape(self, part: int) -> tuple[int, ...]:
        """The checkpoint shape of part `part` of one expert."""
        return (self.rows[part], *self.rest)

    def assemble(self, read, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
        """The fused tensor from `read(member_name)` (each member read once, copied into place)."""
        out = torch.empty(self.shape, dtype=dtype, device=device)
        for e, parts in enumerate(self.members):
            off = 0
            for p, name in enumerate(parts):
                out[e, off:off + self.rows[p]] = read(name)
                off += self.rows[p]
        return out

    def split(self, fused: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """(checkpoint name, tensor) for every member of a fused tensor of this group's shape (views of it)."""
        for e, parts in enumerate(self.members):
            off = 0
            for p, name in enumerate(parts):
                yield name, fused[e, off:off + self.rows[p]]
                off += self.rows[p]


def _clean(tr) -> bool:
    """Whether a WeightConverter only stacks experts (MergeModulelist(dim=0)) and then concatenates the parts'
    rows (Concatenate(dim=1) of the stacked tensors), the layouts `ExpertGroup` rebuilds and splits."""
    ops = list(tr.operations)
    if not ops or type(ops[0]) is not MergeModulelist or ops[0].dim != 0:
        return False
    if len(ops) == 1:
        return len(tr.source_patterns) == 1
    return len(ops) == 2 and type(ops[1]) is Concatenate and ops[1].dim == 1


def _pattern_regex(pattern: str) -> re.Pattern:
    return re.compile(re.escape(pattern).replace(r"\*", r"(\d+)"))


def expert_groups(model_type: str | None, entries: Iterable[TensorInfo]) -> dict[str, ExpertGroup]:
    """{fused name: ExpertGroup} for the checkpoint tensors `entries` of a model of `model_type`, read from
    transformers' checkpoint conversion mapping ({} when it fuses nothing: dense models). Raises
    CheckpointError for a converter forgetlab cannot rebuild exactly, or experts missing or of unequal shapes."""
    transforms = list(get_checkpoint_conversion_mapping(model_type) or []) if model_type else []
    if not any(isinstance(tr, WeightConverter) for tr in transforms):
        return {}
    infos = {e.name: e for e in entries}
    found: dict[str, dict[tuple[int, int], str]] = {}
    for name in infos:
        loaded, hit = name, None
        for tr in transforms:
            renamed, pattern = tr.rename_source_key(loaded)
            if pattern is None:
                continue
            if isinstance(tr, WeightConverter):
                if not _clean(tr):
                    raise CheckpointError(
                        f"transformers loads {name} of this model_type={model_type} checkpoint through a conversion "
                        f"({', '.join(type(o).__name__ for o in tr.operations)}) that forgetlab's merge cannot "
                        "rebuild and split back exactly, so it does not merge it (it would not be the tensor "
                        "transformers loads). Convert the checkpoint to the loaded layout first (load it with "
                        "transformers and save_pretrained), or merge in memory (forgetlab.merge.merge_models).")
                m = _pattern_regex(pattern).search(loaded)
                if m is None:
                    raise CheckpointError(f"internal: no expert index in {name} for the pattern {pattern!r}.")
                hit = (int(m.group(1)), list(tr.source_patterns).index(pattern))
            loaded = renamed
        if hit is not None:
            found.setdefault(loaded, {})[hit] = name
    return {fused: _group(fused, members, infos) for fused, members in found.items()}


def _group(fused: str, members: dict[tuple[int, int], str], infos) -> ExpertGroup:
    n_exp = 1 + max(e for e, _ in members)
    n_parts = 1 + max(p for _, p in members)
    missing = [(e, p) for e in range(n_exp) for p in range(n_parts) if (e, p) not in members]
    if missing:
        raise CheckpointError(f"{fused}: the checkpoint holds {len(members)} of its {n_exp * n_parts} expert tensors "
                              f"(expert {missing[0][0]}'s part {missing[0][1]} is missing), so it cannot be loaded or "
                              "merged; re-save the checkpoint whole.")
    names = tuple(tuple(members[e, p] for p in range(n_parts)) for e in range(n_exp))
    rows, rest, dtypes = [], None, set()
    for p in range(n_parts):
        shapes = {tuple(infos[names[e][p]].shape) for e in range(n_exp)}
        if len(shapes) != 1 or len(next(iter(shapes))) < 1:
            raise CheckpointError(f"{fused}: the experts' tensors for part {p} have shapes {sorted(shapes)}; "
                                  "transformers stacks equal shapes only. Re-save the checkpoint with transformers.")
        shape = next(iter(shapes))
        rows.append(shape[0])
        if rest is not None and shape[1:] != rest:
            raise CheckpointError(f"{fused}: its parts differ beyond the first dimension ({rest} vs {shape[1:]}).")
        rest = shape[1:]
        dtypes |= {infos[names[e][p]].dtype for e in range(n_exp)}
    if len(dtypes) != 1:
        raise CheckpointError(f"{fused}: the experts' tensors are stored in several dtypes ({sorted(map(str, dtypes))}); "
                              "re-save the checkpoint in one dtype.")
    return ExpertGroup(fused, names, tuple(rows), tuple(rest), dtypes.pop())


def fused_entries(entries: Sequence[TensorInfo], groups: dict[str, ExpertGroup]) -> list[TensorInfo]:
    """`entries` with each group's members replaced by the fused tensor, at the place of its first member."""
    owner = {n: g for g in groups.values() for n in g.member_names()}
    out, seen = [], set()
    for e in entries:
        g = owner.get(e.name)
        if g is None:
            out.append(e)
        elif g.name not in seen:
            seen.add(g.name)
            out.append(TensorInfo(g.name, g.shape, g.dtype))
    return out


def output_plan(entries: Sequence[TensorInfo], groups: dict[str, ExpertGroup], dtype_of) -> list[TensorInfo]:
    """The output's tensors for merged `entries` (fused ones listed as their members, in `split`'s order), each
    with the dtype `dtype_of(checkpoint dtype)`."""
    plan = []
    for e in entries:
        g = groups.get(e.name)
        if g is None:
            plan.append(TensorInfo(e.name, e.shape, dtype_of(e.dtype)))
        else:
            plan += [TensorInfo(n, g.member_shape(p), dtype_of(g.dtype))
                     for parts in g.members for p, n in enumerate(parts)]
    return plan


def split_stream(stream: Iterable[tuple[str, torch.Tensor]],
                 groups: dict[str, ExpertGroup]) -> Iterator[tuple[str, torch.Tensor]]:
    """A merge's (name, tensor) stream with each merged fused tensor written back as its checkpoint tensors."""
    for name, t in stream:
        g = groups.get(name)
        if g is None:
            yield name, t
        else:
            yield from g.split(t)


class FusedSource:
    """A merge source (forgetlab.merge.core) whose expert tensors read as the fused tensors of `groups`; every
    other tensor, and every other attribute (label, ckpt, is_lora…), is the wrapped source's."""

    def __init__(self, source, groups: dict[str, ExpertGroup]):
        self.source = source
        self.groups = groups

    def __getattr__(self, attr):
        return getattr(self.source, attr)

    def entries(self):
        ent = self.source.entries()
        return {e.name: e for e in fused_entries(list(ent.values()), self.groups)}

    def nbytes(self, name: str) -> int:
        """0 for a fused tensor (assembled into fresh memory), else the wrapped source's."""
        return 0 if name in self.groups else self.source.nbytes(name)

    def read(self, name: str, device: str = "cpu", buffer: torch.Tensor | None = None) -> torch.Tensor:
        """Tensor `name` as the wrapped source reads it (float32); a fused one assembled from its members."""
        g = self.groups.get(name)
        if g is None:
            return self.source.read(name, device) if buffer is None else self.source.read(name, device, buffer)
        return g.assemble(lambda n: self.source.read(n, device), torch.float32, device)

    def read_raw(self, name: str) -> torch.Tensor:
        g = self.groups.get(name)
        if g is None:
            return self.source.read_raw(name)
        return g.assemble(self.source.read_raw, g.dtype)

    def delta(self, name: str, device: str = "cpu"):
        """ΔW of a LoRA source (forgetlab.merge.core.CheckpointSource.delta); a fused one assembled from its
        members' (an untouched member's ΔW is zero)."""
        g = self.groups.get(name)
        if g is None:
            return self.source.delta(name, device)
        deltas = {n: self.source.delta(n, device) for n in g.member_names()}
        if all(d is None for d in deltas.values()):
            return None
        if all(isinstance(d, int) for d in deltas.values()):
            return 0

        def one(n):
            d = deltas[n]
            return d if torch.is_tensor(d) else 0.0
        return g.assemble(one, torch.float32, device)
