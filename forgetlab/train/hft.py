"""HFT, Half Fine-Tuning (docs/methods.md#hft; Hui et al. 2024, arXiv 2404.18466): which weight matrices a
fine-tuning round leaves frozen.

Within every decoder layer, HFT freezes a random share of the self-attention matrices and, separately, of the
feed-forward (MLP) matrices, and trains the rest; the paper's share is one half. With m matrices of a kind per
layer, L layers and share s, `hft_frozen` freezes K = ⌊s·m·L + ½⌋ of that kind in all: ⌊s·m⌋ in every layer and
one more in K − L·⌊s·m⌋ layers drawn at random, the matrices of each layer drawn at random too. For a Llama
layer and s = ½ that is the paper's selection: 2 of the 4 attention matrices (q, k, v, o) in every layer, and
2 of the 3 MLP matrices (gate, up, down) in a random half of the layers, 1 in the other half.

A matrix is a module of the layer's attention or MLP holding a weight of two or more dimensions (a linear layer,
GPT-2's Conv1D); its bias goes with it. Never frozen: the embeddings, every normalisation layer (Qwen3's q/k
norms included), the final norm and the output head (forgetlab's choice, see docs/methods.md#hft).
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch

from forgetlab.core.anatomy import Anatomy
from forgetlab.core.errors import ParameterError, check_fraction
from forgetlab.train.mofo import is_norm_module

KINDS = ("attn", "mlp")
"""The kinds of matrices HFT draws from, separately, in every decoder layer."""


def block_matrices(model: torch.nn.Module) -> dict[str, dict[int, dict[str, list[str]]]]:
    """The matrices HFT chooses among: kind ("attn", "mlp") → layer → matrix (its module's path inside the
    layer's attention or MLP, e.g. "q_proj") → the names of its parameters (weight, and bias where it has one),
    in the model's parameter order. Norm modules and modules without a ≥2-D weight are left out."""
    anatomy = Anatomy.from_model(model)
    modules = dict(model.named_modules())
    out: dict[str, dict[int, dict[str, list[str]]]] = {k: {} for k in KINDS}
    for name, _ in model.named_parameters():
        role = anatomy.role(name)
        if role.layer is None or role.module not in KINDS:
            continue
        module = modules.get(name.rsplit(".", 1)[0])
        weight = getattr(module, "weight", None)
        if module is None or is_norm_module(module) or not isinstance(weight, torch.Tensor) or weight.dim() < 2:
            continue
        out[role.module].setdefault(role.layer, {}).setdefault(role.part, []).append(name)
    return out


def frozen_counts(share: float, matrices: int, layers: int, generator: torch.Generator) -> list[int]:
    """How many of a layer's `matrices` matrices of one kind are frozen, per layer (module docstring):
    ⌊s·m⌋ everywhere, one more in K − L·⌊s·m⌋ layers drawn with `generator`, K = ⌊s·m·L + ½⌋."""
    base = math.floor(share * matrices + 1e-9)
    total = min(matrices * layers, math.floor(share * matrices * layers + 0.5 + 1e-9))
    extra = max(0, total - base * layers)
    counts = [base] * layers
    for i in torch.randperm(layers, generator=generator)[:extra].tolist():
        counts[i] += 1
    return counts


def hft_frozen(model: torch.nn.Module, share: float, seed: int) -> list[str]:
    """The names of the parameters HFT freezes for one round with share `share` (0.5 = the paper; 0: none) and
    a generator seeded with `seed` (module docstring, docs/methods.md#hft), in the model's parameter order.
    The same model, share and seed give the same names."""
    share = check_fraction("hft", share)
    if share == 0.0:
        return []
    if hasattr(model, "peft_config"):
        raise ParameterError("HFT freezes whole weight matrices of a full fine-tune, but this model carries a LoRA "
                             "adapter (whose base weights are frozen already). Use HFT or LoRA, not both.")
    found = block_matrices(model)
    if not any(found.values()):
        raise ParameterError("HFT found no attention or MLP weight matrix in this model's decoder layers, so it "
                             "has nothing to choose from. Use a model of a family forgetlab's anatomy understands.")
    gen = torch.Generator().manual_seed(int(seed))
    chosen: set[str] = set()
    for kind in KINDS:
        layers = sorted(found[kind])
        if not layers:
            continue
        widths = {len(found[kind][layer]) for layer in layers}
        if len(widths) != 1:
            raise ParameterError(f"HFT expects every decoder layer to have the same {kind} matrices; this model's "
                                 f"layers have {sorted(widths)} of them. Train it without HFT.")
        counts = frozen_counts(share, widths.pop(), len(layers), gen)
        for layer, k in zip(layers, counts):
            parts = list(found[kind][layer])
            for j in torch.randperm(len(parts), generator=gen)[:k].tolist():
                chosen.update(found[kind][layer][parts[j]])
    return [name for name, _ in model.named_parameters() if name in chosen]


def freeze_(model: torch.nn.Module, names: Iterable[str]) -> list[tuple[str, torch.nn.Parameter]]:
    """Set requires_grad=False on the named parameters that are trainable now; return those, as (name,
    parameter) pairs (for `unfreeze_`)."""
    wanted = set(names)
    out = []
    for name, p in model.named_parameters():
        if name in wanted and p.requires_grad:
            p.requires_grad_(False)
            out.append((name, p))
    return out


def unfreeze_(frozen: Sequence[tuple[str, torch.nn.Parameter]]) -> None:
    """Undo `freeze_`: requires_grad=True again on the parameters it froze."""
    for _, p in frozen:
        p.requires_grad_(True)
