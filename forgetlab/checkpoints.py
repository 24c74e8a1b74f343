"""Open and write model checkpoints: HF folders, GGUF files, hub ids and PEFT LoRA adapters.

Listing tensor names, shapes and dtypes reads no tensor data; `Checkpoint.read(name)` reads one tensor
(memory-mapped for safetensors). Writing is atomic: a temporary folder beside the output, renamed into place
only when complete; an existing output is refused unless `overwrite=True`.

Safe loading: safetensors first; a `.bin` only through `torch.load(weights_only=True)`; `trust_remote_code`
is never switched on.
"""
from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from forgetlab.errors import (
    CheckpointError,
    IncompatibleModelsError,
    OfflineError,
)
from forgetlab.outputs import absolute, atomic_output_dir  # noqa: F401  (atomic_output_dir: public here too)
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


def check_device(device: str | None) -> str:
    """`device` if torch can use it on this machine ("cpu", "cuda", "cuda:N", "mps"), the default device for
    None; a ParameterError naming the choices otherwise."""
    from forgetlab.errors import ParameterError

    if device is None or str(device).strip() == "":
        return default_device()
    name = str(device).strip()
    choices = "'cpu'" + (f", 'cuda' or 'cuda:0'…'cuda:{torch.cuda.device_count() - 1}'"
                         if torch.cuda.is_available() else " (no GPU is available here)")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ParameterError(f"Unknown device {name!r}; use {choices}.") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ParameterError(f"Device {name!r} was asked but no CUDA GPU is available; use 'cpu'.")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ParameterError(f"Device {name!r} does not exist; use {choices}.")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ParameterError(f"Device {name!r} is not available here; use {choices}.")
    elif dev.type != "cpu":
        raise ParameterError(f"forgetlab does not run on device {name!r}; use {choices}.")
    return name


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

    def nonfinite_tensors(self, progress: Progress = None) -> list[str]:
        """Names of tensors holding NaN or Inf, read with plain reads into one reused buffer: a memory map
        would keep every page it touched resident (the whole model), this holds one tensor at a time."""
        import struct

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
    from transformers import AutoModelForCausalLM

    path = Path(file)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
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
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(str(self.gguf_file.parent), gguf_file=self.gguf_file.name)
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
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.config, trust_remote_code=False)
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


@dataclass(frozen=True)
class LoraPair:
    """What a PEFT adapter does to one base tensor `target`.

    Plain LoRA: ΔW = scale · B · A (transposed when fan_in_fan_out); on an embedding (lora_embedding_A/B)
    ΔW = scale · (B · A)ᵀ. DoRA (`magnitude` set): W' = m ⊙ (W0 + ΔW) / ‖W0 + ΔW‖, the norm taken per output
    feature (over each row of an nn.Linear weight [out, in]; over each column of a fan_in_fan_out Conv1D weight
    or of an embedding [num_embeddings, dim]), exactly as PEFT's merge. `replacement` names a full tensor that
    the adapter stores for the target (modules_to_save, a saved embedding `base_layer`), which then stands in
    for W0. `bias_of` marks a lora_B bias: Δb = scale · b_B (PEFT's `lora_bias`).
    """

    target: str
    a_name: str | None = None
    b_name: str | None = None
    scale: float = 1.0
    fan_in_fan_out: bool = False
    embedding: bool = False
    magnitude: str | None = None
    replacement: str | None = None
    bias_of: str | None = None

    @property
    def exact_delta(self) -> bool:
        """True when ΔW does not depend on the base weights (plain LoRA, no replacement, no DoRA)."""
        return self.magnitude is None and self.replacement is None


