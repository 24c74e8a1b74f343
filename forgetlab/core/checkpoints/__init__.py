"""Model checkpoints: HF folders, GGUF files, hub ids and PEFT LoRA adapters.

- `readers`: lazily opened stored checkpoints (safetensors, `.bin`, GGUF); listing names, shapes and dtypes
  reads no tensor data.
- `lora`: a PEFT adapter read against its base.
- `opening`: `open_checkpoint`, one entry point for every model reference.
- `loading`: transformers models and tokenizers on a device.
- `writing`: HF folders written atomically, one tensor at a time.

Safe loading: safetensors first; a `.bin` only through `torch.load(weights_only=True)`; `trust_remote_code` is
never switched on. The names below are the package's public interface.
"""
from forgetlab.core.checkpoints.loading import check_device, config_mismatch, default_device, load_model, load_tokenizer
from forgetlab.core.checkpoints.lora import LoraCheckpoint, LoraPair
from forgetlab.core.checkpoints.opening import looks_like_hub_id, open_checkpoint, split_adapter_ref
from forgetlab.core.checkpoints.readers import (BIN_INDEX, DEFAULT_SHARD_BYTES, SAFETENSORS_INDEX, TOKENIZER_FILES,
                                                BinCheckpoint, Checkpoint, GGUFCheckpoint, SafetensorsCheckpoint,
                                                TensorInfo)
from forgetlab.core.checkpoints.writing import save_model, write_hf_folder

__all__ = ["BIN_INDEX", "DEFAULT_SHARD_BYTES", "SAFETENSORS_INDEX", "TOKENIZER_FILES", "BinCheckpoint", "Checkpoint",
           "GGUFCheckpoint", "LoraCheckpoint", "LoraPair", "SafetensorsCheckpoint", "TensorInfo", "check_device",
           "config_mismatch", "default_device", "load_model", "load_tokenizer", "looks_like_hub_id",
           "open_checkpoint", "save_model", "split_adapter_ref", "write_hf_folder"]
