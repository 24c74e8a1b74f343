"""Interpolation family (METHODS.md): linear / model soup, WiSE-FT, HMA (one α per block of layers).

Pure tensor functions. HMA needs each parameter's layer index: `layer_of(name, config)` asks
`forgetlab.core.anatomy.Anatomy` when it is available and otherwise reads `layers.<i>` / `h.<i>` from the name.
"""
from __future__ import annotations

import re
from typing import Sequence

import torch

from forgetlab.core.errors import ParameterError

FIRST = "first"
LAST = "last"
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks)\.(\d+)\.")
_LAST_RE = re.compile(r"(?:^|\.)(?:lm_head|norm|ln_f|final_layernorm|final_layer_norm)(?:\.|$)")
_OUTPUT_EMBEDDING_RE = re.compile(r"(?:^|\.)(?:lm_head|embed_out)\.weight$")


def linear(tensors: Sequence[torch.Tensor], weights: Sequence[float] | None = None,
           normalize: bool = True) -> torch.Tensor:
    """Linear merge / model soup: θ = Σ wi·θi / Σ wi (without the division when `normalize` is False).

    Weights default to 1. A zero weight sum with normalize=True is refused (the result would be undefined).
    """
    if not tensors:
        raise ParameterError("linear needs at least one tensor.")
    w = [1.0] * len(tensors) if weights is None else [float(x) for x in weights]
    if len(w) != len(tensors):
        raise ParameterError(f"linear got {len(w)} weights for {len(tensors)} models; give one weight per model.")
    out = torch.zeros_like(tensors[0], dtype=torch.float32)
    for t, wi in zip(tensors, w):
        out.add_(t.to(torch.float32), alpha=wi)
    if normalize:
        total = sum(w)
        if abs(total) < 1e-12:
            raise ParameterError("linear weights sum to 0; with normalize on, give weights with a non-zero sum.")
        out.div_(total)
    return out


def wise_ft(base: torch.Tensor, finetuned: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """WiSE-FT: θ(α) = (1 − α)·θ0 + α·θ1 (α = 0 gives the base, α = 1 the fine-tuned tensor)."""
    if alpha == 0:
        return base.clone()
    if alpha == 1:
        return finetuned.clone()
    return base + alpha * (finetuned - base)


def block_of(layer: int, num_layers: int, num_blocks: int) -> int:
    """Block of decoder layer `layer` (0-based) when `num_layers` = L layers are cut into `num_blocks` = B
    contiguous blocks: the depth [0, L] is cut into B equal parts and a layer belongs to the part holding its
    midpoint, b = ⌊(layer + ½)·B / L⌋ (a midpoint exactly on a cut goes to the later block).

    This is the MoFO rebuttal's split of LLaMA-2's 32 layers: 0–10 / 11–20 / 21–31 (11/10/11; numpy's
    array_split gives 11/11/10). Spare layers go to the outer blocks, symmetrically. The rebuttal's other
    example, OpenLLaMA's 26 layers as 1–8 / 9–17 / 18–26 (8/9/9, quoted from the HMA paper), is not
    reproduced: no rule of near-equal cuts yields both (26 and 32 are both 2 mod 3, so such a rule gives
    block sizes that differ by 2/2/2 between them, where 8/9/9 → 11/10/11 differ by 3/1/2); this rule gives
    9/8/9 for 26 (docs/merging.md)."""
    if num_blocks <= 0:
        raise ParameterError("HMA needs at least one α (one per block).")
    if num_layers <= 0:
        return 0
    layer = min(max(int(layer), 0), num_layers - 1)
    return min(num_blocks - 1, ((2 * layer + 1) * num_blocks) // (2 * num_layers))


def hma_alpha_for(role_layer, num_layers: int, alphas: Sequence[float]) -> float:
    """α of HMA for a parameter: its block's α (see `block_of`).

    `role_layer` is the decoder-layer index of the parameter; `None`, "first" or a negative index mean the
    embeddings (first block's α); "last" or an index ≥ num_layers mean the final norm / lm_head (last block).
    """
    alphas = [float(a) for a in alphas]
    if not alphas:
        raise ParameterError("HMA needs alphas, one per block, e.g. [0.1, 0.2, 0.3].")
    if num_layers > 0 and len(alphas) > num_layers:
        raise ParameterError(
            f"HMA got {len(alphas)} α values but the model has {num_layers} decoder layers: every block needs at "
            f"least one layer. Give at most {num_layers} values (one per block of layers, input to output).")
    if role_layer is None or role_layer == FIRST:
        return alphas[0]
    if role_layer == LAST:
        return alphas[-1]
    layer = int(role_layer)
    if layer < 0:
        return alphas[0]
    if layer >= num_layers:
        return alphas[-1]
    return alphas[block_of(layer, num_layers, len(alphas))]


def _layer_from_name(name: str):
    m = _LAYER_RE.search(name)
    if m:
        return int(m.group(1))
    if _LAST_RE.search(name):
        return LAST
    return FIRST


def layer_locator(config=None):
    """A function name → layer position for HMA: an int (decoder layer), FIRST (embeddings, anything before
    the layers) or LAST (final norm, lm_head). Uses forgetlab.core.anatomy for the config's architecture when it
    knows it, else the parameter name (`layers.<i>`, `h.<i>`). With tied embeddings
    (config.tie_word_embeddings) lm_head is the embedding matrix and gets its position, FIRST: a state dict
    holds both names, and loading it writes lm_head last, so lm_head's α would otherwise become the
    embedding's."""
    tied = bool(getattr(config, "tie_word_embeddings", False)) if config is not None else False
    anatomy = None
    if config is not None:
        try:
            from forgetlab.core.anatomy import Anatomy
            anatomy = Anatomy.from_config(config)
        except Exception:  # unknown architecture: the name rule below still applies
            anatomy = None

    def locate(name: str):
        if tied and _OUTPUT_EMBEDDING_RE.search(name):
            return FIRST
        if anatomy is not None:
            try:
                layer = anatomy.role(name).layer
            except Exception:
                layer = None
            if layer is not None:
                return int(layer)
            return LAST if _LAST_RE.search(name) else FIRST
        return _layer_from_name(name)

    return locate


def layer_of(name: str, config=None):
    """Layer position of one parameter for HMA (see `layer_locator`)."""
    return layer_locator(config)(name)


def num_layers_of(config, names: Sequence[str] = ()) -> int:
    """Number of decoder layers: the config's num_hidden_layers / n_layer, else 1 + the largest index seen."""
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        v = getattr(config, key, None) if config is not None else None
        if isinstance(v, int) and v > 0:
            return v
    idx = [i for i in (_layer_from_name(n) for n in names) if isinstance(i, int)]
    return (max(idx) + 1) if idx else 1


def hma(base: torch.Tensor, finetuned: torch.Tensor, alpha: float) -> torch.Tensor:
    """HMA for one tensor: WiSE-FT with the α of the tensor's block (`hma_alpha_for` picks it)."""
    return wise_ft(base, finetuned, alpha)
