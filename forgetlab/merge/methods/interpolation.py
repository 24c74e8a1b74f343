"""Interpolation family (docs/methods.md#interpolation): linear / model soup, WiSE-FT, and HMA (WiSE-FT with
one α per block of decoder layers). Pure tensor functions; HMA gets each tensor's layer position from the
engine (`forgetlab.merge.layers`)."""
from __future__ import annotations

from typing import Sequence

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.merge.layers import FIRST, LAST
from forgetlab.merge.methods.common import UNIT, check_weight_sum, weights_param
from forgetlab.merge.registry import MergekitSpec, MkParam, ParamSpec, TensorJob, WorkingMemory, method


def linear(tensors: Sequence[torch.Tensor], weights: Sequence[float] | None = None,
           normalize: bool = True) -> torch.Tensor:
    """Linear merge / model soup: θ = Σ wi·θi / Σ wi (without the division when `normalize` is False).

    Weights default to 1. With normalize=True a weight sum of exactly 0 (or not finite) is refused
    (`common.check_weight_sum`: the result would be undefined); any other scale is an average like another.
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
        check_weight_sum(w, "linear", "normalize")
        out.div_(sum(w))
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


def hma(base: torch.Tensor, finetuned: torch.Tensor, alpha: float) -> torch.Tensor:
    """HMA for one tensor: WiSE-FT with the α of the tensor's block (`hma_alpha_for` picks it)."""
    return wise_ft(base, finetuned, alpha)


def _check_linear(params: dict, n: int) -> None:
    if params["normalize"]:
        check_weight_sum(params["weights"], "linear", "normalize")


# mergekit's linear: base_model, if given, is one more input (averaged in); forgetlab's older names (a weight per model)
LINEAR_MERGEKIT = MergekitSpec("linear", base="ignored", params={
    "weight": MkParam("weight", "weights", True, True, 1.0),
    "normalize": MkParam("normalize", "normalize", False, False, True)})


@method("linear", "Model soup: weighted average of the fine-tuned models.",
        (weights_param(), ParamSpec("normalize", "bool", True, "Divide by the sum of the weights.")),
        check=_check_linear, mergekit=LINEAR_MERGEKIT, formula="θ = Σ wi·θi / Σ wi", in_place=False, base_input=False,
        memory=WorkingMemory((2.1, 0)),
        title="weight average", paper="Wortsman et al., Model soups (ICML 2022)")
def _linear(job: TensorJob) -> torch.Tensor:
    return linear(job.finetuned, job.params["weights"], job.params["normalize"])


@method("wise_ft", "WiSE-FT: interpolate the base and one fine-tuned model.",
        (ParamSpec("alpha", "float", 0.5, "α = 0 gives the base, α = 1 the fine-tuned model.", UNIT),),
        max_models=1, formula="θ = (1 − α)·θ0 + α·θ1", in_place=False, memory=WorkingMemory((3.1, 0)),
        title="WiSE-FT", paper="Wortsman et al., Robust fine-tuning of zero-shot models (CVPR 2022)")
def _wise_ft(job: TensorJob) -> torch.Tensor:
    return wise_ft(job.base, job.finetuned[0], job.params["alpha"])


@method("hma", "Heterogeneous model averaging: WiSE-FT with one α per block of layers.",
        (ParamSpec("alphas", "floats", [0.1, 0.2, 0.3], "One α per block of decoder layers, input to "
                   "output (B = number of values); embeddings use the first, final norm/lm_head the last.",
                   UNIT),),
        max_models=1, needs_layers=True, formula="θ = (1 − αb)·θ0 + αb·θ1 for block b", in_place=False,
        memory=WorkingMemory((3.1, 0)),
        title="heterogeneous model averaging", paper="Lin et al., Mitigating the alignment tax of RLHF (EMNLP 2024)")
def _hma(job: TensorJob) -> torch.Tensor:
    alpha = hma_alpha_for(job.layer, job.num_layers, job.params["alphas"])
    return hma(job.base, job.finetuned[0], alpha)
