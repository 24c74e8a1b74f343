"""LoRA what-if fine-tunes: a PEFT adapter on a pool model, what D(θ, θ0) means for it, and saving it.

With `--lora R` the fine-tune trains only a PEFT LoRA adapter (rank R, `lora_alpha` α, default 2·R, on the
`targets` modules, default every linear layer of the transformer blocks, by the model's own names; a MoE's 3-D
expert weights are no linear layers, `EXPERTS_NOTE`): W = W0 + (α/R)·B·A with B = 0 at the
start. AdamW, MoFO, SFA and L1/L2-to-init act on the adapter's parameters A and B (SFA averages them with their
initial values, the penalties pull them towards those: θo is the adapter at its start). The records' D(θ, θ0) is
that of the merged weights against the model the run started from, (1/B)·Σk ‖ΔWk‖/‖W0,k‖ over the start's B
tensors of non-zero norm — the same figure `forgetlab.core.taskvectors.checkpoint_distance` gives the saved
adapter — so full and LoRA runs are compared on one scale.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Sequence

import torch
from transformers.pytorch_utils import Conv1D

from forgetlab.core.anatomy import Anatomy
from forgetlab.core.errors import ForgetlabError, ParameterError
from forgetlab.core.outputs import atomic_output_dir
from forgetlab.core.poolsaves import save_into_pool
from forgetlab.core.taskvectors import DistanceSum, MovedCount, WeightChange

ADAPTER = "default"


EXPERTS_NOTE = ("A mixture of experts' expert weights are 3-D tensors in transformers ≥ 5 (mlp.experts.gate_up_proj, "
                "down_proj), not linear layers, so LoRA cannot adapt them (nor the router); its LoRA trains the "
                "attention and any shared expert. Fine-tune every weight to move the experts.")


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of the linear layers inside the model's transformer blocks (q_proj, v_proj,
    gate_proj … for Llama; c_attn, c_proj, c_fc for GPT-2's Conv1D; qkv_proj, gate_up_proj for Phi-3;
    query_key_value, dense, dense_h_to_4h, dense_4h_to_h for GPT-NeoX): what `targets` may name, and the default
    targets. The output head is left out (an adapter on it would also move the tied embedding); a MoE's 3-D expert
    parameters and its router are not linear layers (`EXPERTS_NOTE`)."""
    names = set()
    for full, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, Conv1D)) and not full.endswith(("lm_head", "embed_out")):
            names.add(full.rsplit(".", 1)[-1])
    return sorted(names)


def _not_targets(ckpt) -> set[str]:
    """The checkpoint's tensors a LoRA adapter cannot target in the loaded model: a MoE's per-expert tensors (3-D
    once loaded) and its router."""
    try:
        anatomy = Anatomy.from_config(ckpt.config, names=list(ckpt.infos()))
    except (ForgetlabError, OSError, ValueError):
        return set()
    router = anatomy.layout.mlp.router
    return {n for n in anatomy.names if anatomy.role(n).expert is not None
            or (router and anatomy.role(n).module == "mlp" and anatomy.role(n).part == router)}


def checkpoint_targets(ckpt) -> list[str]:
    """The linear layers a LoRA adapter can target, read from a checkpoint's headers (the last name of every 2-D
    weight inside the transformer blocks, less a MoE's experts and router): what the Fine-tune page offers without
    loading the model."""
    names = set()
    skip = _not_targets(ckpt)
    for name, info in ckpt.infos().items():
        if len(info.shape) == 2 and name.endswith(".weight") and re.search(r"\.(layers|h|blocks)\.\d+\.", name) \
                and name not in skip:
            names.add(name.rsplit(".", 2)[-2])
    return sorted(names)


def check_lora(model: torch.nn.Module, rank: int, alpha: Optional[float],
               targets: Optional[Sequence[str]]) -> list[str]:
    """Check a LoRA request against `model` and return the target module names (default: all of
    `linear_module_names`, for `targets` None). Rank must be ≥ 1, alpha > 0, and the targets one or more of the
    model's linear layers: an empty list is refused, not read as the default."""
    if int(rank) != rank or int(rank) < 1:
        raise ParameterError(f"--lora needs a rank ≥ 1 (e.g. 8 or 16); got {rank}.")
    if alpha is not None and not float(alpha) > 0:
        raise ParameterError(f"--lora-alpha must be > 0 (default 2·rank = {2 * int(rank)}); got {alpha}.")
    known = linear_module_names(model)
    if targets is not None and not list(targets):
        raise ParameterError(f"The LoRA target layers are an empty list; choose at least one of {', '.join(known)}, "
                             "or leave the targets out (None) for every linear layer of the blocks.")
    chosen = list(targets) if targets is not None else known
    unknown = [t for t in chosen if t not in known]
    if unknown or not chosen:
        moe = any(p.dim() == 3 for p in model.parameters())
        raise ParameterError(f"LoRA target module(s) {', '.join(unknown) or '(none)'} are not linear layers of this "
                             f"model; its linear layers are: {', '.join(known)}." + (f" {EXPERTS_NOTE}" if moe else ""))
    return chosen


