"""How a decoder's weights are laid out, read from the model itself: its config and its module tree.

`discover(model)` walks a transformers causal-LM model (real or built on the ``meta`` device from a config by
`skeleton`) and returns a `Layout`: where the decoder layers are, which child of a layer is the attention and
which the MLP, the attention's projections (separate q/k/v, or one fused matrix and how it is fused), the MLP's
experts and router for a mixture of experts. Nothing here is a per-model-size table: the only per-family facts are
the few fused layouts that a module tree cannot show (`FUSED_QKV`), each documented in
docs/methods.md#architectures.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

import torch
import transformers

from forgetlab.core.errors import ParameterError

FAMILIES = {
    "Llama": ("llama",), "Mistral": ("mistral",), "Qwen2/Qwen3": ("qwen2", "qwen3"),
    "SmolLM3": ("smollm3",), "GPT-2": ("gpt2",),
    "Gemma/Gemma-2/Gemma-3": ("gemma", "gemma2", "gemma3_text"), "Phi-3/Phi-4": ("phi3",),
    "GPT-NeoX/Pythia": ("gpt_neox",), "OLMo/OLMo-2": ("olmo", "olmo2"), "Granite": ("granite",),
    "Mixtral": ("mixtral",), "Qwen2-MoE/Qwen3-MoE": ("qwen2_moe", "qwen3_moe"), "OLMoE": ("olmoe",),
}
"""The families forgetlab is tested on (tests/test_architectures.py), with their config ``model_type`` values
(SmolLM and SmolLM2 checkpoints say ``llama``).
Other decoders whose module tree `discover` can read work too, after a numerical check of their head slices
(`forgetlab.core.anatomy.Anatomy.verify_heads`)."""

TESTED_TYPES = frozenset(t for types in FAMILIES.values() for t in types)

ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")
MLP_NAMES = ("mlp", "block_sparse_moe", "feed_forward", "moe", "ffn")
SEPARATE_QKV = (("q_proj", "k_proj", "v_proj"), ("query", "key", "value"), ("wq", "wk", "wv"))
OUTPUT_NAMES = ("o_proj", "dense", "c_proj", "out_proj", "wo")
FUSED_QKV = {"qkv_proj": "blocks", "c_attn": "blocks", "query_key_value": "per_head"}
"""Fused q/k/v projections and how their output rows are ordered: ``blocks`` = all q rows, then all k rows, then
all v rows (Phi-3, GPT-2's Conv1D columns); ``per_head`` = head by head, q, k and v of one head side by side
(GPT-NeoX's ``query_key_value``, viewed as [heads, 3, head_dim])."""
PER_HEAD_TYPES = ("gpt_neox",)
"""The model types whose ``query_key_value`` is known to be per-head interleaved (another model type with that
name is refused rather than sliced by guess)."""
FUSED_TYPES = {"qkv_proj": ("phi3",), "c_attn": ("gpt2",), "query_key_value": PER_HEAD_TYPES}
"""The model types each fused projection's order is known for. The same name elsewhere is refused rather than
sliced by guess: CodeGen's ``qkv_proj`` holds (q, v, k) per block of heads, GPT-BigCode's ``c_attn`` is a
multi-query Linear, Falcon's ``query_key_value`` groups each kv head's queries before its k and v."""


def supported_text() -> str:
    """The tested families, for messages: "Llama (llama), Mistral (mistral), …"."""
    return ", ".join(f"{name} ({', '.join(types)})" for name, types in FAMILIES.items())


@dataclass(frozen=True)
class AttentionLayout:
    """The attention module of a layer: its name in the layer, its projections' names and how q/k/v are stored.

    ``q``, ``k``, ``v`` name separate projections; otherwise ``qkv`` names one fused projection whose rows
    (columns for ``conv1d``) are ordered as ``fused`` says (see `FUSED_QKV`). ``o`` is the output projection.
    ``norms`` are the q/k norm modules, and ``norm_per_head`` says whether each head owns its channels of their
    weights (OLMo-2's norms span every head) or all heads share one head-sized weight (Qwen3, Gemma-3)."""

    name: str
    o: str
    q: Optional[str] = None
    k: Optional[str] = None
    v: Optional[str] = None
    qkv: Optional[str] = None
    fused: Optional[str] = None
    conv1d: bool = False
    norms: tuple[str, ...] = ()
    norm_per_head: bool = False


@dataclass(frozen=True)
class MlpLayout:
    """The MLP of a layer: its name in the layer and, for a mixture of experts, its experts and router.

    ``experts`` names the experts' container; ``fused_experts`` says whether their weights are 3-D tensors
    ``[experts, …]`` (transformers ≥ 5) rather than a list of per-expert MLPs (``experts.{e}.…``); ``router``
    names the linear map that scores the experts; ``shared`` the always-on expert and its gate (Qwen2-MoE)."""

    name: str
    experts: Optional[str] = None
    num_experts: int = 0
    fused_experts: bool = False
    router: Optional[str] = None
    shared: tuple[str, ...] = ()


@dataclass(frozen=True)
class Layout:
    """Where a decoder's parts are (see the module docstring): the module path of the layer list
    (``model.layers``, ``transformer.h``, ``gpt_neox.layers``), the number of layers, the attention and MLP
    layouts and the attention's sizes."""

    layers: str
    num_layers: int
    attention: AttentionLayout
    mlp: MlpLayout
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    model_type: str

    @property
    def prefix(self) -> str:
        """The decoder stack's path plus a dot (``model.``), or "" for a bare decoder: what precedes the layer
        list's own name."""
        return self.layers.rpartition(".")[0] + "." if "." in self.layers else ""

    @property
    def family(self) -> str:
        """The storage family of the attention: ``llama`` (separate q/k/v, (out, in) weights), ``gpt2`` (fused
        Conv1D), ``phi3`` (fused blocks), ``gpt_neox`` (fused per head)."""
        a = self.attention
        if a.qkv is None:
            return "llama"
        if a.conv1d:
            return "gpt2"
        return "gpt_neox" if a.fused == "per_head" else "phi3"


def _cfg(config, *names, default=None):
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return default


def text_config(config):
    """The text part of a config (a multimodal config's ``text_config``), else the config itself."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


_SKELETONS: dict[str, torch.nn.Module] = {}
_SKELETON_LOCK = threading.Lock()


def skeleton(config) -> torch.nn.Module:
    """The causal-LM model of ``config`` built on the ``meta`` device (no memory, no weights; cached per
    config), so that a layout can be read from a config alone."""
    key = config.to_json_string(use_diff=False)
    with _SKELETON_LOCK:
        model = _SKELETONS.get(key)
        if model is None:
            try:
                with torch.device("meta"):
                    model = transformers.AutoModelForCausalLM.from_config(config)
            except Exception as exc:   # an architecture this transformers does not know
                raise ParameterError(
                    f"transformers cannot build a causal LM of model_type={getattr(config, 'model_type', '?')}: "
                    f"{exc}") from exc
            _SKELETONS[key] = model
    return model


def _linear_like(module) -> bool:
    w = getattr(module, "weight", None)
    return isinstance(w, torch.Tensor) and w.dim() == 2


def _find_layers(model, num_layers: int) -> Optional[str]:
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers and num_layers > 0:
            children = list(module)
            if all(type(c) is type(children[0]) for c in children) and any(
                    getattr(children[0], n, None) is not None for n in ATTENTION_NAMES):
                return name
    return None


def _attention_layout(layer, model_type: str) -> Optional[AttentionLayout]:
    name = next((n for n in ATTENTION_NAMES if isinstance(getattr(layer, n, None), torch.nn.Module)), None)
    if name is None:
        return None
    attn = getattr(layer, name)
    children = dict(attn.named_children())
    o = next((n for n in OUTPUT_NAMES if n in children and _linear_like(children[n])), None)
    if o is None:
        return None
    conv1d = type(children[o]).__name__ == "Conv1D"
    norms = tuple(n for n in ("q_norm", "k_norm") if n in children)
    for q, k, v in SEPARATE_QKV:
        if all(n in children and _linear_like(children[n]) for n in (q, k, v)):
            return AttentionLayout(name, o, q=q, k=k, v=v, conv1d=conv1d, norms=norms)
    for n, how in FUSED_QKV.items():
        if n in children and _linear_like(children[n]):
            if model_type not in FUSED_TYPES[n]:
                return None
            return AttentionLayout(name, o, qkv=n, fused=how, conv1d=conv1d, norms=norms)
    return None


def _mlp_layout(layer) -> Optional[MlpLayout]:
    name = next((n for n in MLP_NAMES if isinstance(getattr(layer, n, None), torch.nn.Module)), None)
    if name is None:
        return None
    mlp = getattr(layer, name)
    experts = getattr(mlp, "experts", None)
    if experts is None:
        return MlpLayout(name)
    if isinstance(experts, torch.nn.ModuleList):
        count, fused = len(experts), False
    else:
        shapes = [p.shape for p in experts.parameters(recurse=False)]
        if not shapes or any(len(s) != 3 for s in shapes) or len({s[0] for s in shapes}) != 1:
            return None
        count, fused = int(shapes[0][0]), True
    router = next((n for n, c in mlp.named_children()
                   if n != "experts" and _linear_like(c) and c.weight.shape[0] == count), None)
    if router is None:
        router = next((n for n, c in mlp.named_children()
                       if n in ("gate", "router") and any(p.dim() == 2 and p.shape[0] == count
                                                          for p in c.parameters())), None)
    shared = tuple(n for n, _ in mlp.named_children() if n.startswith("shared_expert"))
    return MlpLayout(name, "experts", count, fused, router, shared)


def discover(model) -> Layout:
    """The `Layout` of a transformers causal-LM model (see the module docstring). ParameterError naming the
    tested families when the module tree is not one forgetlab can read."""
    config = text_config(getattr(model, "config", None))
    if config is None:
        raise ParameterError("This object has no .config; pass a transformers PreTrainedModel.")
    model_type = str(getattr(config, "model_type", "") or "")
    num_layers = _cfg(config, "num_hidden_layers", "n_layer", "num_layers")
    num_heads = _cfg(config, "num_attention_heads", "n_head")
    hidden = _cfg(config, "hidden_size", "n_embd", "d_model")
    archs = ", ".join(getattr(config, "architectures", None) or []) or "unknown"
    what = f"model_type={model_type or '?'} (architectures: {archs})"
    if num_layers is None or num_heads is None or hidden is None:
        raise ParameterError(f"The config of {what} lacks num_hidden_layers / num_attention_heads / hidden_size; "
                             "pass a complete transformers config (config.json of the model).")
    layers = _find_layers(model, int(num_layers))
    if layers is None:
        raise ParameterError(f"forgetlab finds no list of {num_layers} decoder layers with an attention module in "
                             f"{what}.")
    first = dict(model.named_modules())[layers][0]
    attention = _attention_layout(first, model_type)
    mlp = _mlp_layout(first)
    if attention is None or mlp is None:
        part = "attention projections" if attention is None else "MLP"
        raise ParameterError(f"forgetlab cannot read the {part} of {what}'s layers (module "
                             f"{type(first).__name__}).")
    num_kv = int(_cfg(config, "num_key_value_heads", "num_kv_heads", "multi_query_group_num", default=num_heads))
    head_dim = _cfg(config, "head_dim")
    if head_dim is None:
        head_dim = _cfg(config, "kv_channels", default=int(hidden) // int(num_heads))
    attn = getattr(first, attention.name)
    if attention.norms:
        w = getattr(getattr(attn, attention.norms[0]), "weight", None)
        per_head = w is not None and w.dim() == 1 and int(w.shape[0]) == int(num_heads) * int(head_dim) \
            and int(head_dim) * int(num_heads) != int(head_dim)
        attention = AttentionLayout(**{**attention.__dict__, "norm_per_head": bool(per_head)})
    return Layout(layers, int(num_layers), attention, mlp, int(num_heads), num_kv, int(head_dim), int(hidden),
                  model_type)
