"""Writing HF model folders atomically (forgetlab.core.outputs): config, tokenizer files, sharded
safetensors streamed one tensor at a time, and saved transformers models."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Iterable, Sequence

import torch
from transformers.utils import logging as hf_logging

from forgetlab.core.checkpoints.loading import load_tokenizer
from forgetlab.core.checkpoints.opening import open_checkpoint
from forgetlab.core.checkpoints.readers import (GGUFCheckpoint, SAFETENSORS_NAMES, DEFAULT_SHARD_BYTES, SAFETENSORS_INDEX,
                                                TOKENIZER_FILES, Checkpoint, TensorInfo)
from forgetlab.core.errors import CheckpointError, IncompatibleModelsError
from forgetlab.core.filerecords import HashingWriter, note_digest
from forgetlab.core.outputs import absolute, atomic_output_dir
from forgetlab.core.progress import Progress, report


def _plan_shards(plan: Sequence[TensorInfo], max_shard_bytes: int) -> list[list[TensorInfo]]:
    shards: list[list[TensorInfo]] = [[]]
    size = 0
    for info in plan:
        if shards[-1] and size + info.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(info)
        size += info.nbytes
    return shards


class _ShardStream:
    """Writes one safetensors file tensor by tensor: the header comes from the plan, then the bytes.

    safetensors' own writer needs every tensor of a shard in memory at once; this one holds one tensor.
    The result is an ordinary safetensors file (checked by reading it back with safetensors in the tests). The
    bytes are hashed while they are written (filerecords.HashingWriter), so that recording the output does not
    read the shard again.
    """

    def __init__(self, file: Path, infos: Sequence[TensorInfo], metadata: dict[str, str] | None = None):
        header: dict[str, object] = {}
        if metadata:
            header["__metadata__"] = metadata
        offset = 0
        for info in infos:
            header[info.name] = {"dtype": SAFETENSORS_NAMES[info.dtype], "shape": list(info.shape),
                                 "data_offsets": [offset, offset + info.nbytes]}
            offset += info.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)
        self.expected = [i.name for i in infos]
        self.infos = {i.name: i for i in infos}
        self.file = file
        self.fh = HashingWriter(open(file, "wb"))
        self.fh.write(struct.pack("<Q", len(raw)))
        self.fh.write(raw)
        self.done = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        want = self.infos[name]
        if name != self.expected[self.done]:
            raise CheckpointError(f"internal: tensor {name} arrived out of order (expected {self.expected[self.done]}).")
        if tuple(tensor.shape) != want.shape or tensor.dtype != want.dtype:
            raise IncompatibleModelsError(
                f"Tensor {name} has shape {tuple(tensor.shape)} and dtype {tensor.dtype}, but the output plan "
                f"says {want.shape} and {want.dtype}."
            )
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        self.fh.write(memoryview(data.numpy()))  # no bytes copy of the tensor
        self.done += 1

    def close(self) -> None:
        self.fh.close()
        if self.done != len(self.expected):
            raise CheckpointError(f"internal: shard closed with {self.done} of {len(self.expected)} tensors.")
        note_digest(self.file, self.fh.hexdigest())


def _write_tokenizer(source: Checkpoint, folder: Path) -> None:
    """The tokenizer files of `source` copied into `folder`; a GGUF file (or an adapter on one) has none beside it,
    so the tokenizer transformers builds from the GGUF is saved instead (then the output serves as a pool base
    and loads with AutoTokenizer)."""
    src = source.tokenizer_dir
    if src is not None:
        for f in TOKENIZER_FILES:
            if (src / f).exists():
                shutil.copy(src / f, folder / f)
        return
    root = getattr(source, "base", source)
    if isinstance(source, GGUFCheckpoint) or isinstance(root, GGUFCheckpoint):
        load_tokenizer(source).save_pretrained(str(folder))


def write_hf_folder(out_dir: str | Path, tensors: Iterable[tuple[str, torch.Tensor]] | dict[str, torch.Tensor],
                    config=None, *, plan: Sequence[TensorInfo] | None = None,
                    tokenizer_from: str | Path | Checkpoint | None = None, overwrite: bool = False,
                    extra_files: dict[str, str | bytes] | None = None,
                    max_shard_bytes: int = DEFAULT_SHARD_BYTES, progress: Progress = None,
                    inputs: Iterable[str | Path] = (), kind: str = "model") -> Path:
    """Write an HF model folder atomically: config.json, tokenizer files, sharded safetensors + index.

    `tensors` streams (name, tensor) pairs in the order of `plan` (the output's names, shapes and dtypes,
    known up front from the base); with a dict, the plan is taken from it. Peak memory is one tensor.
    `overwrite` replaces only a folder forgetlab wrote that holds none of `inputs` (forgetlab.core.outputs).
    """
    if isinstance(tensors, dict):
        plan = [TensorInfo(n, tuple(t.shape), t.dtype) for n, t in tensors.items()]
        tensors = tensors.items()
    if plan is None:
        raise CheckpointError("internal: write_hf_folder needs a plan when tensors are streamed.")
    shards = _plan_shards(plan, max_shard_bytes)
    n = len(shards)
    files = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    total = sum(i.nbytes for i in plan)
    with atomic_output_dir(out_dir, overwrite, inputs=inputs, kind=kind) as tmp:
        if config is not None:
            if isinstance(config, (str, Path)):
                shutil.copy(Path(config), tmp / "config.json")
            else:
                config.save_pretrained(str(tmp))
        if tokenizer_from is not None:
            _write_tokenizer(open_checkpoint(tokenizer_from), tmp)
        it = iter(tensors)
        written = 0
        for shard, file in zip(shards, files):
            stream = _ShardStream(tmp / file, shard, {"format": "pt"})
            try:
                for info in shard:
                    try:
                        name, tensor = next(it)
                    except StopIteration:
                        raise CheckpointError(f"internal: tensor stream ended before {info.name}.") from None
                    stream.write(name, tensor.to(info.dtype))
                    written += info.nbytes
                    report(progress, written / max(1, total), f"wrote {name}")
            finally:
                stream.fh.close()
            stream.close()
        if n > 1:
            index = {"metadata": {"total_size": total},
                     "weight_map": {i.name: f for s, f in zip(shards, files) for i in s}}
            (tmp / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2))
        for fname, content in (extra_files or {}).items():
            mode = "wb" if isinstance(content, bytes) else "w"
            with open(tmp / fname, mode) as fh:
                fh.write(content)
    return absolute(out_dir)


def save_model(model, tokenizer, out_dir: str | Path, overwrite: bool = False,
               extra_files: dict[str, str | bytes] | None = None, inputs: Iterable[str | Path] = (),
               kind: str = "model", then=None) -> Path:
    """Save a transformers model (+ tokenizer) as an HF safetensors folder, atomically (forgetlab.core.outputs:
    `overwrite` replaces only a folder forgetlab wrote that holds none of `inputs`; `then(folder)` runs as the
    folder lands, and its failure takes the folder back: `atomic_output_dir`)."""
    hf_logging.disable_progress_bar()
    with atomic_output_dir(out_dir, overwrite, inputs=inputs, kind=kind, then=then) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        for fname, content in (extra_files or {}).items():
            mode = "wb" if isinstance(content, bytes) else "w"
            with open(tmp / fname, mode) as fh:
                fh.write(content)
    return absolute(out_dir)