# PEFT LoraConfig switches whose merged weights forgetlab does not reproduce (key → what to call it)
_LORA_UNSUPPORTED = {
    "use_qalora": "QA-LoRA (use_qalora)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens), which changes only tokens after an "
                               "invocation sequence and has no merged weights",
    "layer_replication": "layer replication (layer_replication), which changes the architecture",
    "target_parameters": "LoRA on nn.Parameter targets (target_parameters)",
    "trainable_token_indices": "trainable tokens (trainable_token_indices)",
    "velora_config": "VeLoRA (velora_config)",
    "monteclora_config": "MonteCLoRA (monteclora_config)",
    "use_bdlora": "block-diagonal LoRA (use_bdlora)",
    "arrow_config": "Arrow routing (arrow_config)",
    "kasa_config": "KaSA (kasa_config)",
    "megatron_config": "Megatron parallel layers (megatron_config)",
}
_LORA_TENSOR_KINDS = (
    ("A", re.compile(r"^(.*)\.lora_A(?:\.[^.]+)?\.weight$")),
    ("B", re.compile(r"^(.*)\.lora_B(?:\.[^.]+)?\.weight$")),
    ("B_bias", re.compile(r"^(.*)\.lora_B(?:\.[^.]+)?\.bias$")),
    ("embA", re.compile(r"^(.*)\.lora_embedding_A(?:\.[^.]+)?$")),
    ("embB", re.compile(r"^(.*)\.lora_embedding_B(?:\.[^.]+)?$")),
    ("mag", re.compile(r"^(.*)\.lora_magnitude_vector(?:\.[^.]+)?(?:\.weight)?$")),
    ("saved", re.compile(r"^(.*)\.modules_to_save(?:\.[^.]+)?\.(weight|bias)$")),
    ("saved", re.compile(r"^(.*)\.base_layer\.(weight|bias)$")),
    ("full", re.compile(r"^(.*)\.(weight|bias)$")),
)
_MERGE_IT_YOURSELF = ("Merge it with PEFT (PeftModel.from_pretrained(base, adapter).merge_and_unload()"
                      ".save_pretrained(folder)) and pass the merged folder instead.")


