"""Open and write model checkpoints: HF folders, GGUF files, hub ids and PEFT LoRA adapters.

Listing tensor names, shapes and dtypes reads no tensor data; `Checkpoint.read(name)` reads one tensor
(memory-mapped for safetensors). Writing is atomic: a temporary folder beside the output, renamed into place
only when complete; an existing output is refused unless `overwrite=True`.

Safe loading: safetensors first; a `.bin` only through `torch.load(weights_only=True)`; `trust_remote_code`
is never switched on.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from forgetlab.errors import (
    CheckpointError,
    IncompatibleModelsError,
    OfflineError,
    OutputExistsError,
    WorkspaceError,
)
from forgetlab.progress import Progress, report

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
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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


def default_device() -> str:
    """"cuda" when a GPU is available, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------------------------- opening


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
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(str(self.config_dir), trust_remote_code=False)
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
        return sum(i.numel for i in self.infos().values())

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
    from safetensors import safe_open

    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except Exception as exc:  # safetensors raises its own SafetensorError and OSError
        raise CheckpointError(
            f"{file} is not a readable safetensors file ({exc}). The file is corrupt or truncated: "
            "re-save or re-download it."
        ) from None


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

    def read(self, name, dtype=torch.float32):
        f = self._where.get(name)
        if f is None:
            raise CheckpointError(f"{self.ref} has no tensor named {name!r}.")
        try:
            t = self._handle(f).get_tensor(name)
        except Exception as exc:
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


class GGUFCheckpoint(Checkpoint):
    """A GGUF file, dequantised by transformers (`gguf_file=`) into a plain state dict on first read."""

    kind = "gguf"

    def __init__(self, ref, path: Path, gguf_file: Path):
        super().__init__(ref, path)
        self.gguf_file = gguf_file

    @cached_property
    def config(self):
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(str(self.gguf_file.parent), gguf_file=self.gguf_file.name)
        except Exception as exc:
            raise CheckpointError(f"Cannot read the GGUF file {self.gguf_file}: {exc}") from None

    @cached_property
    def _tensors(self) -> dict[str, torch.Tensor]:
        model = load_model(self, dtype=torch.float32)
        return {k: v.detach() for k, v in model.state_dict().items()}

    def infos(self):
        return {k: TensorInfo(k, tuple(v.shape), v.dtype) for k, v in self._tensors.items()}

    def read(self, name, dtype=torch.float32):
        t = self._tensors[name]
        return t if dtype is None else t.to(dtype)

    @property
    def tokenizer_dir(self):
        return None


@dataclass(frozen=True)
class LoraPair:
    """The LoRA factors of one base weight: ΔW = scale · B · A (transposed when fan_in_fan_out)."""

    target: str
    a_name: str
    b_name: str
    scale: float
    fan_in_fan_out: bool


