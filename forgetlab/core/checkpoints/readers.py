"""Reading stored checkpoints lazily: HF folders of safetensors (sharded or not) or `.bin` files, and GGUF
files. Listing tensor names, shapes and dtypes reads no tensor data; `Checkpoint.read(name)` reads one tensor
(memory-mapped for safetensors). A `.bin` is read only through `torch.load(weights_only=True)`."""
from __future__ import annotations

import functools
import json
import math
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator, Sequence

import torch
from safetensors import safe_open
import transformers

from forgetlab.core.errors import CheckpointError
from forgetlab.core.memory import is_out_of_memory, out_of_memory_text
from forgetlab.core.progress import Progress, report

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "generation_config.json",
)
DEFAULT_SHARD_BYTES = 2 * 1024**3

_ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
SAFETENSORS_NAMES = {v: k for k, v in _ST_DTYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    """Name, shape and dtype of one stored tensor (read from headers only)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


class Checkpoint:
    """An opened model reference. Subclasses say where tensors come from; all read lazily."""

    kind: str = "hf"

    def __init__(self, ref: str | Path, path: Path):
        self.ref = str(ref)
        self.path = path

    # -- listing
    def infos(self) -> dict[str, TensorInfo]:
        """Every tensor's name, shape and dtype, in storage order (no tensor data is read)."""
        raise NotImplementedError

    def names(self) -> list[str]:
        """Tensor names in storage order."""
        return list(self.infos())

    def info(self, name: str) -> TensorInfo:
        """Shape and dtype of one tensor."""
        try:
            return self.infos()[name]
        except KeyError:
            raise CheckpointError(f"{self.ref} has no tensor named {name!r}.") from None

    def __contains__(self, name: str) -> bool:
        return name in self.infos()

    # -- reading
    def read(self, name: str, dtype: torch.dtype | None = torch.float32) -> torch.Tensor:
        """One tensor, converted to `dtype` (None keeps the stored dtype)."""
        raise NotImplementedError

    def state_dict(self, dtype: torch.dtype | None = torch.float32) -> dict[str, torch.Tensor]:
        """All tensors at once (small models only; large ones should stream with `read`)."""
        return {n: self.read(n, dtype) for n in self.names()}

    def iter_tensors(self, dtype: torch.dtype | None = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) pairs, one tensor in memory at a time."""
        for n in self.names():
            yield n, self.read(n, dtype)

    # -- metadata
    @cached_property
    def config(self):
        """The transformers config of the model (never with trust_remote_code)."""
        try:
            return transformers.AutoConfig.from_pretrained(str(self.config_dir), trust_remote_code=False)
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(
                f"Cannot read the model config of {self.ref}: {exc}. "
                "An HF model folder needs a config.json from transformers."
            ) from None

    @property
    def config_dir(self) -> Path:
        return self.path

    @property
    def tokenizer_dir(self) -> Path | None:
        """The folder holding tokenizer files, if any."""
        if any((self.path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            return self.path
        return None

    @property
    def num_parameters(self) -> int:
        """Parameters of the model; a head tied to the embedding counts once even when a file stores a copy."""
        infos = self.infos()
        total = sum(i.numel for i in infos.values())
        head = infos.get("lm_head.weight")
        if head is not None and self._is_tied():
            total -= head.numel
        return total

    def _is_tied(self) -> bool:
        try:
            return bool(getattr(self.config, "tie_word_embeddings", False))
        except CheckpointError:
            return False

    @property
    def stored_bytes(self) -> int:
        """Bytes the weights take on disk (the weight files' sizes; the tensors' sizes when there are none)."""
        files = getattr(self, "files", None)
        if files:
            return sum(Path(f).stat().st_size for f in files)
        return sum(i.nbytes for i in self.infos().values())

    def nonfinite_tensors(self, progress: Progress = None) -> list[str]:
        """Names of tensors holding NaN or Inf (reads every tensor once, streaming)."""
        bad = []
        names = self.names()
        for i, n in enumerate(names):
            t = self.read(n, dtype=None)
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                bad.append(n)
            report(progress, (i + 1) / max(1, len(names)), f"scanning {n}")
        return bad

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.ref!r})"


def _safe_open(file: Path):
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except Exception as exc:  # safetensors raises its own SafetensorError and OSError; torch a RuntimeError
        _raise_if_out_of_memory(exc, f"Opening {file} (safetensors maps the whole file)", file)
        raise CheckpointError(
            f"{file} is not a readable safetensors file ({exc}). The file is corrupt or truncated: "
            "re-save or re-download it."
        ) from None


def _raise_if_out_of_memory(exc: BaseException, what: str, file: Path) -> None:
    """Raise CheckpointError with `forgetlab.core.memory.out_of_memory_text` when `exc` is a refused allocation or
    memory map (a process limit such as `prlimit --data`, or a full machine), not a damaged file."""
    if is_out_of_memory(exc):
        try:
            size = Path(file).stat().st_size
        except OSError:
            size = None
        raise CheckpointError(f"{out_of_memory_text(what, size)} ({type(exc).__name__}: {exc})") from None


class SafetensorsCheckpoint(Checkpoint):
    """An HF folder with `model.safetensors` or sharded `model-*.safetensors` + index."""

    kind = "hf"

    def __init__(self, ref, path: Path, files: Sequence[Path]):
        super().__init__(ref, path)
        self.files = list(files)
        self._handles: dict[Path, object] = {}

    def _handle(self, file: Path):
        if file not in self._handles:
            self._handles[file] = _safe_open(file)
        return self._handles[file]

    @cached_property
    def _where(self) -> dict[str, Path]:
        where: dict[str, Path] = {}
        for f in self.files:
            for k in self._handle(f).keys():
                where[k] = f
        return where

    def infos(self) -> dict[str, TensorInfo]:
        return self._infos

    @cached_property
    def _infos(self) -> dict[str, TensorInfo]:
        out = {}
        for name, f in self._where.items():
            sl = self._handle(f).get_slice(name)
            dt = _ST_DTYPES.get(sl.get_dtype())
            if dt is None:
                raise CheckpointError(f"{f}: tensor {name} has unsupported dtype {sl.get_dtype()}.")
            out[name] = TensorInfo(name, tuple(sl.get_shape()), dt)
        return out

    def nonfinite_tensors(self, progress: Progress = None) -> list[str]:
        """Names of tensors holding NaN or Inf, read with plain reads into one reused buffer: a memory map
        would keep every page it touched resident (the whole model), this holds one tensor at a time."""
        bad: list[str] = []
        buf = torch.empty(0, dtype=torch.uint8)
        entries = []
        for f in self.files:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            for name, meta in header.items():
                dt = _ST_DTYPES.get(meta.get("dtype")) if isinstance(meta, dict) else None
                if name != "__metadata__" and dt is not None and dt.is_floating_point:
                    a, b = meta["data_offsets"]
                    entries.append((name, f, dt, 8 + n + a, b - a))
        for i, (name, f, dt, offset, nbytes) in enumerate(entries):
            if buf.numel() < nbytes:
                buf = torch.empty(nbytes, dtype=torch.uint8)
            view = buf[:nbytes]
            with open(f, "rb") as fh:
                fh.seek(offset)
                if fh.readinto(memoryview(view.numpy())) != nbytes:
                    raise CheckpointError(f"{f} ended inside tensor {name}: the file is truncated; re-save it.")
            t = view.view(dt)
            if not bool(torch.isfinite(t.sum(dtype=torch.float32))) and not bool(torch.isfinite(t).all()):
                bad.append(name)
            report(progress, (i + 1) / max(1, len(entries)), f"checked {name}")
        return bad

    def read(self, name, dtype=torch.float32):
        f = self._where.get(name)
        if f is None:
            raise CheckpointError(f"{self.ref} has no tensor named {name!r}.")
        try:
            t = self._handle(f).get_tensor(name)
        except Exception as exc:
            _raise_if_out_of_memory(exc, f"Reading tensor {name} from {f}", f)
            raise CheckpointError(f"Cannot read tensor {name} from {f} ({exc}); the file may be truncated.") from None
        return t if dtype is None else t.to(dtype)


class BinCheckpoint(Checkpoint):
    """An HF folder with PyTorch `.bin` weights, read only through `torch.load(weights_only=True)`."""

    kind = "hf"

    def __init__(self, ref, path: Path, files: Sequence[Path]):
        super().__init__(ref, path)
        self.files = list(files)

    @cached_property
    def _tensors(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for f in self.files:
            try:
                sd = torch.load(str(f), map_location="cpu", weights_only=True, mmap=True)
            except Exception as exc:
                raise CheckpointError(
                    f"{f} was refused: it is not a plain tensor file ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0][:200]}). forgetlab never runs code from a pickle; "
                    "convert the model to safetensors with a tool you trust."
                ) from None
            if not isinstance(sd, dict):
                raise CheckpointError(f"{f} does not hold a state dict.")
            out.update({k: v for k, v in sd.items() if isinstance(v, torch.Tensor)})
        return out

    def infos(self):
        return {k: TensorInfo(k, tuple(v.shape), v.dtype) for k, v in self._tensors.items()}

    def read(self, name, dtype=torch.float32):
        try:
            t = self._tensors[name]
        except KeyError:
            raise CheckpointError(f"{self.ref} has no tensor named {name!r}.") from None
        return t.clone() if dtype is None else t.to(dtype).clone()


@functools.lru_cache(maxsize=1)
def _dequantised(file: str, mtime_ns: int, size: int) -> dict[str, torch.Tensor]:
    """A GGUF file's tensors dequantised to float32 by transformers, once per process for the last file opened
    (dequantising SmolLM2-135M takes ~20 s): every checkpoint, pool, merge and model load of it shares them.
    A tied head is left out (it is the embedding matrix), as an HF folder of the same model stores it."""
    path = Path(file)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                     trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"Cannot read the GGUF file {path}: {exc}") from None
    tied = getattr(model.config, "tie_word_embeddings", False)
    return {k: v.detach() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}


class GGUFCheckpoint(Checkpoint):
    """A GGUF file, dequantised by transformers (`gguf_file=`) into a plain state dict on first read."""

    kind = "gguf"

    def __init__(self, ref, path: Path, gguf_file: Path):
        super().__init__(ref, path)
        self.gguf_file = gguf_file

    @cached_property
    def config(self):
        try:
            return transformers.AutoConfig.from_pretrained(str(self.gguf_file.parent), gguf_file=self.gguf_file.name)
        except Exception as exc:
            raise CheckpointError(f"Cannot read the GGUF file {self.gguf_file}: {exc}") from None

    @cached_property
    def _tensors(self) -> dict[str, torch.Tensor]:
        st = self.gguf_file.stat()
        return _dequantised(str(self.gguf_file.resolve()), st.st_mtime_ns, st.st_size)

    @cached_property
    def _skeleton_infos(self) -> dict[str, TensorInfo]:
        """Names and shapes from the config alone (a model built on the meta device): listing a GGUF's tensors
        needs no dequantisation (reading one does, once, for all)."""
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(self.config, trust_remote_code=False)
        tied = getattr(self.config, "tie_word_embeddings", False)
        return {k: TensorInfo(k, tuple(v.shape), torch.float32) for k, v in model.state_dict().items()
                if not (tied and k == "lm_head.weight")}

    def infos(self):
        if "_tensors" in self.__dict__:
            return {k: TensorInfo(k, tuple(v.shape), v.dtype) for k, v in self._tensors.items()}
        return self._skeleton_infos

    @property
    def stored_bytes(self) -> int:
        """Size of the GGUF file (its quantised tensors), not of the dequantised float32 weights."""
        return self.gguf_file.stat().st_size

    def read(self, name, dtype=torch.float32):
        t = self._tensors[name]   # shared by every user of this file (_dequantised): hand out a copy
        return t.clone() if dtype is None or dtype == t.dtype else t.to(dtype)

    @property
    def tokenizer_dir(self):
        return None


def index_files(path: Path, index_name: str) -> list[Path]:
    """The shard files listed in a sharded checkpoint's index (weight_map values), checked to exist."""
    file = path / index_name
    try:
        index = json.loads(file.read_text())
        shards = index["weight_map"].values()
        if not all(isinstance(f, str) for f in shards):
            raise TypeError("weight_map values must be file names")
        files = sorted({path / f for f in shards})
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"{file} is malformed ({type(exc).__name__}: {exc}); it must be a JSON object whose weight_map maps "
            "tensor names to shard files. Restore it from the model's source, or delete it if the folder holds "
            "a single weights file.") from None
    if any(Path(f).is_absolute() or ".." in Path(f).parts for f in shards):
        raise CheckpointError(f"{file} lists shard files outside {path}; refusing to read them.")
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise CheckpointError(f"{path} is missing shards listed in its index: {', '.join(missing)}.")
    return files