def _lora_number(cfg_file, key: str, value, *, integer: bool):
    """A rank (positive int) or alpha (finite number) from adapter_config.json, else a CheckpointError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if integer:
        ok = ok and float(value).is_integer() and value > 0
    if not ok:
        want = "a positive whole number" if integer else "a finite number"
        raise CheckpointError(
            f"{cfg_file}: {key} is {value!r}, but it must be {want} (the LoRA rank r and lora_alpha set the "
            f"scale lora_alpha / r). Fix {key} in the adapter's config to the value it was trained with.")
    return int(value) if integer else float(value)


class LoraCheckpoint(Checkpoint):
    """A PEFT LoRA adapter applied to a base checkpoint: read(name) = PEFT's merge_and_unload() weight.

    Plain LoRA: read = θ0 + ΔW with ΔW = (lora_alpha / r) · B · A (`lora_alpha / sqrt(r)` with rsLoRA;
    rank_pattern / alpha_pattern matched as PEFT does); LoRA on embeddings (lora_embedding_A/B), DoRA
    (W' = m ⊙ (W0 + ΔW) / ‖W0 + ΔW‖ per output feature), lora_bias and full tensors stored by the adapter
    (modules_to_save such as a trained lm_head, a saved embedding base layer) are applied as PEFT applies
    them. `delta(name)` = read(name) − θ0(name): exactly ΔW for plain LoRA, computed from the base weights
    for DoRA and replaced tensors. Anything else the adapter holds or asks for is refused with a message.
    """

    kind = "lora"

    def __init__(self, ref, path: Path, base: Checkpoint):
        super().__init__(ref, path)
        self.base = base
        self.adapter_config = _read_adapter_config(path)
        files = sorted(path.glob("adapter_model*.safetensors"))
        if files:
            self._factors = SafetensorsCheckpoint(ref, path, files)
        elif (path / "adapter_model.bin").exists():
            self._factors = BinCheckpoint(ref, path, [path / "adapter_model.bin"])
        else:
            raise CheckpointError(
                f"{path} has adapter_config.json but no adapter_model.safetensors: the adapter is incomplete."
            )
        self._check_config()
        self.pairs = self._pair_factors()
        self._check_against_base()

    # -- adapter config
    def _check_config(self) -> None:
        cfg, where = self.adapter_config, self.path / "adapter_config.json"
        peft_type = cfg.get("peft_type")
        if peft_type is not None and str(peft_type).upper() != "LORA":
            raise CheckpointError(
                f"{self.path} is a PEFT {peft_type} adapter; forgetlab reads LoRA and DoRA adapters only. "
                + _MERGE_IT_YOURSELF)
        for key, what in _LORA_UNSUPPORTED.items():
            if cfg.get(key):
                raise CheckpointError(f"{self.path} uses {what}, which forgetlab does not support. "
                                      + _MERGE_IT_YOURSELF)
        init = cfg.get("init_lora_weights")
        if isinstance(init, str) and init.lower().startswith(("pissa", "corda", "olora", "loftq", "lora_ga")):
            raise CheckpointError(
                f"{self.path} was trained with init_lora_weights={init!r}, which rewrites the base weights "
                "(W − B0·A0, or a quantised W) before training: its factors apply to that modified base, not to "
                "the base model, and adding them to the base gives wrong weights. Convert it to a plain LoRA "
                "adapter with PEFT (save_pretrained(..., path_initial_model_for_weight_conversion=...)) and "
                "pass the converted adapter.")
        _lora_number(where, "r", cfg.get("r", 8), integer=True)
        _lora_number(where, "lora_alpha", cfg.get("lora_alpha", 8), integer=False)
        for key, integer in (("rank_pattern", True), ("alpha_pattern", False)):
            pats = cfg.get(key) or {}
            if not isinstance(pats, dict):
                raise CheckpointError(f"{where}: {key} must map module-name patterns to numbers; got {pats!r}.")
            for pat, val in pats.items():
                _lora_number(where, f"{key}[{pat!r}]", val, integer=integer)
                try:
                    re.compile(str(pat))
                except re.error as exc:
                    raise CheckpointError(f"{where}: {key} pattern {pat!r} is not a valid regex ({exc}).") from None

    @staticmethod
    def _pattern_value(patterns: dict, module: str, default):
        # PEFT's get_pattern_key: the first key k with re.match(rf"(.*\.)?({k})$", module)
        for pat, val in patterns.items():
            if re.match(rf"(.*\.)?({pat})$", module):
                return val
        return default

    @property
    def stored_bytes(self) -> int:
        """Bytes of the adapter's own files (its factors), not of the base it applies to."""
        return self._factors.stored_bytes

    def summary(self) -> dict:
        """The adapter itself: rank, alpha, rsLoRA, DoRA, target modules, modules saved whole, its parameters
        (factors and saved tensors) and size on disk."""
        cfg = self.adapter_config
        targets = cfg.get("target_modules")
        return {"rank": cfg.get("r", 8), "alpha": cfg.get("lora_alpha", 8), "rslora": bool(cfg.get("use_rslora")),
                "dora": bool(cfg.get("use_dora")),
                "target_modules": sorted(targets) if isinstance(targets, (list, tuple, set)) else targets,
                "modules_to_save": cfg.get("modules_to_save") or [],
                "parameters": sum(i.numel for i in self._factors.infos().values()),
                "stored_bytes": self.stored_bytes, "base": str(self.base.ref)}

    def _scale_for(self, target_module: str) -> float:
        """lora_alpha / r for one module (lora_alpha / √r with rsLoRA), after rank_pattern / alpha_pattern."""
        cfg = self.adapter_config
        r = cfg.get("r", 8)
        alpha = cfg.get("lora_alpha", 8)
        r = self._pattern_value(cfg.get("rank_pattern") or {}, target_module, r)
        alpha = self._pattern_value(cfg.get("alpha_pattern") or {}, target_module, alpha)
        return alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r

    # -- factor names → targets
    def _pair_factors(self) -> dict[str, LoraPair]:
        base_names = set(self.base.names())
        groups: dict[str, dict[str, str]] = {}
        full: dict[str, str] = {}
        unknown: list[str] = []
        for name in self._factors.names():
            short = name.removeprefix("base_model.model.")
            for kind, pat in _LORA_TENSOR_KINDS:
                m = pat.match(short)
                if not m:
                    continue
                if kind in ("saved", "full"):
                    target = f"{m.group(1)}.{m.group(2)}"
                    known = (target, f"model.{target}", target.removeprefix("model."))
                    saved_module = m.group(1).rsplit(".", 1)[-1] in (self.adapter_config.get("modules_to_save") or ())
                    if kind == "full" and not saved_module and not any(c in base_names for c in known):
                        continue  # a plain X.weight the base lacks: not a full tensor of the base
                    full[self._match_base_name(target, base_names)] = name
                else:
                    groups.setdefault(m.group(1), {})[kind] = name
                break
            else:
                unknown.append(name)
        if unknown:
            raise CheckpointError(
                f"The adapter {self.path} holds tensors that are not LoRA factors forgetlab knows: "
                f"{', '.join(unknown[:5])}{' …' if len(unknown) > 5 else ''}. forgetlab reads lora_A/lora_B, "
                "lora_embedding_A/B, DoRA magnitudes, lora_B biases and full tensors of modules_to_save. "
                + _MERGE_IT_YOURSELF)
        use_dora = bool(self.adapter_config.get("use_dora", False))
        fan = bool(self.adapter_config.get("fan_in_fan_out", False))
        pairs: dict[str, LoraPair] = {}
        for module, g in groups.items():
            emb = "embA" in g or "embB" in g
            a, b = (g.get("embA"), g.get("embB")) if emb else (g.get("A"), g.get("B"))
            if a is None or b is None or (emb and ("A" in g or "B" in g)):
                raise CheckpointError(
                    f"The adapter {self.path} stores an incomplete LoRA pair for {module} "
                    f"(found {', '.join(sorted(g))}; need both A and B): the adapter file is damaged.")
            if use_dora != ("mag" in g):
                raise CheckpointError(
                    f"The adapter {self.path} {'says use_dora but stores no magnitude vector' if use_dora else 'stores a DoRA magnitude vector but its config lacks use_dora'} "
                    f"for {module}: config and weights disagree. Re-save the adapter with PEFT.")
            target = self._match_base_name(module + ".weight", base_names)
            scale = self._scale_for(module)
            pairs[target] = LoraPair(target, a, b, scale, fan_in_fan_out=fan and not emb, embedding=emb,
                                     magnitude=g.get("mag"), replacement=full.pop(target, None))
            if "B_bias" in g:
                if not {f"{module}.bias", f"model.{module}.bias", module.removeprefix("model.") + ".bias"} & base_names:
                    raise CheckpointError(
                        f"The LoRA adapter {self.ref} was trained with lora_bias=True: it adds a bias to {module}, "
                        f"which has no bias in the base {self.base.ref}. PEFT cannot merge it into this base either "
                        "('Impossible to merge LoRA with lora_bias=True because the base layer has no bias'). "
                        "Retrain the adapter without lora_bias, or pass a base whose layer has a bias.")
                bias_target = self._match_base_name(module + ".bias", base_names)
                pairs[bias_target] = LoraPair(bias_target, None, g["B_bias"], scale,
                                              replacement=full.pop(bias_target, None), bias_of=target)
        for target, name in full.items():
            pairs[target] = LoraPair(target, replacement=name)
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
        if name.endswith("lm_head.weight") and getattr(self.base.config, "tie_word_embeddings", False):
            raise CheckpointError(
                f"The LoRA adapter {self.ref} changes lm_head, but the base {self.base.ref} ties lm_head to the "
                "embeddings and stores no lm_head of its own; forgetlab does not untie weights. "
                + _MERGE_IT_YOURSELF)
        raise IncompatibleModelsError(
            f"The LoRA adapter {self.ref} targets {name}, which the base {self.base.ref} does not have: "
            "the adapter was trained on another base model. Pass the base it was trained on."
        )

    def _check_against_base(self) -> None:
        for target, pair in self.pairs.items():
            base_shape = tuple(self.base.info(target).shape)
            shapes = {}
            if pair.replacement is not None:
                shapes["the stored tensor"] = tuple(self._factors.info(pair.replacement).shape)
            if pair.bias_of is not None:
                shapes["the lora_B bias"] = tuple(self._factors.info(pair.b_name).shape)
            elif pair.a_name is not None:
                a = tuple(self._factors.info(pair.a_name).shape)
                b = tuple(self._factors.info(pair.b_name).shape)
                if len(a) != 2 or len(b) != 2 or a[0] != b[1]:
                    raise CheckpointError(
                        f"The adapter {self.path} has LoRA factors of shapes A {a} and B {b} for {target}, which "
                        "cannot be multiplied (A must be r × in and B out × r): the adapter file is damaged.")
                if pair.embedding:
                    shape = (a[1], b[0])
                else:
                    shape = (a[1], b[0]) if pair.fan_in_fan_out else (b[0], a[1])
                shapes["the LoRA delta"] = shape
                if pair.magnitude is not None:
                    out = shape[1] if (pair.embedding or pair.fan_in_fan_out) else shape[0]
                    mag = tuple(self._factors.info(pair.magnitude).shape)
                    if mag != (out,):
                        raise CheckpointError(
                            f"The adapter {self.path} has a DoRA magnitude of shape {mag} for {target}, but the "
                            f"target has {out} output features: the adapter file is damaged.")
            for what, shape in shapes.items():
                if tuple(shape) != base_shape:
                    raise IncompatibleModelsError(
                        f"The LoRA adapter {self.ref} gives {target} {what} of shape {tuple(shape)}, "
                        f"but the base {self.base.ref} has shape {base_shape}: the adapter belongs to "
                        "another base model (or one with a resized vocabulary)."
                    )

    # -- reading
    def nonfinite_tensors(self, progress: Progress = None) -> list[str]:
        """Names of the adapter's stored tensors (factors, DoRA magnitudes, saved modules) holding NaN or Inf.

        ΔW = scale·B·A is finite when its factors are (the base is scanned on its own), so the factors are
        read instead of every ΔW: a few MiB instead of a matrix product per target module."""
        return self._factors.nonfinite_tensors(progress)

    def infos(self):
        return self.base.infos()

    def delta_names(self) -> list[str]:
        """Base tensor names that the adapter changes."""
        return list(self.pairs)

    def _lora_delta(self, pair: LoraPair) -> torch.Tensor:
        """scale · B · A in the target's layout (float32); for a lora_B bias, scale · b_B."""
        b = self._factors.read(pair.b_name, torch.float32)
        if pair.bias_of is not None:
            return pair.scale * b
        a = self._factors.read(pair.a_name, torch.float32)
        d = pair.scale * (b @ a)
        return d.T if (pair.fan_in_fan_out or pair.embedding) else d

    def _merged(self, pair: LoraPair) -> torch.Tensor:
        """The target tensor after PEFT's merge_and_unload(), in float32."""
        if pair.replacement is not None:
            w0 = self._factors.read(pair.replacement, torch.float32)
        else:
            w0 = self.base.read(pair.target, torch.float32)
        if pair.b_name is None:
            return w0
        v = w0 + self._lora_delta(pair)
        if pair.magnitude is None:
            return v
        m = self._factors.read(pair.magnitude, torch.float32)
        if pair.embedding or pair.fan_in_fan_out:  # weight stored [in, out]: one norm per column
            return v * (m / torch.linalg.norm(v, dim=0)).view(1, -1)
        return v * (m / torch.linalg.norm(v, dim=1)).view(-1, 1)

    def delta(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """τ = merged − θ0 for one base tensor: exactly scale · B · A for plain LoRA; merged weight minus the
        base for DoRA and stored tensors (depends on the base); zeros if the adapter does not touch it."""
        pair = self.pairs.get(name)
        if pair is None:
            return torch.zeros(self.base.info(name).shape, dtype=dtype)
        if pair.exact_delta:
            return self._lora_delta(pair).to(dtype)
        return (self._merged(pair) - self.base.read(name, torch.float32)).to(dtype)

    def read(self, name, dtype=torch.float32):
        pair = self.pairs.get(name)
        if pair is None:
            base = self.base.read(name, dtype=None)
            return base if dtype is None else base.to(dtype)
        if pair.exact_delta:
            base = self.base.read(name, dtype=None)
            return (base.to(torch.float32) + self._lora_delta(pair)).to(dtype or base.dtype)
        if pair.b_name is None:  # a stored full tensor, as it was saved
            t = self._factors.read(pair.replacement, dtype=None)
            return t if dtype is None else t.to(dtype)
        return self._merged(pair).to(dtype or self.base.info(name).dtype)

    @property
    def config_dir(self):
        return self.base.config_dir

    @cached_property
    def config(self):
        """The base's config (a GGUF base has no config.json beside it: its config comes from the file)."""
        return self.base.config

    @property
    def tokenizer_dir(self):
        return super().tokenizer_dir or self.base.tokenizer_dir


def _read_adapter_config(path: Path) -> dict:
    """adapter_config.json of a PEFT adapter folder as a dict, or a CheckpointError saying what is wrong."""
    file = path / "adapter_config.json"
    try:
        cfg = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"{file} is unreadable ({exc}). An adapter folder needs the adapter_config.json PEFT wrote; "
            "restore it or re-save the adapter.") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{file} holds a {type(cfg).__name__}, not a JSON object: it is not a PEFT "
                              "adapter config; restore it or re-save the adapter.")
    return cfg


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


