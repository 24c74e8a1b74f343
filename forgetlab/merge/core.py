"""The tensor-by-tensor driver shared by the in-memory API and the streaming engine.

A *source* gives tensor names, shapes and one tensor at a time: `DictSource` wraps a state dict,
`CheckpointSource` a lazily opened checkpoint (a LoRA adapter reads as base + ΔW, ΔW = (α/r)·B·A, without
reading the base twice). `check_compatible` compares every model with the base before anything is read;
`collect_stats` runs a method's global first pass; `merge_tensors` yields (name, merged tensor) one at a
time, so peak memory is a few tensors times the number of models.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Mapping, Sequence

import torch

from forgetlab.core.checkpoints import TensorInfo
from forgetlab.core.errors import CheckpointError, IncompatibleModelsError, ParameterError
from forgetlab.core.pool import check_same_architecture, config_value
from forgetlab.core.progress import Progress, report
from forgetlab.merge.layers import layer_locator, num_layers_of
from forgetlab.merge.registry import MethodSpec, TensorJob


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

    def nbytes(self, name: str) -> int:
        return 0  # reads are copies of the state dict's tensors; no buffer to reuse

    def read(self, name: str, device: str = "cpu", buffer: torch.Tensor | None = None) -> torch.Tensor:
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

    def nbytes(self, name: str) -> int:
        """Stored size of tensor `name` in bytes (0 if the reader does not hold it)."""
        entry = self.index.get(name)
        return 0 if entry is None else entry[4]

    def read(self, name: str, buffer: torch.Tensor | None = None) -> torch.Tensor | None:
        """Tensor `name` read into a fresh buffer, or into `buffer` (uint8, at least its size) when given: the
        result is then a view of `buffer`, and reusing a buffer that is already mapped saves a page fault per
        4 KiB (the engine's read slots, see `TensorReader`)."""
        entry = self.index.get(name)
        if entry is None:
            return None
        file, dtype, shape, offset, nbytes = entry
        if buffer is not None and buffer.numel() >= nbytes:
            buf = buffer[:nbytes]
        else:  # torch.empty, not bytearray(nbytes): a bytearray is zero-filled first, one more pass over the bytes
            buf = torch.empty(nbytes, dtype=torch.uint8)
        view = memoryview(buf.numpy())
        fd = os.open(file, os.O_RDONLY)
        try:
            got = 0
            while got < nbytes:
                n = os.preadv(fd, [view[got:]], offset + got)
                if n <= 0:
                    raise CheckpointError(f"{file} ended inside tensor {name}: the file is truncated; re-save it.")
                got += n
        finally:
            os.close(fd)
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        return buf.view(dtype).reshape(shape)


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
                self._pread = None  # let forgetlab.core.checkpoints report what is wrong with the file

    def entries(self) -> dict[str, Entry]:
        return {n: Entry(n, tuple(i.shape), i.dtype) for n, i in self.ckpt.infos().items()}

    def nbytes(self, name: str) -> int:
        """Bytes that `read(name, buffer=…)` needs in its buffer (0: this source reads without one)."""
        return self._pread.nbytes(name) if self._pread is not None else 0

    def read(self, name: str, device: str = "cpu", buffer: torch.Tensor | None = None) -> torch.Tensor:
        """Tensor `name` as float32 on `device` (other dtypes as stored), owned by the caller. With `buffer`
        (uint8, see `nbytes`) a float32 tensor on the CPU is read into it and is a view of it."""
        t = self._pread.read(name, buffer) if self._pread is not None else None
        if t is not None:  # a fresh buffer (or the caller's) that the job owns
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


TIED_HEAD = "lm_head.weight"


def tied_head(source) -> str | None:
    """The name of the output head when the base ties it to the input embedding (config
    `tie_word_embeddings`), else None: such a head is the embedding matrix, whether or not a file stores a
    copy of it (`save_torch_state_dict` and GGUF dequantisation do), so it is neither compared nor merged."""
    ckpt = getattr(source, "ckpt", None)
    if ckpt is None:
        return None
    try:
        config = ckpt.config
    except Exception:  # no readable config: nothing is known to be tied
        return None
    return TIED_HEAD if getattr(config, "tie_word_embeddings", False) else None


def _unties_head(ckpt, head: str) -> bool:
    """Whether a checkpoint's config unties its output head and its file stores one."""
    return config_value(ckpt, "tie_word_embeddings") is False and head in ckpt.names()


def _base_name(base) -> str:
    """How messages name the base: "the base <its path>" (a state dict's source is labelled "the base" already)."""
    return base.label if str(base.label).startswith("the base") else f"the base {base.label}"


def check_compatible(base, models: Sequence[Any]) -> list[Entry]:
    """The base's tensors in storage order, after checking that every model has the same names and shapes.

    Raises IncompatibleModelsError naming the tensor and both shapes, or the first missing/extra tensor. A head
    tied to the embedding (`tied_head`) is left out on every side, so the output is tied like the base.
    """
    base_entries = base.entries()
    tied = tied_head(base)
    if tied is not None:  # the head is the embedding: never merged on its own, never written (config ties it)
        base_entries.pop(tied, None)
    if not base_entries:
        raise CheckpointError(
            f"The base {base.label} holds no tensors: a merge of it would be an empty, model-looking folder. "
            "Point the base at the folder (or file) that holds the model's weights.")
    base_ck = getattr(base, "ckpt", None)
    for m in models:
        if base_ck is not None and getattr(m, "ckpt", None) is not None and not m.is_lora:
            # the pool's check too; a vocabulary rebuilt by the recipe's tokenizer (merge/vocab.py) may differ
            check_same_architecture(base_ck, m.ckpt, m.label, vocab=not getattr(m, "vocab_aligned", False))
            if tied is not None and _unties_head(m.ckpt, tied):
                raise IncompatibleModelsError(
                    f"The base {base.label} ties {tied} to the input embedding (tie_word_embeddings: true), but "
                    f"{m.label} unties it (tie_word_embeddings: false) and stores a head of its own: the merge "
                    "would keep the base's tied head and drop the fine-tuned one. Merge fine-tunes that kept the "
                    "head tied, or untie the base first (save it with tie_word_embeddings=False).")
        ent = m.entries()
        if tied is not None:
            ent.pop(tied, None)
        if not ent:
            raise CheckpointError(f"{m.label} holds no tensors; point it at the folder that holds its weights.")
        missing = [n for n in base_entries if n not in ent]
        if missing:
            raise IncompatibleModelsError(
                f"{m.label} has no tensor {missing[0]!r} (and {len(missing) - 1} more) that {_base_name(base)} "
                "has: the models do not share an architecture. Merge models fine-tuned from the same base.")
        extra = [n for n in ent if n not in base_entries]
        if extra:
            raise IncompatibleModelsError(
                f"{m.label} has a tensor {extra[0]!r} that {_base_name(base)} lacks; merge models with the "
                "same architecture as the base.")
        for n, e in base_entries.items():
            if ent[n].shape != e.shape:
                raise IncompatibleModelsError(
                    f"Tensor {n} has shape {e.shape} in {_base_name(base)} but {ent[n].shape} in {m.label}: "
                    "merge models fine-tuned from the same base.")
    return list(base_entries.values())


def all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of a float tensor is finite, in one reduction: a sum is finite only if every entry
    is (a NaN or ±Inf makes it NaN or ±Inf), so a finite sum settles it; only a non-finite sum (a bad entry,
    or finite values overflowing) pays for the exact element-wise check. torch.isfinite(t).all() costs ~3 ns
    per entry on one thread (a bool tensor), the sum ~0.1 ns: the merge checks every tensor it reads."""
    if not t.is_floating_point() or t.numel() == 0:
        return True
    acc = t.sum(dtype=torch.float64) if t.dtype == torch.float64 else t.sum(dtype=torch.float32)
    if bool(torch.isfinite(acc)):
        return True
    return bool(torch.isfinite(t).all())


def check_finite(name: str, base_label: str, base_t: torch.Tensor, models, fts: Sequence[torch.Tensor]) -> None:
    """Refuse NaN/Inf in the base or a fine-tuned tensor: every merge of them would write non-finite weights
    (or, for the trimming methods, silently drop them). Raises CheckpointError naming the model and tensor."""
    for label, t in [(base_label, base_t)] + [(m.label, ft) for m, ft in zip(models, fts)]:
        if t.is_floating_point() and not all_finite(t):
            bad = int((~torch.isfinite(t)).sum())
            raise CheckpointError(
                f"{label} holds NaN/Inf in tensor {name} ({bad} of {t.numel()} entries): merging it would write "
                "non-finite weights, so nothing was written. Leave that model out of the merge, or replace it "
                "with a checkpoint saved before training diverged (forgetlab.core.checkpoints.open_checkpoint(path)"
                ".nonfinite_tensors() lists every affected tensor).")


def _finetuned(models, name: str, base_t: torch.Tensor, device: str, buffers=None) -> list[torch.Tensor]:
    out = []
    for i, m in enumerate(models):
        d = m.delta(name, device)
        if d is None:
            out.append(m.read(name, device) if buffers is None else m.read(name, device, buffers[i + 1]))
        elif isinstance(d, int):
            out.append(base_t.clone())
        else:
            out.append(base_t + d)
    return out


def float_entries(entries: Sequence[Entry]) -> list[Entry]:
    """The entries whose tensors hold floating-point numbers (the ones a merge computes)."""
    return [e for e in entries if e.dtype.is_floating_point]


def _new_buffer(nbytes: int) -> torch.Tensor:
    """A uint8 buffer of `nbytes` whose pages are mapped up front (one mmap with MAP_POPULATE where the OS
    has it): a read into fresh memory otherwise takes a page fault per 4 KiB, which costs more than the
    copy from the page cache itself (measured: 108 MB read into fresh torch.empty 0.09 s, into populated
    pages 0.065 s, into pages used before 0.015 s)."""
    flags = getattr(mmap, "MAP_POPULATE", 0)
    if flags and nbytes >= (1 << 20):
        try:
            mem = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flags)
            return torch.frombuffer(mem, dtype=torch.uint8)
        except (OSError, ValueError):
            pass
    return torch.empty(nbytes, dtype=torch.uint8)


class TensorReader:
    """Reads (base, fine-tuned tensors) of each floating-point entry in order, checked finite, for a pass.

    `reuse=True` reads into reused slots (a slot holds one uint8 buffer per source) instead of a fresh
    allocation per tensor: fresh memory costs a page fault per 4 KiB, which on a 27M-parameter merge took
    as long as the reads themselves. Entry i + 1 goes to a slot other than entry i's — the smallest that
    fits, or a small one grown, so that a large slot stays free for the next large tensor (embeddings,
    lm_head) — so a tensor read into a slot is valid until the caller asks for the entry after the next:
    only a caller that is done with entry i (its merged tensor written) when it asks for entry i + 1 may
    reuse (the engine; not `merge_state_dicts`, which keeps every output). The slots survive between the
    passes of one reader. `prefetch=True` reads entry i + 1 in a thread while the caller works on entry i
    (file reads and torch's kernels release the GIL), so reading overlaps the arithmetic.
    """

    SLOTS = 3

    def __init__(self, base, models, device: str = "cpu", reuse: bool = False, prefetch: bool = False):
        self.base, self.models, self.device = base, list(models), device
        self.reuse, self.prefetch = reuse, prefetch
        self._slots: list[list[torch.Tensor | None]] = [[None] * (1 + len(self.models)) for _ in range(self.SLOTS)]

    def _pick(self, needs: list[int], busy: int | None) -> int:
        free = [j for j in range(self.SLOTS) if j != busy]
        cap = [min((b.numel() if b is not None else 0) - n for b, n in zip(self._slots[j], needs)) for j in free]
        fits = [j for j, c in zip(free, cap) if c >= 0]
        total = max(1, sum(needs))
        if fits:
            best = min(fits, key=lambda j: sum(b.numel() for b in self._slots[j] if b is not None))
            slack = sum(b.numel() for b in self._slots[best] if b is not None) - total
            small = [j for j in free if j not in fits]
            if slack <= 3 * total or not small:
                return best
            return max(small, key=lambda j: sum(b.numel() for b in self._slots[j] if b is not None))
        return max(free, key=lambda j: sum(b.numel() for b in self._slots[j] if b is not None))

    def _needs(self, name: str) -> list[int]:
        return [getattr(src, "nbytes", lambda n: 0)(name) for src in [self.base] + self.models]

    def _worth_waiting(self, name: str, busy: int | None) -> bool:
        """Whether entry `name` should wait for the busy slot rather than be read ahead into a slot grown by
        more than 8 MiB (two large tensors in a row, e.g. lm_head and the embeddings, would otherwise need
        two large slots: page faults and peak memory)."""
        if not self.reuse or busy is None:
            return False
        needs = self._needs(name)
        fits_busy = all(n == 0 or (b is not None and b.numel() >= n) for b, n in zip(self._slots[busy], needs))
        if not fits_busy:
            return False
        slot = self._pick(needs, busy)
        grow = sum(max(0, n - (b.numel() if b is not None else 0)) for b, n in zip(self._slots[slot], needs))
        return grow > (8 << 20)

    def _buffers(self, name: str, busy: int | None):
        needs = self._needs(name)
        slot = self._pick(needs, busy)
        bufs = self._slots[slot]
        for j, need in enumerate(needs):  # a slot grows to the largest tensor read into it
            if need and (bufs[j] is None or bufs[j].numel() < need):
                bufs[j] = None
                bufs[j] = _new_buffer(need)
        return slot, bufs

    def _load(self, entries: Sequence[Entry], i: int, busy: int | None):
        e = entries[i]
        slot, bufs = self._buffers(e.name, busy) if self.reuse else (None, None)
        base_t = self.base.read(e.name, self.device) if bufs is None else self.base.read(e.name, self.device, bufs[0])
        fts = _finetuned(self.models, e.name, base_t, self.device, bufs)
        check_finite(e.name, self.base.label, base_t, self.models, fts)
        return slot, base_t, fts

    def __call__(self, entries: Sequence[Entry]) -> Iterator[tuple[Entry, torch.Tensor, list[torch.Tensor]]]:
        """Yield (entry, base tensor, fine-tuned tensors) for every entry (all floating-point) in order."""
        entries = list(entries)
        if not self.prefetch or len(entries) < 2:
            busy = None
            for i, e in enumerate(entries):
                busy, base_t, fts = self._load(entries, i, busy)
                yield e, base_t, fts
            return
        threads = torch.get_num_threads()
        with ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(threads,)) as pool:
            nxt = pool.submit(self._load, entries, 0, None)
            try:
                for i, e in enumerate(entries):
                    busy, base_t, fts = nxt.result() if nxt is not None else self._load(entries, i, None)
                    later = i + 1 < len(entries) and self._worth_waiting(entries[i + 1].name, busy)
                    nxt = pool.submit(self._load, entries, i + 1, busy) if i + 1 < len(entries) and not later else None
                    yield e, base_t, fts
                    del base_t, fts
            finally:
                if nxt is not None:
                    nxt.cancel()
                    try:
                        nxt.result()
                    except Exception:
                        pass


def resident_budget(device: str) -> int:
    """Bytes a merge may keep on `device` so as to read its inputs once for all its passes (`collect_stats`'
    `inputs`): half the free memory of a CUDA device; 0 elsewhere — on the CPU the system's page cache already
    holds the files between passes, and a second copy would raise the merge's peak memory."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return 0
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return int(free) // 2


def resident_bytes(models, entries: Sequence[Entry]) -> int:
    """Bytes of the float32 base and fine-tuned tensors of every floating-point entry (what `inputs` holds)."""
    return (1 + len(models)) * 4 * sum(e.numel for e in float_entries(entries))


def collect_stats(spec: MethodSpec, params: dict, base, models, entries: Sequence[Entry], device: str = "cpu",
                  progress: Progress = None, fast_io: bool = False, reader: TensorReader | None = None,
                  inputs: dict | None = None) -> Any:
    """Run the method's global first pass over every floating-point tensor (None if it needs none).
    `fast_io`: read through reused slots with a prefetching thread (`TensorReader`; the collectors keep no
    tensor they are given). `reader`: a TensorReader to read with (the engine shares one, and its slots, with
    `merge_tensors`). `inputs`: an empty dict to read the checkpoints once — the first pass keeps a copy of
    every (base, fine-tuned tensors) in it, the later passes and `merge_tensors(inputs=…)` use those instead of
    reading the files again (the same numbers; for a device with room for them, `resident_budget`)."""
    if not spec.needs_global_pass(params):
        return None
    floats = float_entries(entries)
    total = sum(e.numel for e in floats)
    collector = spec.collector(len(models), total, params)
    steps = collector.passes * max(1, len(floats))
    done = 0
    reader = reader or TensorReader(base, models, device, reuse=fast_io, prefetch=fast_io)
    for p in range(collector.passes):
        replay = inputs is not None and p > 0
        for e, base_t, fts in (((e, *inputs[e.name]) for e in floats) if replay else reader(floats)):
            if inputs is not None and p == 0:
                inputs[e.name] = (base_t.clone(), [ft.clone() for ft in fts])
            # owned copies are made task vectors in place; kept inputs stay θ
            taus = [torch.sub(ft, base_t) for ft in fts] if replay else [ft.sub_(base_t) for ft in fts]
            collector.add(p, e.name, base_t, taus)
            done += 1
            report(progress, done / steps, f"statistics pass {p + 1}/{collector.passes}: {e.name}")
        collector.end_pass(p)
    return collector.result()


def merge_tensors(spec: MethodSpec, params: dict, base, models, entries: Sequence[Entry], *, stats: Any = None,
                  prepared: Mapping[str, Any] | None = None, config=None, device: str = "cpu",
                  out_dtype: torch.dtype | None = None, progress: Progress = None,
                  fast_io: bool = False, reader: TensorReader | None = None,
                  params_for=None, n_layers: int | None = None,
                  inputs: dict | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, merged tensor) for every base tensor in order, cast to `out_dtype` (default: the base's
    dtype) on the CPU. Non-floating tensors (e.g. integer buffers) are copied from the base.

    `fast_io=True` (the engine) reads through reused slots with a prefetching thread (`TensorReader`): a
    yielded tensor may then be a view of a read slot, valid until the consumer asks for the next one —
    the engine writes each tensor before asking for the next; a caller that keeps them must leave it off.
    `params_for(name, layer, n_layers)`: the parameters of one tensor, where they vary by tensor (gradients,
    filters: forgetlab.merge.settings); `n_layers` overrides the layer count (a slice's). `inputs`: the tensors
    `collect_stats` kept (each handed to the method, then dropped) instead of reading the files."""
    names = [e.name for e in entries]
    n_layers = n_layers or num_layers_of(config, names)
    locate = layer_locator(config)
    reader = reader or TensorReader(base, models, device, reuse=fast_io, prefetch=fast_io)
    floats = (iter(reader(float_entries(entries))) if inputs is None
              else ((e, *inputs.pop(e.name)) for e in float_entries(entries)))
    for i, e in enumerate(entries):
        if not e.dtype.is_floating_point:
            yield e.name, base.read_raw(e.name)
            continue
        _, base_t, fts = next(floats)
        layer = locate(e.name)
        job = TensorJob(name=e.name, base=base_t, finetuned=fts,
                        params=params if params_for is None else params_for(e.name, layer, n_layers), stats=stats, prepared=None if prepared is None else prepared.get(e.name),
                        layer=layer, num_layers=n_layers, device=device,
                        adapters=tuple(bool(getattr(m, "is_lora", False)) for m in models))
        merged = spec.apply(job)
        if tuple(merged.shape) != e.shape:
            raise IncompatibleModelsError(f"internal: {spec.name} returned shape {tuple(merged.shape)} for {e.name} "
                                          f"of shape {e.shape}.")
        merged = merged.to(device="cpu", dtype=out_dtype or e.dtype)
        if not all_finite(merged):
            raise CheckpointError(
                f"{spec.name} produced NaN/Inf in {e.name} from finite inputs (values beyond the range of "
                f"{merged.dtype}?); nothing was written. "
                "Use smaller coefficients (λ, weights) or a wider output dtype (float32).")
        yield e.name, merged
        report(progress, (i + 1) / max(1, len(entries)), f"merged {e.name}")
