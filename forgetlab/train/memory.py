"""The memory a what-if fine-tune needs, from the model's sizes, the dtype and the batch (no weights read).

Peak of one training step, in bytes, with P the model's parameters, T the trained ones (P, or the adapter's
for LoRA), b the job dtype's bytes, B the batch, S the longest training sequence, H/I/V/L/A the hidden width,
MLP width, vocabulary, layers and heads (docs/scaling.md):

    weights P·b + gradients T·b + optimizer state 2·T·b (AdamW, MoFO; Lion, MoFO-Lion T·b; SGD none)
    + θo T·b when SFA or L1/L2-to-init needs it + MoFO's (and MoFO-Lion's) per-tensor score, selection and
    mask: E·(b + 5)
    + activations  L·B·S·(10·H + 4·I)·b + L·B·A·S²·2·b    (with checkpointing: L·B·S·H·b + one layer's)
    + logits B·S·V·(b + 12)  (the logits, their float32 copy, log-softmax and its gradient)
    or, when larger, the records' evaluation: 16·128·V·b + 2·128·V·4 (a batch of logits, one row in float32)

A comparison runs its configs one after another: its peak is its largest run's. The evaluations between steps
need less than a step (no gradients, no activations kept).
"""
from __future__ import annotations

import re
from typing import Any, Optional, Sequence

from forgetlab.core.checkpoints import check_device
from forgetlab.core.errors import ForgetlabError
from forgetlab.core.memory import (MemoryEstimate, ModelSize, dtype_bytes, dtype_fixes, dtype_name, job_dtype,
                                   register_estimator)
from forgetlab.train.examples import training_examples
from forgetlab.train.lora import checkpoint_targets
from forgetlab.train.results import FinetuneConfig
from forgetlab.train.trainer import MOFO_OPTIMIZERS


LORA_PER_RANK = {"q_proj": (2, 0), "k_proj": (2, 0), "v_proj": (2, 0), "o_proj": (2, 0), "gate_proj": (1, 1),
                 "up_proj": (1, 1), "down_proj": (1, 1), "c_attn": (4, 0), "c_proj": (3, 1), "c_fc": (1, 1),
                 "qkv_proj": (4, 0), "gate_up_proj": (1, 2), "query_key_value": (4, 0), "dense": (2, 0),
                 "dense_h_to_4h": (1, 1), "dense_4h_to_h": (1, 1), "shared_expert_gate": (1, 0)}
"""in + out of one adapted matrix, as (multiples of H, multiples of I): q/k/v/o H + H; gate/up/down H + I;
GPT-2's c_attn H + 3H, c_proj (attention's H + H and the MLP's I + H together); Phi-3's qkv_proj H + 3H,
gate_up_proj H + 2I; GPT-NeoX's query_key_value H + 3H, dense H + H, dense_h_to_4h / dense_4h_to_h H + I. Used
when the checkpoint's shapes cannot be read."""


def _lora_parameters(size: ModelSize, config, shapes: Optional[dict[str, list[tuple[int, ...]]]] = None) -> int:
    """Parameters of a LoRA adapter of rank r on the blocks' linear layers: r·(in + out) per adapted matrix.
    With `shapes` (a linear layer's last name → the 2-D shapes of its weights in the checkpoint, `lora_shapes`),
    summed exactly over the targets (default: every name in `shapes`, as the fine-tune defaults to every linear
    layer); else per layer from the sizes by `LORA_PER_RANK` (Llama's seven projections by default)."""
    r, h, i = int(config.lora), size.hidden or 1, size.intermediate or 4 * (size.hidden or 1)
    targets = config.lora_targets
    if shapes:
        chosen = targets or list(shapes)
        return r * sum(a + b for t in chosen for a, b in shapes.get(t, []))
    chosen = targets or ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return r * size.layers * sum(LORA_PER_RANK.get(t, (2, 0))[0] * h + LORA_PER_RANK.get(t, (2, 0))[1] * i
                                 for t in chosen)


