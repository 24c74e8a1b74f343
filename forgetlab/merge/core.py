"""The tensor-by-tensor driver shared by the in-memory API and the streaming engine.

A *source* gives tensor names, shapes and one tensor at a time: `DictSource` wraps a state dict,
`CheckpointSource` a lazily opened checkpoint (a LoRA adapter reads as base + ΔW, ΔW = (α/r)·B·A, without
reading the base twice). `check_compatible` compares every model with the base before anything is read;
`collect_stats` runs a method's global first pass; `merge_tensors` yields (name, merged tensor) one at a
time, so peak memory is a few tensors times the number of models.
"""
from __future__ import annotations

import os
from typing import Any, Iterator, Mapping, Sequence

import torch

from forgetlab.checkpoints import TensorInfo
from forgetlab.errors import CheckpointError, IncompatibleModelsError, ParameterError
from forgetlab.merge.interpolation import layer_locator, num_layers_of
from forgetlab.merge.registry import MethodSpec, TensorJob
from forgetlab.progress import Progress, report


# Name, shape and dtype of one tensor of the base: the checkpoints module's header record.
Entry = TensorInfo


class DictSource:
    """A state dict seen as a source (tensors are read as float32 copies on `device`)."""

    def __init__(self, state: Mapping[str, torch.Tensor], label: str = "model"):
        if not isinstance(state, Mapping):
            raise ParameterError(f"{label} must be a state dict (name → tensor); got {type(state).__name__}.")
        self.state = state
        self.label = label

    def entries(self) -> dict[str, Entry]:
        return {n: Entry(n, tuple(t.shape), t.dtype) for n, t in self.state.items()}

    def read(self, name: str, device: str = "cpu") -> torch.Tensor:
        t = self.state[name]  # always a copy: the job may work in place on what it reads
        return t.detach().to(device=device, dtype=torch.float32, copy=True) if t.is_floating_point() else t.detach().clone()

    def read_raw(self, name: str) -> torch.Tensor:
        return self.state[name]

    def delta(self, name: str, device: str = "cpu"):
        return None


_ST = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
       "BOOL": torch.bool}


class _PreadReader:
    """Reads tensors of safetensors files with os.pread into fresh buffers instead of a memory map.

    A memory map keeps every page it touched resident in the process (peak RSS ≈ the size of all inputs);
    plain reads go through the page cache and hold only the tensors in use. The tensor owns its buffer, so
    the merge can work on it in place. Headers are parsed once (8-byte little-endian length + JSON).
    """

    def __init__(self, files):
        import json
        import struct
        self.index: dict[str, tuple[str, torch.dtype, tuple[int, ...], int, int]] = {}
        for f in files:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            base = 8 + n
            for name, meta in header.items():
                if name == "__metadata__" or meta.get("dtype") not in _ST:
                    continue
                a, b = meta["data_offsets"]
                self.index[name] = (str(f), _ST[meta["dtype"]], tuple(meta["shape"]), base + a, b - a)

    def read(self, name: str) -> torch.Tensor | None:
        entry = self.index.get(name)
        if entry is None:
            return None
        file, dtype, shape, offset, nbytes = entry
        buf = bytearray(nbytes)
        view = memoryview(buf)
        fd = os.open(file, os.O_RDONLY)
        try:
            got = 0
            while got < nbytes:
                n = os.preadv(fd, [view[got:]], offset + got)
                if n <= 0:
                    from forgetlab.errors import CheckpointError
                    raise CheckpointError(f"{file} ended inside tensor {name}: the file is truncated; re-save it.")
                got += n
        finally:
            os.close(fd)
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(buf, dtype=dtype).reshape(shape)


class CheckpointSource:
    """A forgetlab Checkpoint seen as a source; LoRA checkpoints give their ΔW through `delta`."""

    def __init__(self, ckpt, label: str | None = None):
        self.ckpt = ckpt
        self.label = label or str(ckpt.ref)
        self.is_lora = getattr(ckpt, "kind", "hf") == "lora"
        self._delta_names = set(ckpt.delta_names()) if self.is_lora else set()
        files = getattr(ckpt, "files", None)
        self._pread = None
        if not self.is_lora and files and all(str(f).endswith(".safetensors") for f in files):
            try:
                self._pread = _PreadReader(files)
            except (OSError, ValueError, KeyError):
                self._pread = None  # let forgetlab.checkpoints report what is wrong with the file

    def entries(self) -> dict[str, Entry]:
        return {n: Entry(n, tuple(i.shape), i.dtype) for n, i in self.ckpt.infos().items()}

    def read(self, name: str, device: str = "cpu") -> torch.Tensor:
        t = self._pread.read(name) if self._pread is not None else None
        if t is not None:  # a fresh buffer that the job owns
            return t.to(device=device, dtype=torch.float32) if t.is_floating_point() else t
        t = self.ckpt.read(name, dtype=None)
        # copy=True: safetensors may hand out a view of its (copy-on-write) memory map; the job works in
        # place on what it reads, which must never alter what a later pass reads from the same file.
        return t.to(device=device, dtype=torch.float32, copy=True) if t.is_floating_point() else t

    def read_raw(self, name: str) -> torch.Tensor:
        t = self._pread.read(name) if self._pread is not None else None
        return t if t is not None else self.ckpt.read(name, dtype=None)

    def delta(self, name: str, device: str = "cpu"):
        """ΔW of a LoRA adapter for `name` (None for full checkpoints; zeros for untouched LoRA targets)."""
        if not self.is_lora:
            return None
        if name not in self._delta_names:
            return 0
        return self.ckpt.delta(name, torch.float32).to(device)