_MAX_ADAPTER_CHAIN = 8


def split_adapter_ref(ref: str) -> tuple[str, str | None]:
    """mergekit's `model+lora` reference → (model, adapter folder); (ref, None) when `ref` is not of that
    form (the part after the last '+' must be a folder holding adapter_config.json)."""
    model, sep, adapter = str(ref).rpartition("+")
    if sep and model and (Path(adapter).expanduser() / "adapter_config.json").is_file():
        return model, adapter
    return str(ref), None


def _adapter_base(path: Path, chain: tuple[Path, ...]) -> str:
    """The base_model_name_or_path of the adapter at `path`, refusing a self-reference or a cycle."""
    cfg = _read_adapter_config(path)
    base = cfg.get("base_model_name_or_path")
    if not base or not isinstance(base, str):
        raise CheckpointError(f"{path} is a LoRA adapter: say which base model it applies to.")
    target = Path(base).expanduser()
    if target.exists() and target.resolve() in chain:
        loop = " → ".join(str(p) for p in chain + (target.resolve(),))
        raise CheckpointError(
            f"The adapter {path} names {base} as its base model, which leads back to an adapter already being "
            f"opened ({loop}). Pass the real base model (the folder of weights the adapter was trained on), "
            "or fix base_model_name_or_path in adapter_config.json.")
    if len(chain) >= _MAX_ADAPTER_CHAIN:
        raise CheckpointError(f"{path}: more than {_MAX_ADAPTER_CHAIN} adapters stacked on each other through "
                              "base_model_name_or_path; pass the base model explicitly.")
    return base


