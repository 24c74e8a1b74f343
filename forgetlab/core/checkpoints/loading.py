"""Loading checkpoints as transformers models and tokenizers on a device, and checking devices.
`trust_remote_code` is never switched on."""
from __future__ import annotations

import threading
from pathlib import Path

import torch
import transformers
from transformers.utils import logging as hf_logging

from forgetlab.core.checkpoints.lora import LoraCheckpoint
from forgetlab.core.checkpoints.opening import open_checkpoint
from forgetlab.core.checkpoints.readers import Checkpoint, GGUFCheckpoint
from forgetlab.core.devicemap import Placement
from forgetlab.core.errors import CheckpointError, IncompatibleModelsError, ParameterError
from forgetlab.core.tokenizer_edits import strip_tokens_beyond

# transformers' from_pretrained is not thread-safe: two loads at once in one process (the app's background jobs)
# lose the tie of lm_head to the embeddings — it reports lm_head.weight missing and re-initialises it (18 of 18
# loads in three threads, 0 of 3 in one). Loads are serialised; the models they return run in parallel.
_FROM_PRETRAINED = threading.Lock()


def default_device() -> str:
    """"cuda" when a GPU is available, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device: str | None) -> str:
    """`device` if torch can use it on this machine ("cpu", "cuda", "cuda:N", "mps"), the default device for
    None; a ParameterError naming the choices otherwise."""
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
    `device` may be a `forgetlab.core.devicemap.Placement` (an accelerate device map with `max_memory`, for a model
    larger than one device; HF folders only): the layers are then spread over GPUs, CPU and disk.
    """
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
            with _FROM_PRETRAINED:
                model, info = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt.path), dtype=dtype, trust_remote_code=False,
                                                                   output_loading_info=True, **placement.kwargs())
            _check_loading_info(ckpt, info)
            return model.eval()
        if isinstance(ckpt, GGUFCheckpoint):
            # dequantised once per process (_dequantised); a plain model built from the config, so it can be
            # saved and fine-tuned like any other
            with _FROM_PRETRAINED:
                model = transformers.AutoModelForCausalLM.from_config(ckpt.config, dtype=torch.float32, trust_remote_code=False)
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
            with _FROM_PRETRAINED:
                model, info = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt.path), dtype=dtype, trust_remote_code=False,
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
    try:
        with torch.device("meta"):
            skeleton = transformers.AutoModelForCausalLM.from_config(ckpt.config, trust_remote_code=False)
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


def _gguf_special_tokens(tok, ckpt):
    """The tokenizer transformers builds from a GGUF file with its special tokens at the file's ids: the byte-level
    builder (a GPT-2 tokenizer) appends its default `<|endoftext|>` when the file's vocabulary lacks it, at id
    vocab_size (a model indexed there fails); that token is dropped (`strip_tokens_beyond` the file's token count) and
    BOS/EOS/UNK/PAD point at the tokens the file names (tokenizer.ggml.*_token_id) or at none."""
    size = getattr(ckpt.config, "vocab_size", None)
    if size:
        strip_tokens_beyond(tok, int(size), f"The tokenizer of {ckpt.gguf_file}")
        vocab = tok.get_vocab()
        for attr in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = getattr(tok, attr, None)
            if value is not None and vocab.get(str(value), size) >= size:
                setattr(tok, attr, None)
    if tok.pad_token_id is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def load_tokenizer(ref: str | Path | Checkpoint):
    """The tokenizer stored with a model (a LoRA adapter falls back to its base's)."""
    ckpt = open_checkpoint(ref)
    if isinstance(ckpt, LoraCheckpoint) and Checkpoint.tokenizer_dir.fget(ckpt) is None:
        return load_tokenizer(ckpt.base)       # the adapter has none: its base's (a GGUF base's included)
    if isinstance(ckpt, GGUFCheckpoint):
        tok = transformers.AutoTokenizer.from_pretrained(str(ckpt.gguf_file.parent), gguf_file=ckpt.gguf_file.name)
        return _gguf_special_tokens(tok, ckpt)
    folder = ckpt.tokenizer_dir
    if folder is None:
        raise CheckpointError(f"{ckpt.ref} has no tokenizer files (tokenizer.json/tokenizer_config.json).")
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