def add_adapter(model: torch.nn.Module, rank: int, alpha: Optional[float] = None,
                targets: Optional[Sequence[str]] = None, seed: int = 0):
    """Wrap `model` in a PEFT LoRA model (rank, alpha default 2·rank, targets default every linear layer of
    the blocks; dropout 0) whose A matrices are drawn from a generator seeded with `seed`; only A and B train."""
    from peft import LoraConfig, get_peft_model

    chosen = check_lora(model, rank, alpha, targets)
    config = LoraConfig(r=int(rank), lora_alpha=float(alpha) if alpha is not None else 2.0 * int(rank),
                        lora_dropout=0.0, target_modules=chosen, task_type="CAUSAL_LM", bias="none")
    with torch.random.fork_rng(devices=[]):      # PEFT draws lora_A from the global generator
        torch.manual_seed(int(seed))
        return get_peft_model(model, config)


def _lora_layers(peft_model):
    from peft.tuners.lora import LoraLayer

    prefix = "base_model.model."
    for name, module in peft_model.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in getattr(module, "lora_A", {}):
            yield name.removeprefix(prefix) + ".weight", module


class LoraDistance:
    """D(θ, θ0) and the moved share (docs/methods.md#moved-share) of a LoRA model's merged weights against the
    checkpoint it started from (module docstring): the start's tensor norms and sizes are read once, streaming;
    each call forms each layer's ΔW = (α/R)·B·A. Every start tensor counts (an adapted layer with its ΔW, any
    other with no change), as `forgetlab.core.taskvectors.checkpoint_distance` counts the saved adapter."""

    def __init__(self, peft_model, start_checkpoint):
        self.model = peft_model
        self.layers = dict(_lora_layers(peft_model))
        norms, self.sizes = {}, {}
        for name, t in start_checkpoint.iter_tensors(dtype=torch.float32):
            norms[name], self.sizes[name] = float(t.norm()), t.numel()
        missing = [n for n in self.layers if n not in norms]
        if missing:
            raise ParameterError(f"The adapter's layer {missing[0]} has no tensor in the start model; "
                                 "LoRA needs the model's own module names.")
        self.norms = norms

    @torch.no_grad()
    def __call__(self) -> WeightChange:
        acc, moved = DistanceSum(), MovedCount()
        for name, base_norm in self.norms.items():
            module = self.layers.get(name)
            if module is None:
                acc.add(0.0, base_norm)
                moved.add_unmoved(self.sizes[name])
                continue
            delta = module.get_delta_weight(ADAPTER).float()
            acc.add(float(delta.norm()), base_norm)
            moved.add(delta)
        return WeightChange(acc.value, moved.value)


def enable_checkpointing(model) -> None:
    """Recompute each layer's activations in the backward pass (transformers' activation checkpointing, the
    non-reentrant kind, which also works when only an adapter trains); the KV cache is switched off."""
    model.config.use_cache = False
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):          # transformers ≥ 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def trainable_parameters(model: torch.nn.Module) -> int:
    """How many parameters a run trains (the adapter's for a LoRA model)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def save_adapter(pool, model, name: str, *, target: Path, run_json: Optional[str] = None,
                 overwrite: bool = False, update_yaml: bool = True) -> Path:
    """Save a LoRA model trained from the pool's base as a PEFT adapter folder (adapter_config.json +
    adapter_model.safetensors, written atomically) at `target`, add it to the pool as `{adapter: …}` and to
    the pool's YAML file (with `update_yaml`), both or neither (forgetlab.core.poolsaves); the analyses and merges
    read it as base + (α/R)·B·A."""
    def write(then) -> Path:
        with atomic_output_dir(target, overwrite=overwrite, kind="adapter", then=then) as tmp:
            model.save_pretrained(str(tmp), safe_serialization=True)
            if run_json is not None:
                (tmp / "finetune.json").write_text(run_json)
        return target

    return save_into_pool(pool, name, target, write, adapter=True, update_yaml=update_yaml)