def _index_files(path: Path, index_name: str) -> list[Path]:
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


def open_checkpoint(ref: str | Path | Checkpoint, base: str | Path | Checkpoint | None = None,
                    *, _adapters: tuple[Path, ...] = ()) -> Checkpoint:
    """Open a model reference: HF folder (safetensors, sharded or not; `.bin`), GGUF file, LoRA adapter
    folder (needs `base`, or finds it from adapter_config.json) or a hub id (needs a network)."""
    if isinstance(ref, Checkpoint):
        return ref
    path = Path(str(ref)).expanduser()
    if not path.exists() and "+" in str(ref):
        model, adapter = split_adapter_ref(str(ref))
        if adapter is not None:       # mergekit's `base+lora`: the adapter applied to that base
            return open_checkpoint(adapter, base=model, _adapters=_adapters)
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
        chain = _adapters + (path.resolve(),)
        named = base is None
        if named:
            base = _adapter_base(path, chain)
        try:
            base_ckpt = open_checkpoint(base, _adapters=chain)
        except OfflineError:
            if not named:
                raise
            raise OfflineError(
                f"The adapter {path} names the hub id {base!r} as its base (base_model_name_or_path in "
                f"{path / 'adapter_config.json'}), which cannot be fetched here. Pass the base model's local "
                "folder instead: --base on the command line, `base:` in the pool file (the adapter then applies "
                "to it), or edit base_model_name_or_path.") from None
        return LoraCheckpoint(ref, path, base_ckpt)
    if (path / SAFETENSORS_INDEX).exists():
        return SafetensorsCheckpoint(ref, path, _index_files(path, SAFETENSORS_INDEX))
    st = sorted(path.glob("*.safetensors"))
    if st:
        return SafetensorsCheckpoint(ref, path, st)
    if (path / BIN_INDEX).exists():
        return BinCheckpoint(ref, path, _index_files(path, BIN_INDEX))
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


