"""Where a parameter sits in the stack of decoder layers: an int (a decoder layer), FIRST (embeddings and
anything before the layers) or LAST (final norm, lm_head). Methods that treat layers differently (HMA,
submodule_alpha) get this position on their TensorJob; `forgetlab.core.anatomy.Anatomy` answers for the
architectures it knows, the parameter name (`layers.<i>`, `h.<i>`) for the others.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

from transformers.conversion_mapping import get_checkpoint_conversion_mapping

from forgetlab.core.anatomy import Anatomy
from forgetlab.core.layouts import text_config

FIRST = "first"
LAST = "last"
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks)\.(\d+)\.")
_LAST_RE = re.compile(r"(?:^|\.)(?:lm_head|embed_out|norm|ln_f|final_layernorm|final_layer_norm|final_norm)"
                      r"(?:\.|$)")
_OUTPUT_EMBEDDING_RE = re.compile(r"(?:^|\.)(?:lm_head|embed_out)\.weight$")


def layer_from_name(name: str):
    """The layer position of a parameter from its name alone: the decoder layer index (`layers.<i>`, `h.<i>`),
    LAST for the final norm and head, FIRST for anything else."""
    m = _LAYER_RE.search(name)
    if m:
        return int(m.group(1))
    if _LAST_RE.search(name):
        return LAST
    return FIRST


def layer_locator(config=None):
    """A function name → layer position: an int (decoder layer), FIRST (embeddings, anything before
    the layers) or LAST (final norm, lm_head). Uses forgetlab.core.anatomy for the config's architecture when it
    knows it, else the parameter name (`layers.<i>`, `h.<i>`). With tied embeddings
    (config.tie_word_embeddings) lm_head is the embedding matrix and gets its position, FIRST: a state dict
    holds both names, and loading it writes lm_head last, so lm_head's α would otherwise become the
    embedding's."""
    tied = bool(getattr(config, "tie_word_embeddings", False)) if config is not None else False
    anatomy = None
    if config is not None:
        try:
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
        return layer_from_name(name)

    return locate


def layer_of(name: str, config=None):
    """Layer position of one parameter (see `layer_locator`)."""
    return layer_locator(config)(name)


def num_layers_of(config, names: Sequence[str] = ()) -> int:
    """Number of decoder layers: the config's num_hidden_layers / n_layer, else 1 + the largest index seen."""
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        v = getattr(config, key, None) if config is not None else None
        if isinstance(v, int) and v > 0:
            return v
    idx = [i for i in (layer_from_name(n) for n in names) if isinstance(i, int)]
    return (max(idx) + 1) if idx else 1


def filter_names(config=None) -> Callable[[str], tuple[str, ...]]:
    """A function name → the names a parameter filter is matched against (forgetlab.merge.settings.evaluate):
    the checkpoint's name and, where transformers ≥ 5 renames the tensor on loading (its checkpoint conversion:
    Mixtral's `block_sparse_moe.*` → `mlp.*`, per-expert tensors → fused `experts.gate_up_proj` / `down_proj`),
    the loaded model's name, which is what mergekit 0.1.5 matches its filters against
    (docs/methods.md#architectures)."""
    model_type = getattr(text_config(config), "model_type", None) if config is not None else None
    transforms = list(get_checkpoint_conversion_mapping(model_type) or []) if model_type else []

    def names(name: str) -> tuple[str, ...]:
        loaded = name
        for tr in transforms:
            renamed, pattern = tr.rename_source_key(loaded)
            if pattern is not None:
                loaded = renamed
        return (name,) if loaded == name else (name, loaded)

    return names
