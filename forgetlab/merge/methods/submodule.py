"""`submodule_alpha`: WiSE-FT with one α per submodule (decoder layer, or a layer's attn / mlp / norm), a mask
when every α is 0 or 1 — the merge recipe that a per-submodule attribution map (`forgetlab.analysis.attribution`) turns
into a model.

Formula (docs/methods.md#submodule_alpha; HMA generalised from blocks of layers to submodules): for a
tensor of submodule k,
θk = θ0,k + αk·τk = (1 − αk)·θ0,k + αk·θ1,k. αk is looked up from the most specific key that names the
tensor: ``"<layer>.<module>"`` (module ``attn``, ``mlp`` or ``norm``), then ``"<layer>"`` (the whole decoder
layer), then ``default``. Parameters outside the layers use ``"embed"`` (token/position embeddings, and a
tied lm_head), ``"norm"`` (the final norm) and ``"lm_head"``. α = 0 writes θ0 and α = 1 writes θ1 bit for bit.

The `alphas` parameter is one string, e.g. ``"3.mlp=1, 2=0.5, embed=0"`` (comma or space separated).
"""
from __future__ import annotations

import re
from typing import Mapping

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.core.layouts import ATTENTION_NAMES, MLP_NAMES
from forgetlab.merge.methods.interpolation import wise_ft
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, method


_KEY_RE = re.compile(r"^(?:\d+|\d+\.(?:attn|mlp|norm)|embed|norm|lm_head)$")


_OUTPUT_RE = re.compile(r"(?:^|\.)(?:lm_head|embed_out)\.weight$")


OUTSIDE = ("embed", "norm", "lm_head")


def parse_alphas(text) -> dict[str, float]:
    """`"3.mlp=1, 2=0.5"` (or a mapping) → {"3.mlp": 1.0, "2": 0.5}; every key a submodule key, every α in
    [0, 1]; anything else is a ParameterError that shows the expected form."""
    if isinstance(text, Mapping):
        items = [(str(k), v) for k, v in text.items()]
    else:
        items = []
        for tok in re.split(r"[,\s;]+", str(text or "").strip()):
            if not tok:
                continue
            key, eq, val = tok.partition("=")
            if not eq:
                raise ParameterError(f"submodule_alpha: {tok!r} is not KEY=α; write e.g. \"3.mlp=1, 2.attn=0.5\".")
            items.append((key.strip(), val.strip()))
    out: dict[str, float] = {}
    for key, val in items:
        if not _KEY_RE.match(key):
            raise ParameterError(
                f"submodule_alpha: unknown submodule key {key!r}; use <layer> (e.g. 3), <layer>.attn, "
                "<layer>.mlp, <layer>.norm, embed, norm (the final norm) or lm_head.")
        try:
            a = float(val)
        except (TypeError, ValueError):
            raise ParameterError(f"submodule_alpha: α of {key!r} is {val!r}, not a number in [0, 1].") from None
        if not 0.0 <= a <= 1.0:
            raise ParameterError(f"submodule_alpha: α of {key!r} is {a:g}; give a value in [0, 1].")
        out[key] = a
    return out


def format_alphas(alphas: Mapping[str, float]) -> str:
    """The inverse of `parse_alphas`: {"3.mlp": 1.0} → "3.mlp=1"."""
    return ", ".join(f"{k}={float(v):g}" for k, v in alphas.items())


def module_of(name: str) -> str:
    """A decoder-layer parameter's module from its name: ``attn`` (a path segment in
    `forgetlab.core.layouts.ATTENTION_NAMES`: self_attn, attn, attention, …), ``mlp`` (in `MLP_NAMES`: mlp,
    block_sparse_moe, feed_forward, …; a MoE's router and experts included), else ``norm`` — the anatomy's split
    (`forgetlab.core.anatomy.Anatomy.role`), for the model's names and a checkpoint's."""
    for part in name.split("."):
        if part in ATTENTION_NAMES:
            return "attn"
        if part in MLP_NAMES:
            return "mlp"
    return "norm"


def alpha_of(name: str, layer, alphas: Mapping[str, float], default: float) -> float:
    """α of one tensor: its ``layer.module`` key, its layer key, else `default` (outside the layers: ``embed``
    for everything before the layers, ``lm_head`` for an untied output matrix, ``norm`` for the final norm)."""
    if isinstance(layer, int):
        for key in (f"{layer}.{module_of(name)}", f"{layer}"):
            if key in alphas:
                return alphas[key]
        return default
    if layer == "last":
        key = "lm_head" if _OUTPUT_RE.search(name) else "norm"
    else:
        key = "embed"
    return alphas.get(key, default)


def _check(params: dict, n_models: int) -> None:
    parse_alphas(params.get("alphas", ""))


@method("submodule_alpha", "WiSE-FT with one α per submodule (layer, or a layer's attn/mlp/norm); a mask when "
        "every α is 0 or 1. Made from an attribution map.",
        (ParamSpec("alphas", "str", "", "Per-submodule α: KEY=α, comma separated; KEY is <layer>, "
                   "<layer>.attn, <layer>.mlp, <layer>.norm, embed, norm or lm_head (e.g. \"3.mlp=1, 2=0.5\")."),
         ParamSpec("default", "float", 0.0, "α of every submodule not listed (0: keep the base's weights).",
                   (0.0, 1.0))),
        max_models=1, needs_layers=True, check=_check, formula="θk = θ0,k + αk·τk per submodule k", in_place=False,
        memory=WorkingMemory((2.1, 0)),
        title="one α per submodule", paper="forgetlab's own")
def _submodule_alpha(job: TensorJob) -> torch.Tensor:
    """θk = θ0,k + αk·τk for one tensor: WiSE-FT (`wise_ft`) at the α of the tensor's submodule."""
    alphas = parse_alphas(job.params["alphas"])
    return wise_ft(job.base, job.finetuned[0], alpha_of(job.name, job.layer, alphas, float(job.params["default"])))