def load_model(ref: str | Path | Checkpoint, device=None, dtype=torch.float32):
    """A causal-LM model ready for forward passes (eval mode, no grad needed) on `device`.

    LoRA adapters are merged into the base weights (θ0 + ΔW) so every model is a plain transformers model.
    `device` may be a `forgetlab.devicemap.Placement` (an accelerate device map with `max_memory`, for a model
    larger than one device; HF folders only): the layers are then spread over GPUs, CPU and disk.
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from forgetlab.devicemap import Placement

    hf_logging.disable_progress_bar()  # forgetlab reports progress through its own callbacks
    placement = device if isinstance(device, Placement) else None
    device = check_device(None if placement else device)
    ckpt = open_checkpoint(ref)
    dtype = _as_dtype(dtype)
    if placement is not None and isinstance(ckpt, (GGUFCheckpoint, LoraCheckpoint)):
        raise CheckpointError(f"A device map needs an HF folder; {ckpt.ref} is a {ckpt.kind} checkpoint. Convert or "
                              "merge it into a folder first (forgetlab merge / the zoo's conversion).")
    try:
        if placement is not None:
            model, info = AutoModelForCausalLM.from_pretrained(str(ckpt.path), dtype=dtype, trust_remote_code=False,
                                                               output_loading_info=True, **placement.kwargs())
            _check_loading_info(ckpt, info)
            return model.eval()
        if isinstance(ckpt, GGUFCheckpoint):
            # dequantised once per process (_dequantised); a plain model built from the config, so it can be
            # saved and fine-tuned like any other
            model = AutoModelForCausalLM.from_config(ckpt.config, dtype=torch.float32, trust_remote_code=False)
            model.load_state_dict(ckpt._tensors, strict=False)
            model.tie_weights()
            model = model.to(dtype)
        elif isinstance(ckpt, LoraCheckpoint):
            model = load_model(ckpt.base, device="cpu", dtype=torch.float32)
            params = dict(model.named_parameters())
            with torch.no_grad():
                for name in ckpt.delta_names():
                    if name in params:
                        params[name].add_(ckpt.delta(name))
            model = model.to(dtype)
        else:
            # before transformers loads it: it would print its own mismatch report first (checked again after)
            found = config_mismatch(ckpt)
            if found:
                raise IncompatibleModelsError(
                    f"The config.json of {ckpt.ref} disagrees with its weights ({found}): loading it would "
                    "re-initialise those weights. Fix the config (or the weights) so their shapes match.")
            model, info = AutoModelForCausalLM.from_pretrained(str(ckpt.path), dtype=dtype, trust_remote_code=False,
                                                               output_loading_info=True)
            _check_loading_info(ckpt, info)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"Cannot load {ckpt.ref} as a causal language model: {exc}") from None
    except RuntimeError as exc:
        if "mismatch" in str(exc):
            raise IncompatibleModelsError(
                f"The config.json of {ckpt.ref} disagrees with its weights ({_first_shape_mismatch(ckpt)}); fix "
                "the config (or the weights) so their shapes match.") from None
        raise
    return model.to(device).eval()


def config_mismatch(ckpt: Checkpoint) -> str | None:
    """'<tensor>: <stored shape> stored, <shape the config gives> expected' for the first tensor whose stored
    shape disagrees with the model its config describes (built on the meta device: no memory, no weights);
    None when every shape agrees or the config cannot be built."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(ckpt.config, trust_remote_code=False)
        want = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
        infos = ckpt.infos()
    except Exception:  # an unknown architecture or an unreadable config: nothing to compare against
        return None
    for name, info in infos.items():
        if name in want and tuple(info.shape) != want[name]:
            return f"{name}: {tuple(info.shape)} stored, {want[name]} expected"
    return None