class LoraCheckpoint(Checkpoint):
    """A PEFT LoRA adapter applied to a base checkpoint: read(name) = base(name) + ΔW(name).

    ΔW = (lora_alpha / r) · B · A (`lora_alpha / sqrt(r)` with rsLoRA), mapped onto the base tensor names.
    """

    kind = "lora"

    def __init__(self, ref, path: Path, base: Checkpoint):
        super().__init__(ref, path)
        self.base = base
        try:
            self.adapter_config = json.loads((path / "adapter_config.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}/adapter_config.json is unreadable ({exc}).") from None
        files = sorted(path.glob("adapter_model*.safetensors"))
        if files:
            self._factors = SafetensorsCheckpoint(ref, path, files)
        elif (path / "adapter_model.bin").exists():
            self._factors = BinCheckpoint(ref, path, [path / "adapter_model.bin"])
        else:
            raise CheckpointError(
                f"{path} has adapter_config.json but no adapter_model.safetensors: the adapter is incomplete."
            )
        self.pairs = self._pair_factors()
        self._check_against_base()

    def _scale_for(self, target_module: str) -> float:
        cfg = self.adapter_config
        r = cfg.get("r", 8)
        alpha = cfg.get("lora_alpha", r)
        for pat, val in (cfg.get("rank_pattern") or {}).items():
            if re.search(pat, target_module):
                r = val
        for pat, val in (cfg.get("alpha_pattern") or {}).items():
            if re.search(pat, target_module):
                alpha = val
        return alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r

    def _pair_factors(self) -> dict[str, LoraPair]:
        base_names = set(self.base.names())
        pairs: dict[str, LoraPair] = {}
        fan = bool(self.adapter_config.get("fan_in_fan_out", False))
        for name in self._factors.names():
            m = re.match(r"^(?:base_model\.model\.)?(.*)\.lora_A(?:\.[^.]+)?\.weight$", name)
            if not m:
                continue
            module = m.group(1)
            b_name = name.replace(".lora_A", ".lora_B")
            target = self._match_base_name(module + ".weight", base_names)
            pairs[target] = LoraPair(target, name, b_name, self._scale_for(module), fan)
        if not pairs:
            raise CheckpointError(f"{self.path} holds no LoRA A/B factors (expected *.lora_A.weight tensors).")
        return pairs

    def _match_base_name(self, name: str, base_names: set[str]) -> str:
        if name in base_names:
            return name
        # PEFT saves names relative to the wrapped model; allow a missing or extra leading "model."
        for cand in (f"model.{name}", name.removeprefix("model.")):
            if cand in base_names:
                return cand
        raise IncompatibleModelsError(
            f"The LoRA adapter {self.ref} targets {name}, which the base {self.base.ref} does not have: "
            "the adapter was trained on another base model. Pass the base it was trained on."
        )

    def _check_against_base(self) -> None:
        for target, pair in self.pairs.items():
            a = self._factors.info(pair.a_name).shape
            b = self._factors.info(pair.b_name).shape
            shape = (a[1], b[0]) if pair.fan_in_fan_out else (b[0], a[1])
            base_shape = self.base.info(target).shape
            if tuple(shape) != tuple(base_shape):
                raise IncompatibleModelsError(
                    f"The LoRA adapter {self.ref} gives {target} a delta of shape {tuple(shape)}, "
                    f"but the base {self.base.ref} has shape {tuple(base_shape)}: the adapter belongs to "
                    "another base model."
                )

    def infos(self):
        return self.base.infos()

    def delta_names(self) -> list[str]:
        """Base tensor names that the adapter changes."""
        return list(self.pairs)

    def delta(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """ΔW = scale · B · A for one base tensor (zeros if the adapter does not touch it)."""
        pair = self.pairs.get(name)
        if pair is None:
            return torch.zeros(self.base.info(name).shape, dtype=dtype)
        a = self._factors.read(pair.a_name, torch.float32)
        b = self._factors.read(pair.b_name, torch.float32)
        d = pair.scale * (b @ a)
        return (d.T if pair.fan_in_fan_out else d).to(dtype)

    def read(self, name, dtype=torch.float32):
        base = self.base.read(name, dtype=None)
        if name not in self.pairs:
            return base if dtype is None else base.to(dtype)
        out = base.to(torch.float32) + self.delta(name)
        return out.to(dtype or base.dtype)

    @property
    def config_dir(self):
        return self.base.config_dir

    @property
    def tokenizer_dir(self):
        return super().tokenizer_dir or self.base.tokenizer_dir


def _resolve_hub(ref: str) -> Path:
    """Download (or find in the local cache) a hub model's weights, config and tokenizer."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - transformers depends on it
        raise OfflineError("huggingface_hub is not installed: pass a local folder instead.") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    try:
        folder = snapshot_download(
            repo_id=ref,
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"],
            local_files_only=offline,
        )
    except Exception as exc:
        raise OfflineError(
            f"{ref!r} is not a local path, and fetching it from the model hub failed "
            f"({type(exc).__name__}). Without a network, pass a local HF folder (config.json + "
            "*.safetensors) instead of a hub id."
        ) from None
    return Path(folder)


def open_checkpoint(ref: str | Path | Checkpoint, base: str | Path | Checkpoint | None = None) -> Checkpoint:
    """Open a model reference: HF folder (safetensors, sharded or not; `.bin`), GGUF file, LoRA adapter
    folder (needs `base`, or finds it from adapter_config.json) or a hub id (needs a network)."""
    if isinstance(ref, Checkpoint):
        return ref
    path = Path(str(ref)).expanduser()
    if not path.exists():
        if _HUB_ID.match(str(ref)) and not str(ref).startswith((".", "/", "~")):
            path = _resolve_hub(str(ref))
        else:
            raise CheckpointError(
                f"{ref} does not exist. Pass an HF model folder (config.json + *.safetensors), a .gguf "
                "file, a PEFT adapter folder, or a hub id like 'HuggingFaceTB/SmolLM2-135M'."
            )
    if path.is_file():
        if path.suffix == ".gguf":
            return GGUFCheckpoint(ref, path.parent, path)
        if path.suffix == ".safetensors":
            return SafetensorsCheckpoint(ref, path.parent, [path])
        raise CheckpointError(f"{path} is a file forgetlab cannot open; pass its model folder instead.")
    if (path / "adapter_config.json").exists():
        if base is None:
            cfg = json.loads((path / "adapter_config.json").read_text())
            base = cfg.get("base_model_name_or_path")
            if not base:
                raise CheckpointError(f"{path} is a LoRA adapter: say which base model it applies to.")
        return LoraCheckpoint(ref, path, open_checkpoint(base))
    if (path / SAFETENSORS_INDEX).exists():
        try:
            index = json.loads((path / SAFETENSORS_INDEX).read_text())
            files = sorted({path / f for f in index["weight_map"].values()})
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"{path / SAFETENSORS_INDEX} is malformed ({exc}).") from None
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise CheckpointError(f"{path} is missing shards listed in its index: {', '.join(missing)}.")
        return SafetensorsCheckpoint(ref, path, files)
    st = sorted(path.glob("*.safetensors"))
    if st:
        return SafetensorsCheckpoint(ref, path, st)
    if (path / BIN_INDEX).exists():
        index = json.loads((path / BIN_INDEX).read_text())
        return BinCheckpoint(ref, path, sorted({path / f for f in index["weight_map"].values()}))
    bins = sorted(path.glob("pytorch_model*.bin"))
    if bins:
        return BinCheckpoint(ref, path, bins)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return GGUFCheckpoint(ref, path, ggufs[0])
    raise CheckpointError(
        f"{path} holds no model weights (no *.safetensors, pytorch_model*.bin or single .gguf). "
        "Point at the folder that holds the weights."
    )


# --------------------------------------------------------------------------------------------- loading


def _as_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if dtype in names:
        return names[dtype]
    raise CheckpointError(f"Unknown dtype {dtype!r}; use one of {', '.join(names)}.")


def load_model(ref: str | Path | Checkpoint, device: str | None = None, dtype=torch.float32):
    """A causal-LM model ready for forward passes (eval mode, no grad needed) on `device`.

    LoRA adapters are merged into the base weights (θ0 + ΔW) so every model is a plain transformers model.
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # forgetlab reports progress through its own callbacks
    ckpt = open_checkpoint(ref)
    dtype = _as_dtype(dtype)
    device = device or default_device()
    try:
        if isinstance(ckpt, GGUFCheckpoint) and "_tensors" in ckpt.__dict__:
            # already dequantised once: build from the config instead of decoding the file again
            model = AutoModelForCausalLM.from_config(ckpt.config, dtype=torch.float32, trust_remote_code=False)
            model.load_state_dict(ckpt._tensors, strict=False)
            model.tie_weights()
            model = model.to(dtype)
        elif isinstance(ckpt, GGUFCheckpoint):
            model = AutoModelForCausalLM.from_pretrained(
                str(ckpt.gguf_file.parent), gguf_file=ckpt.gguf_file.name, dtype=dtype, trust_remote_code=False
            )
        elif isinstance(ckpt, LoraCheckpoint):
            model = load_model(ckpt.base, device="cpu", dtype=torch.float32)
            params = dict(model.named_parameters())
            with torch.no_grad():
                for name in ckpt.delta_names():
                    if name in params:
                        params[name].add_(ckpt.delta(name))
            model = model.to(dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(ckpt.path), dtype=dtype, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"Cannot load {ckpt.ref} as a causal language model: {exc}") from None
    return model.to(device).eval()


def load_tokenizer(ref: str | Path | Checkpoint):
    """The tokenizer stored with a model (a LoRA adapter falls back to its base's)."""
    from transformers import AutoTokenizer

    ckpt = open_checkpoint(ref)
    if isinstance(ckpt, GGUFCheckpoint):
        return AutoTokenizer.from_pretrained(str(ckpt.gguf_file.parent), gguf_file=ckpt.gguf_file.name)
    folder = ckpt.tokenizer_dir
    if folder is None:
        raise CheckpointError(f"{ckpt.ref} has no tokenizer files (tokenizer.json/tokenizer_config.json).")
    tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


# --------------------------------------------------------------------------------------------- writing


@contextlib.contextmanager
def atomic_output_dir(out_dir: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside `out_dir`; rename it to `out_dir` on success, delete it on failure.

    An existing `out_dir` is refused unless `overwrite`; then it is replaced only once the new one is complete.
    """
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out} exists already. Choose another output folder or ask to overwrite it.")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        raise WorkspaceError(f"Cannot write into {out.parent} ({exc.strerror or exc}); choose a writable folder.") from None
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp makes it private; a saved model should be readable like any folder
        if out.exists():
            if not overwrite:
                raise OutputExistsError(f"{out} appeared while writing; nothing was overwritten.")
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                tmp.rename(out)
            except OSError:
                if out.exists():  # another writer finished first: theirs stays, ours is dropped
                    raise OutputExistsError(f"{out} was written by another job while this one ran; "
                                            "nothing was overwritten. Choose another output folder.") from None
                raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
    The result is an ordinary safetensors file (checked by reading it back with safetensors in the tests).
    """

    def __init__(self, file: Path, infos: Sequence[TensorInfo], metadata: dict[str, str] | None = None):
        header: dict[str, object] = {}
        if metadata:
            header["__metadata__"] = metadata
        offset = 0
        for info in infos:
            header[info.name] = {"dtype": _ST_NAMES[info.dtype], "shape": list(info.shape),
                                 "data_offsets": [offset, offset + info.nbytes]}
            offset += info.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)
        self.expected = [i.name for i in infos]
        self.infos = {i.name: i for i in infos}
        self.fh = open(file, "wb")
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
        self.fh.write(data.numpy().tobytes())
        self.done += 1

    def close(self) -> None:
        self.fh.close()
        if self.done != len(self.expected):
            raise CheckpointError(f"internal: shard closed with {self.done} of {len(self.expected)} tensors.")


def write_hf_folder(out_dir: str | Path, tensors: Iterable[tuple[str, torch.Tensor]] | dict[str, torch.Tensor],
                    config=None, *, plan: Sequence[TensorInfo] | None = None,
                    tokenizer_from: str | Path | Checkpoint | None = None, overwrite: bool = False,
                    extra_files: dict[str, str | bytes] | None = None,
                    max_shard_bytes: int = DEFAULT_SHARD_BYTES, progress: Progress = None) -> Path:
    """Write an HF model folder atomically: config.json, tokenizer files, sharded safetensors + index.

    `tensors` streams (name, tensor) pairs in the order of `plan` (the output's names, shapes and dtypes,
    known up front from the base); with a dict, the plan is taken from it. Peak memory is one tensor.
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
    with atomic_output_dir(out_dir, overwrite) as tmp:
        if config is not None:
            if isinstance(config, (str, Path)):
                shutil.copy(Path(config), tmp / "config.json")
            else:
                config.save_pretrained(str(tmp))
        if tokenizer_from is not None:
            src = open_checkpoint(tokenizer_from).tokenizer_dir
            for f in TOKENIZER_FILES:
                if src is not None and (src / f).exists():
                    shutil.copy(src / f, tmp / f)
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
    return Path(out_dir).expanduser().resolve()


def save_model(model, tokenizer, out_dir: str | Path, overwrite: bool = False,
               extra_files: dict[str, str | bytes] | None = None) -> Path:
    """Save a transformers model (+ tokenizer) as an HF safetensors folder, atomically."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with atomic_output_dir(out_dir, overwrite) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        for fname, content in (extra_files or {}).items():
            mode = "wb" if isinstance(content, bytes) else "w"
            with open(tmp / fname, mode) as fh:
                fh.write(content)
    return Path(out_dir).expanduser().resolve()