def lora_shapes(ckpt) -> dict[str, list[tuple[int, ...]]]:
    """A checkpoint's LoRA-targetable linear layers (`forgetlab.train.lora.checkpoint_targets`) → the shapes of
    their 2-D weights in the blocks (every layer's); {} when its headers cannot be read."""
    try:
        infos = ckpt.infos()
        allowed = set(checkpoint_targets(ckpt))
    except (ForgetlabError, OSError, ValueError, AttributeError):
        return {}
    out: dict[str, list[tuple[int, ...]]] = {}
    for name, info in infos.items():
        last = name.rsplit(".", 2)[-2] if name.endswith(".weight") and name.count(".") >= 2 else None
        if last in allowed and len(info.shape) == 2 and re.search(r"\.(layers|h|blocks)\.\d+\.", name) \
                and not re.search(r"\.experts\.\d+\.", name):
            out.setdefault(last, []).append(tuple(int(x) for x in info.shape))
    return out


def _longest(pool, task: str, max_train: Optional[int], max_length: int) -> int:
    examples = training_examples(pool, task, max_length=max_length, max_train=max_train)
    return max(len(e.input_ids) for e in examples)


EVAL_BLOCK = 128      # tokens per general-text block of the records' evaluations (core.evaluate.general_loss)


def run_parts(size: ModelSize, config, *, dtype, seq: int, gradient_checkpointing: bool,
              eval_batch: int = 16, shapes: Optional[dict[str, list[tuple[int, ...]]]] = None) -> dict[str, int]:
    """The parts of one config's peak (module docstring), in bytes; `shapes` as in `_lora_parameters`."""
    b = dtype_bytes(dtype)
    batch = int(config.batch_size)
    lora = int(getattr(config, "lora", 0) or 0)
    trained = _lora_parameters(size, config, shapes) if lora else size.parameters
    h, i = size.hidden or 1, size.intermediate or 4 * (size.hidden or 1)
    layers, heads, vocab = max(1, size.layers), max(1, size.heads), max(1, size.vocab)
    per_layer = batch * seq * (10 * h + 4 * i) * b + batch * heads * seq * seq * 2 * b
    parts = {"weights": size.bytes(dtype), "gradients": trained * b}
    if config.optimizer in ("adamw", "mofo"):
        parts["optimizer state"] = 2 * trained * b
    elif config.optimizer in ("lion", "mofo-lion"):
        parts["optimizer state"] = trained * b
    if config.sfa_p is not None or config.l1 or config.l2:
        parts["θo (start weights)"] = trained * b
    if config.optimizer in MOFO_OPTIMIZERS and not lora:
        largest = max(size.vocab * size.hidden, size.intermediate * size.hidden) or size.layer_parameters // 3
        parts["MoFO mask"] = largest * (b + 5)     # the largest tensor's |m|, its selection copy and the mask
    activations = (layers * batch * seq * h * b + per_layer) if gradient_checkpointing else layers * per_layer
    logits = batch * seq * vocab * (b + 12)
    evaluation = eval_batch * EVAL_BLOCK * vocab * b + 2 * EVAL_BLOCK * vocab * 4   # logits + one row in float32
    if activations + logits >= evaluation:
        parts["activations"], parts["logits"] = activations, logits
    else:
        parts["evaluation"] = evaluation
    return parts


@register_estimator("finetune")
def estimate_finetune(pool, task: str, config=None, configs: Optional[Sequence[Any]] = None, *, start: str = "base",
                      device: Optional[str] = None, dtype=None, gradient_checkpointing: bool = False,
                      max_train: Optional[int] = None, max_length: int = 256, **_: Any) -> MemoryEstimate:
    """The peak of `forgetlab.train.runs.finetune` (or `compare` with `configs`): the largest run's parts
    (module docstring), with the flags that shrink it in the order they help most."""
    device = check_device(device)
    dt = job_dtype(dtype, device)
    size = ModelSize.of(pool.checkpoint(start))
    seq = _longest(pool, task, max_train, max_length)
    runs = list(configs) if configs else [config or FinetuneConfig()]
    shapes = lora_shapes(pool.checkpoint(start)) if any(getattr(c, "lora", 0) for c in runs) else None
    best = max((run_parts(size, c, dtype=dt, seq=seq, gradient_checkpointing=gradient_checkpointing, shapes=shapes)
                for c in runs),
               key=lambda parts: sum(parts.values()))
    fixes = dtype_fixes(dt)
    if not any(getattr(c, "lora", 0) for c in runs):
        fixes.append("--lora 16 (page: LoRA)")
    if not gradient_checkpointing:
        fixes.append("--gradient-checkpointing")
    if max(int(c.batch_size) for c in runs) > 1:
        fixes.append("a smaller --batch-size")
    return MemoryEstimate("finetune", str(device), dtype_name(dt), best, fixes=fixes)
