"""`open_checkpoint`: one entry point for every model reference — an HF folder, a GGUF file, a LoRA adapter
folder (or mergekit's `base+lora`), or a hub id (downloaded only when named, and only with a network)."""
from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

from huggingface_hub import snapshot_download

from forgetlab.core.checkpoints.lora import LoraCheckpoint, read_adapter_config
from forgetlab.core.checkpoints.readers import (BIN_INDEX, SAFETENSORS_INDEX, BinCheckpoint, Checkpoint, GGUFCheckpoint,
                                                SafetensorsCheckpoint, index_files)
from forgetlab.core.errors import CheckpointError, OfflineError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_like_hub_id(ref: str) -> bool:
    """Whether `ref` reads as a hub id (`owner/name`) rather than a local path."""
    return bool(_HUB_ID.match(ref)) and not ref.startswith((".", "/", "~"))


def _resolve_hub(ref: str) -> Path:
    """Download (or find in the local cache) a hub model's weights, config and tokenizer."""
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
    cfg = read_adapter_config(path)
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


SAFE_WEIGHTS = "model.safetensors"
BIN_WEIGHTS = "pytorch_model.bin"


class ExtraWeightFilesWarning(UserWarning):
    """A model folder holds weight files besides the ones read (a stale single file, a backup, a .bin copy)."""


def transformers_weights(path: Path) -> tuple[str, list[Path]] | None:
    """The weight files transformers' `from_pretrained` reads from the folder `path`, in its order of preference:
    model.safetensors, then model.safetensors.index.json's shards, then pytorch_model.bin, then
    pytorch_model.bin.index.json's shards. Returns ("safetensors" | "bin", files), or None when there are none."""
    if (path / SAFE_WEIGHTS).is_file():
        return "safetensors", [path / SAFE_WEIGHTS]
    if (path / SAFETENSORS_INDEX).is_file():
        return "safetensors", index_files(path, SAFETENSORS_INDEX)
    if (path / BIN_WEIGHTS).is_file():
        return "bin", [path / BIN_WEIGHTS]
    if (path / BIN_INDEX).is_file():
        return "bin", index_files(path, BIN_INDEX)
    return None


def _warn_unread(path: Path, files: list[Path]) -> None:
    """Warn (ExtraWeightFilesWarning) about weight files in `path` that are not `files`: forgetlab reads what
    transformers loads, so a stale model.safetensors beside shards, or a backup copy, is not merged or compared."""
    read = {f.resolve() for f in files}
    index = path / SAFETENSORS_INDEX
    others = sorted(p.name for p in [*path.glob("*.safetensors"), *path.glob("*.bin")]
                    if p.resolve() not in read and p.name != "training_args.bin")
    if others:
        listing = index.name if index.is_file() else BIN_INDEX
        used = files[0].name if len(files) == 1 else f"the {len(files)} shards of {listing}"
        shown = ", ".join(others[:5]) + (" …" if len(others) > 5 else "")
        warnings.warn(f"{path} also holds {shown}, which are not read: forgetlab reads {used}, as transformers does. "
                      "Move the other weight files away if they are stale, or rename the ones you mean.",
                      ExtraWeightFilesWarning, stacklevel=3)


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
        if looks_like_hub_id(str(ref)):
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
    chosen = transformers_weights(path)
    if chosen is not None:
        kind, files = chosen
        _warn_unread(path, files)
        return (SafetensorsCheckpoint if kind == "safetensors" else BinCheckpoint)(ref, path, files)
    st = sorted(path.glob("*.safetensors"))
    if len(st) == 1:   # one weights file under another name: transformers would not load it, forgetlab reads it
        return SafetensorsCheckpoint(ref, path, st)
    if st:
        raise CheckpointError(
            f"{path} holds {len(st)} safetensors files ({', '.join(p.name for p in st[:4])}) but neither "
            f"{SAFE_WEIGHTS} nor {SAFETENSORS_INDEX}, so it is not clear which are the model's weights (transformers "
            f"would not load it either). Rename the weights file to {SAFE_WEIGHTS}, or add the index that lists "
            "the shards.")
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return GGUFCheckpoint(ref, path, ggufs[0])
    raise CheckpointError(
        f"{path} holds no model weights (no *.safetensors, pytorch_model*.bin or single .gguf). "
        "Point at the folder that holds the weights."
    )