def check_compatible(base, models: Sequence[Any]) -> list[Entry]:
    """The base's tensors in storage order, after checking that every model has the same names and shapes.

    Raises IncompatibleModelsError naming the tensor and both shapes, or the first missing/extra tensor.
    """
    base_entries = base.entries()
    if not base_entries:
        raise CheckpointError(
            f"The base {base.label} holds no tensors: a merge of it would be an empty, model-looking folder. "
            "Point the base at the folder (or file) that holds the model's weights.")
    for m in models:
        ent = m.entries()
        if not ent:
            raise CheckpointError(f"{m.label} holds no tensors; point it at the folder that holds its weights.")
        missing = [n for n in base_entries if n not in ent]
        if missing:
            raise IncompatibleModelsError(
                f"{m.label} has no tensor {missing[0]!r} (and {len(missing) - 1} more) that the base {base.label} "
                "has: the models do not share an architecture. Merge models fine-tuned from the same base.")
        extra = [n for n in ent if n not in base_entries]
        if extra:
            raise IncompatibleModelsError(
                f"{m.label} has a tensor {extra[0]!r} that the base {base.label} lacks; merge models with the "
                "same architecture as the base.")
        for n, e in base_entries.items():
            if ent[n].shape != e.shape:
                raise IncompatibleModelsError(
                    f"Tensor {n} has shape {e.shape} in the base {base.label} but {ent[n].shape} in {m.label}: "
                    "merge models fine-tuned from the same base.")
    return list(base_entries.values())


def check_finite(name: str, base_label: str, base_t: torch.Tensor, models, fts: Sequence[torch.Tensor]) -> None:
    """Refuse NaN/Inf in the base or a fine-tuned tensor: every merge of them would write non-finite weights
    (or, for the trimming methods, silently drop them). Raises CheckpointError naming the model and tensor."""
    for label, t in [(base_label, base_t)] + [(m.label, ft) for m, ft in zip(models, fts)]:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise CheckpointError(
                f"{label} holds NaN/Inf in tensor {name} ({bad} of {t.numel()} entries): merging it would write "
                "non-finite weights, so nothing was written. Leave that model out of the merge, or repair it "
                "(`forgetlab inspect` lists its non-finite tensors).")


def _finetuned(models, name: str, base_t: torch.Tensor, device: str) -> list[torch.Tensor]:
    out = []
    for m in models:
        d = m.delta(name, device)
        if d is None:
            out.append(m.read(name, device))
        elif isinstance(d, int):
            out.append(base_t.clone())
        else:
            out.append(base_t + d)
    return out


def _float_entries(entries: Sequence[Entry]) -> list[Entry]:
    return [e for e in entries if e.dtype.is_floating_point]


def collect_stats(spec: MethodSpec, params: dict, base, models, entries: Sequence[Entry], device: str = "cpu",
                  progress: Progress = None) -> Any:
    """Run the method's global first pass over every floating-point tensor (None if it needs none)."""
    if not spec.needs_global_pass(params):
        return None
    floats = _float_entries(entries)
    total = sum(e.numel for e in floats)
    collector = spec.collector(len(models), total, params)
    steps = collector.passes * max(1, len(floats))
    done = 0
    for p in range(collector.passes):
        for e in floats:
            base_t = base.read(e.name, device)
            fts = _finetuned(models, e.name, base_t, device)
            check_finite(e.name, base.label, base_t, models, fts)
            collector.add(p, e.name, base_t, [ft.sub_(base_t) for ft in fts])  # owned copies: in place
            done += 1
            report(progress, done / steps, f"statistics pass {p + 1}/{collector.passes}: {e.name}")
        collector.end_pass(p)
    return collector.result()


def merge_tensors(spec: MethodSpec, params: dict, base, models, entries: Sequence[Entry], *, stats: Any = None,
                  prepared: Mapping[str, Any] | None = None, config=None, device: str = "cpu",
                  out_dtype: torch.dtype | None = None, progress: Progress = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, merged tensor) for every base tensor in order, cast to `out_dtype` (default: the base's
    dtype) on the CPU. Non-floating tensors (e.g. integer buffers) are copied from the base."""
    names = [e.name for e in entries]
    n_layers = num_layers_of(config, names)
    locate = layer_locator(config)
    for i, e in enumerate(entries):
        if not e.dtype.is_floating_point:
            yield e.name, base.read_raw(e.name)
            continue
        base_t = base.read(e.name, device)
        fts = _finetuned(models, e.name, base_t, device)
        check_finite(e.name, base.label, base_t, models, fts)
        job = TensorJob(name=e.name, base=base_t, finetuned=fts,
                        params=params, stats=stats, prepared=None if prepared is None else prepared.get(e.name),
                        layer=locate(e.name), num_layers=n_layers, device=device,
                        adapters=tuple(bool(getattr(m, "is_lora", False)) for m in models))
        merged = spec.merge(job)
        if tuple(merged.shape) != e.shape:
            raise IncompatibleModelsError(f"internal: {spec.name} returned shape {tuple(merged.shape)} for {e.name} "
                                          f"of shape {e.shape}.")
        merged = merged.to(device="cpu", dtype=out_dtype or e.dtype)
        if not bool(torch.isfinite(merged).all()):
            raise CheckpointError(
                f"{spec.name} produced NaN/Inf in {e.name} from finite inputs (values beyond the range of "
                f"{merged.dtype}?); nothing was written. "
                "Use smaller coefficients (λ, weights) or a wider output dtype (float32).")
        yield e.name, merged
        report(progress, (i + 1) / max(1, len(entries)), f"merged {e.name}")