def _first_shape_mismatch(ckpt: Checkpoint) -> str:
    found = config_mismatch(ckpt)
    return f"e.g. {found}" if found else "tensor shapes differ"


def _check_loading_info(ckpt: Checkpoint, info: dict) -> None:
    """transformers re-initialises weights whose shape disagrees with config.json (and any it cannot find) with
    only a log line: a model that is silently not the checkpoint. Refuse it instead."""
    mismatched = list(info.get("mismatched_keys") or [])
    missing = list(info.get("missing_keys") or [])
    if mismatched:
        first = mismatched[0]
        detail = (f"{first[0]}: {tuple(first[1])} stored, {tuple(first[2])} expected"
                  if isinstance(first, (tuple, list)) and len(first) == 3 else str(first))
        raise IncompatibleModelsError(
            f"The config.json of {ckpt.ref} disagrees with its weights ({len(mismatched)} tensors, e.g. {detail}); "
            "fix the config (or the weights) so their shapes match.")
    if missing:
        raise IncompatibleModelsError(
            f"{ckpt.ref} lacks {len(missing)} weights its config.json asks for (e.g. {sorted(missing)[0]}); "
            "the checkpoint is incomplete or its config belongs to another model.")


def load_tokenizer(ref: str | Path | Checkpoint):
    """The tokenizer stored with a model (a LoRA adapter falls back to its base's)."""
    from transformers import AutoTokenizer

    ckpt = open_checkpoint(ref)
    if isinstance(ckpt, LoraCheckpoint) and Checkpoint.tokenizer_dir.fget(ckpt) is None:
        return load_tokenizer(ckpt.base)       # the adapter has none: its base's (a GGUF base's included)
    if isinstance(ckpt, GGUFCheckpoint):
        tok = AutoTokenizer.from_pretrained(str(ckpt.gguf_file.parent), gguf_file=ckpt.gguf_file.name)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        return tok
    folder = ckpt.tokenizer_dir
    if folder is None:
        raise CheckpointError(f"{ckpt.ref} has no tokenizer files (tokenizer.json/tokenizer_config.json).")
    tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


# --------------------------------------------------------------------------------------------- writing


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
        self.fh.write(memoryview(data.numpy()))  # no bytes copy of the tensor
        self.done += 1

    def close(self) -> None:
        self.fh.close()
        if self.done != len(self.expected):
            raise CheckpointError(f"internal: shard closed with {self.done} of {len(self.expected)} tensors.")


def write_hf_folder(out_dir: str | Path, tensors: Iterable[tuple[str, torch.Tensor]] | dict[str, torch.Tensor],
                    config=None, *, plan: Sequence[TensorInfo] | None = None,
                    tokenizer_from: str | Path | Checkpoint | None = None, overwrite: bool = False,
                    extra_files: dict[str, str | bytes] | None = None,
                    max_shard_bytes: int = DEFAULT_SHARD_BYTES, progress: Progress = None,
                    inputs: Iterable[str | Path] = (), kind: str = "model") -> Path:
    """Write an HF model folder atomically: config.json, tokenizer files, sharded safetensors + index.

    `tensors` streams (name, tensor) pairs in the order of `plan` (the output's names, shapes and dtypes,
    known up front from the base); with a dict, the plan is taken from it. Peak memory is one tensor.
    `overwrite` replaces only a folder forgetlab wrote that holds none of `inputs` (forgetlab.outputs).
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
    return absolute(out_dir)


def save_model(model, tokenizer, out_dir: str | Path, overwrite: bool = False,
               extra_files: dict[str, str | bytes] | None = None, inputs: Iterable[str | Path] = (),
               kind: str = "model") -> Path:
    """Save a transformers model (+ tokenizer) as an HF safetensors folder, atomically (forgetlab.outputs:
    `overwrite` replaces only a folder forgetlab wrote that holds none of `inputs`)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with atomic_output_dir(out_dir, overwrite, inputs=inputs, kind=kind) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        for fname, content in (extra_files or {}).items():
            mode = "wb" if isinstance(content, bytes) else "w"
            with open(tmp / fname, mode) as fh:
                fh.write(content)
    return absolute(out_dir)
