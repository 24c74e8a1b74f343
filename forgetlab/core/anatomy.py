"""Which parameter and module belongs to which level: layer i, its attention, its MLP, one attention head.

Two families are understood, found from the config's `model_type` and the model's module names (never from a
hard-coded model size):

- ``"llama"`` (Llama, Qwen2, Qwen3, Mistral, SmolLM): ``model.layers.{i}.self_attn.{q,k,v,o}_proj``,
  ``model.layers.{i}.mlp.{gate,up,down}_proj``, ``input_layernorm`` / ``post_attention_layernorm``,
  ``model.embed_tokens``, ``model.norm``, ``lm_head``. Linear weights are ``(out, in)``.
- ``"gpt2"``: ``transformer.h.{i}.attn.{c_attn,c_proj}``, ``transformer.h.{i}.mlp.{c_fc,c_proj}``, ``ln_1`` /
  ``ln_2``, ``transformer.wte`` / ``wpe`` / ``ln_f``, ``lm_head``. Weights are Conv1D ``(in, out)``; ``c_attn``
  fuses q, k and v along its output columns.

Head slicing (docs/methods.md#submodule-levels): head h owns its rows of the q/k/v projections and its columns
of the output projection. Under grouped-query attention query head h reads key/value head
``h // (num_heads // num_kv_heads)``. For GPT-2's Conv1D weights the same parts are columns of ``c_attn`` (q at
offset 0, k at ``hidden``, v at ``2·hidden``) and rows of ``attn.c_proj``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional

from forgetlab.core.errors import ParameterError

LEVELS = ("model", "layer", "attn", "mlp", "head")
"""Every level of docs/methods.md#submodule-levels, coarsest first."""

_LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "smollm", "smollm3")
_GPT2_TYPES = ("gpt2",)
SUPPORTED = {"llama": _LLAMA_TYPES, "gpt2": _GPT2_TYPES}
"""Architecture families and the config ``model_type`` values that belong to each."""


def supported_text() -> str:
    """A one-line description of the supported families, for error messages."""
    return "; ".join(f"{fam} ({', '.join(types)})" for fam, types in SUPPORTED.items())


class UnsupportedArchitectureError(ParameterError):
    """The model's architecture is none of the families forgetlab's anatomy understands."""


@dataclass(frozen=True)
class ParamRole:
    """Where one named parameter sits: its decoder layer (None outside the stack), its module
    (``"attn"``, ``"mlp"``, ``"norm"`` inside a layer; None for embeddings, final norm and lm_head), its part
    (the module's own attribute name, e.g. ``"q_proj"``, ``"c_attn"``, ``"input_layernorm"``, ``"embed_tokens"``)
    and its kind (``"weight"`` or ``"bias"``)."""

    name: str
    layer: Optional[int]
    module: Optional[str]
    part: str
    kind: str = "weight"


@dataclass(frozen=True)
class TensorSlice:
    """A contiguous block ``[start, stop)`` of one named tensor along dimension ``dim``."""

    name: str
    dim: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        """Number of indices along ``dim``."""
        return self.stop - self.start

    def index(self, ndim: int) -> tuple:
        """An indexing tuple selecting this slice in a tensor with ``ndim`` dimensions."""
        idx = [slice(None)] * ndim
        idx[self.dim] = slice(self.start, self.stop)
        return tuple(idx)

    def take(self, tensor):
        """The slice of ``tensor`` (a view, not a copy)."""
        return tensor.narrow(self.dim, self.start, self.size)


def _cfg(config, *names, default=None):
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return default


def family_of(config) -> str:
    """The anatomy family (``"llama"`` or ``"gpt2"``) of a transformers config, from its ``model_type``."""
    model_type = str(getattr(config, "model_type", "") or "").lower()
    for fam, types in SUPPORTED.items():
        if model_type in types:
            return fam
    archs = ", ".join(getattr(config, "architectures", None) or []) or "unknown"
    raise UnsupportedArchitectureError(
        f"Architecture model_type={model_type or '?'} (architectures: {archs}) is not supported by forgetlab's "
        f"anatomy, so per-layer, attention, MLP and head levels are unavailable for it. Supported families: "
        f"{supported_text()}. Use the 'model' level only, or convert the model to one of these families."
    )


class Anatomy:
    """The layer / attention / MLP / head map of one architecture (see the module docstring).

    Build with `Anatomy.from_config(config)` or `Anatomy.from_model(model)`; the latter also learns the module
    prefix (e.g. a bare ``LlamaModel`` has ``layers.{i}`` instead of ``model.layers.{i}``) and the real
    parameter names (which biases exist).
    """

    def __init__(self, family: str, num_layers: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 hidden_size: int, prefix: str, names: Iterable[str], model_type: str = ""):
        self.family = family
        self.num_layers = int(num_layers)
        self.num_heads = int(num_heads)
        self.num_kv_heads = int(num_kv_heads)
        self.head_dim = int(head_dim)
        self.hidden_size = int(hidden_size)
        self.prefix = prefix
        self.model_type = model_type
        self.names = tuple(names)
        if self.num_heads % self.num_kv_heads:
            raise ParameterError(
                f"num_attention_heads={self.num_heads} is not a multiple of num_key_value_heads="
                f"{self.num_kv_heads}; the config is inconsistent.")
        lay = re.escape(self.prefix) + (r"layers" if family == "llama" else r"h")
        self._layer_re = re.compile(r"^" + lay + r"\.(\d+)\.(.+)\.(weight|bias)$")
        self._roles = {n: self._compute_role(n) for n in self.names}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, config, names: Optional[Iterable[str]] = None) -> "Anatomy":
        """Anatomy of a ``*ForCausalLM`` model built from ``config`` (a transformers PretrainedConfig).

        ``names`` (e.g. a checkpoint's tensor names) replaces the parameter list derived from the config.
        Raises `UnsupportedArchitectureError` (a ForgetlabError) for an unknown ``model_type``.
        """
        family = family_of(config)
        num_layers = _cfg(config, "num_hidden_layers", "n_layer")
        num_heads = _cfg(config, "num_attention_heads", "n_head")
        hidden = _cfg(config, "hidden_size", "n_embd")
        if num_layers is None or num_heads is None or hidden is None:
            raise ParameterError(
                "The config lacks num_hidden_layers / num_attention_heads / hidden_size; pass a complete "
                "transformers config (config.json of the model).")
        num_kv = _cfg(config, "num_key_value_heads", default=num_heads) if family == "llama" else num_heads
        head_dim = _cfg(config, "head_dim") if family == "llama" else None
        head_dim = head_dim or hidden // num_heads
        prefix = "model." if family == "llama" else "transformer."
        anat = cls(family, num_layers, num_heads, num_kv, head_dim, hidden, prefix, (),
                   model_type=str(config.model_type))
        anat.names = tuple(names) if names is not None else anat._expected_names(config)
        anat._roles = {n: anat._compute_role(n) for n in anat.names}
        return anat

    @classmethod
    def from_model(cls, model) -> "Anatomy":
        """Anatomy of a loaded transformers model, with its real parameter names and module prefix."""
        config = getattr(model, "config", None)
        if config is None:
            raise ParameterError("This object has no .config; pass a transformers PreTrainedModel.")
        base = cls.from_config(config, names=[])
        want = "layers" if base.family == "llama" else "h"
        prefix = None
        for mname, _ in model.named_modules():
            if mname == want or mname.endswith("." + want):
                prefix = mname[: -len(want)]
                break
        if prefix is None:
            raise UnsupportedArchitectureError(
                f"model_type={config.model_type} claims the {base.family} family but the model has no "
                f"'{want}' module list; supported families: {supported_text()}.")
        names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
        return cls(base.family, base.num_layers, base.num_heads, base.num_kv_heads, base.head_dim,
                   base.hidden_size, prefix, names, model_type=base.model_type)

    def _expected_names(self, config) -> tuple[str, ...]:
        p = self.prefix
        out: list[str] = []
        if self.family == "llama":
            qkv_bias = bool(getattr(config, "attention_bias", False)) or self.model_type == "qwen2"
            o_bias = bool(getattr(config, "attention_bias", False))
            mlp_bias = bool(getattr(config, "mlp_bias", False))
            out.append(f"{p}embed_tokens.weight")
            for i in range(self.num_layers):
                lp = f"{p}layers.{i}."
                for part in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    out.append(f"{lp}self_attn.{part}.weight")
                    if (part != "o_proj" and qkv_bias) or (part == "o_proj" and o_bias):
                        out.append(f"{lp}self_attn.{part}.bias")
                if self.model_type == "qwen3":
                    out += [f"{lp}self_attn.q_norm.weight", f"{lp}self_attn.k_norm.weight"]
                for part in ("gate_proj", "up_proj", "down_proj"):
                    out.append(f"{lp}mlp.{part}.weight")
                    if mlp_bias:
                        out.append(f"{lp}mlp.{part}.bias")
                out += [f"{lp}input_layernorm.weight", f"{lp}post_attention_layernorm.weight"]
            out += [f"{p}norm.weight", "lm_head.weight"]
        else:
            out += [f"{p}wte.weight", f"{p}wpe.weight"]
            for i in range(self.num_layers):
                lp = f"{p}h.{i}."
                for sub in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
                    out += [f"{lp}{sub}.weight", f"{lp}{sub}.bias"]
            out += [f"{p}ln_f.weight", f"{p}ln_f.bias", "lm_head.weight"]
        return tuple(out)

    # ------------------------------------------------------------------ roles
    def _compute_role(self, name: str) -> ParamRole:
        m = self._layer_re.match(name)
        if m is None:
            kind = "bias" if name.endswith(".bias") else "weight"
            stem = name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name
            part = stem.rsplit(".", 1)[-1]
            return ParamRole(name, None, None, part, kind)
        layer, path, kind = int(m.group(1)), m.group(2), m.group(3)
        head, _, part = path.partition(".")
        if self.family == "llama":
            module = {"self_attn": "attn", "mlp": "mlp"}.get(head)
            if module is None:
                module = "norm" if "norm" in head else None
                part = head
        else:
            module = {"attn": "attn", "mlp": "mlp"}.get(head)
            if module is None:
                module = "norm" if head.startswith("ln") else None
                part = head
        return ParamRole(name, layer, module, part or head, kind)

    def role(self, param_name: str) -> ParamRole:
        """The `ParamRole` of a parameter name (layer, module, part, kind), for any name of this family."""
        r = self._roles.get(param_name)
        return r if r is not None else self._compute_role(param_name)

    # ------------------------------------------------------------------ module paths
    def _check_layer(self, i: int) -> int:
        if not isinstance(i, int) or not (0 <= i < self.num_layers):
            raise ParameterError(f"Layer {i!r} does not exist: this model has layers 0..{self.num_layers - 1}.")
        return i

    def _check_head(self, h: int) -> int:
        if not isinstance(h, int) or not (0 <= h < self.num_heads):
            raise ParameterError(f"Head {h!r} does not exist: this model has heads 0..{self.num_heads - 1}.")
        return h

    def layer_path(self, i: int) -> str:
        """Module path of decoder layer i (e.g. ``model.layers.3`` or ``transformer.h.3``)."""
        self._check_layer(i)
        return f"{self.prefix}{'layers' if self.family == 'llama' else 'h'}.{i}"

    def attn_path(self, i: int) -> str:
        """Module path of layer i's self-attention."""
        return self.layer_path(i) + (".self_attn" if self.family == "llama" else ".attn")

    def mlp_path(self, i: int) -> str:
        """Module path of layer i's MLP."""
        return self.layer_path(i) + ".mlp"

    def module_path(self, level: str, layer: Optional[int] = None) -> str:
        """Module path for a level: ``model`` → the decoder stack (its last hidden state), else a layer's part.
        The ``head`` level lives inside the attention module, whose path it returns."""
        level = self.check_level(level)
        if level == "model":
            return self.prefix.rstrip(".")
        if level == "layer":
            return self.layer_path(layer)
        if level == "mlp":
            return self.mlp_path(layer)
        return self.attn_path(layer)

    def proj_names(self, layer: int) -> dict[str, str]:
        """The attention projections' module paths of a layer: keys ``q``, ``k``, ``v``, ``o`` for Llama;
        ``qkv`` (fused c_attn) and ``o`` (c_proj) for GPT-2."""
        a = self.attn_path(layer)
        if self.family == "llama":
            return {k: f"{a}.{k}_proj" for k in ("q", "k", "v", "o")}
        return {"qkv": f"{a}.c_attn", "o": f"{a}.c_proj"}

    # ------------------------------------------------------------------ levels
    @property
    def levels(self) -> tuple[str, ...]:
        """Levels available for this architecture (all of LEVELS for both supported families)."""
        return LEVELS

    def check_level(self, level: str) -> str:
        """Return ``level`` if this architecture has it, else raise ParameterError listing the valid ones."""
        if level not in self.levels:
            raise ParameterError(f"Unknown level {level!r}; choose one of {', '.join(self.levels)}.")
        return level

    def kv_head(self, head: int) -> int:
        """The key/value head read by query head ``head`` (grouped-query attention)."""
        self._check_head(head)
        return head // (self.num_heads // self.num_kv_heads)

    def head_slices(self, layer: int, head: int) -> list[TensorSlice]:
        """Head ``head`` of layer ``layer`` as tensor slices: its q rows, its kv group's k and v rows (and the
        matching bias entries), and its columns of o_proj (Llama); its q/k/v columns and bias entries of the fused
        Conv1D ``c_attn`` and its rows of ``attn.c_proj`` (GPT-2). Output-projection biases are shared by all
        heads and belong to no head."""
        self._check_layer(layer)
        self._check_head(head)
        d = self.head_dim
        out: list[TensorSlice] = []
        have = set(self.names)
        if self.family == "llama":
            proj = self.proj_names(layer)
            g = self.kv_head(head)
            for key, idx in (("q", head), ("k", g), ("v", g)):
                out.append(TensorSlice(proj[key] + ".weight", 0, idx * d, (idx + 1) * d))
                if proj[key] + ".bias" in have:
                    out.append(TensorSlice(proj[key] + ".bias", 0, idx * d, (idx + 1) * d))
            out.append(TensorSlice(proj["o"] + ".weight", 1, head * d, (head + 1) * d))
        else:
            proj = self.proj_names(layer)
            hs = self.hidden_size
            for offset in (0, hs, 2 * hs):
                out.append(TensorSlice(proj["qkv"] + ".weight", 1, offset + head * d, offset + (head + 1) * d))
            for offset in (0, hs, 2 * hs):
                out.append(TensorSlice(proj["qkv"] + ".bias", 0, offset + head * d, offset + (head + 1) * d))
            out.append(TensorSlice(proj["o"] + ".weight", 0, head * d, (head + 1) * d))
        if have:
            out = [s for s in out if s.name in have]
        return out

    def params_of(self, level: str, layer: Optional[int] = None, head: Optional[int] = None) -> list[str]:
        """Names of the parameters that belong to a level.

        ``model``: every parameter. ``layer``: everything of decoder layer ``layer`` (norms included; all layers
        when ``layer`` is None). ``attn`` / ``mlp``: that module's parameters of the layer (or of all layers).
        ``head``: the tensors holding head ``head``'s slices (see `head_slices` for the exact rows/columns).
        ``none``: parameters outside every layer (embeddings, final norm, lm_head).
        """
        if level == "none":
            return [n for n in self.names if self.role(n).layer is None]
        level = self.check_level(level)
        if layer is not None:
            self._check_layer(layer)
        if level == "model":
            return list(self.names)
        if level == "head":
            if layer is None or head is None:
                raise ParameterError("The 'head' level needs both layer= and head=.")
            return list(dict.fromkeys(s.name for s in self.head_slices(layer, head)))
        out = []
        for n in self.names:
            r = self.role(n)
            if r.layer is None or (layer is not None and r.layer != layer):
                continue
            if level == "layer" or r.module == level:
                out.append(n)
        return out

    def submodules(self, level: str) -> list[tuple[Optional[int], Optional[int]]]:
        """Every (layer, head) of a level: ``[(None, None)]`` for model, ``(i, None)`` per layer for
        layer/attn/mlp, ``(i, h)`` for head."""
        level = self.check_level(level)
        if level == "model":
            return [(None, None)]
        if level == "head":
            return [(i, h) for i in range(self.num_layers) for h in range(self.num_heads)]
        return [(i, None) for i in range(self.num_layers)]

    def same_structure(self, other: "Anatomy") -> bool:
        """True when both anatomies have the same family, layer count, heads, kv heads, head size and width."""
        key = ("family", "num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size")
        return all(getattr(self, k) == getattr(other, k) for k in key)

    def describe(self) -> str:
        """One line: family, layers, heads (kv heads), head size, width."""
        return (f"{self.family} ({self.model_type}): {self.num_layers} layers, {self.num_heads} heads "
                f"({self.num_kv_heads} kv), head_dim {self.head_dim}, hidden {self.hidden_size}")

    def __repr__(self) -> str:
        return f"Anatomy({self.describe()})"


OUTSIDE_WORDS = {"embed": "the embeddings", "norm": "the final norm", "lm_head": "the output head",
                 "other": "the weights outside the layers", "model": "the whole model"}
MODULE_WORDS = {"attn": "attention", "mlp": "MLP", "norm": "norms"}


def _missing(value) -> bool:
    """None, NaN or pandas' NA (a table's empty layer or head)."""
    if value is None:
        return True
    try:
        return bool(value != value)
    except TypeError:          # pandas.NA: its comparisons are NA too
        return True


def part_words(layer: Optional[int], module: Optional[str], head: Optional[int] = None) -> str:
    """A submodule in plain words, for the sentences that say what a result means: "layer 0's MLP", "layer 2's
    attention head 3", "layer 1" (a whole decoder layer), "the embeddings", "the output head". `layer` None (or
    negative: the tensors outside the layers) names the part by `module` alone."""
    if _missing(layer) or int(layer) < 0:
        return OUTSIDE_WORDS.get(str(module), str(module))
    layer = int(layer)
    if not _missing(head):
        return f"layer {layer}'s attention head {int(head)}"
    if module in (None, "layer"):
        return f"layer {layer}"
    return f"layer {layer}'s {MODULE_WORDS.get(module, module)}"


def plural_part(words: str) -> bool:
    """Whether a `part_words` name is plural ("the embeddings", "the weights outside the layers", "layer 0's
    norms"), so that a sentence's verb agrees with it."""
    return words.startswith(("the embeddings", "the weights")) or words.endswith("norms")


def sentence_start(words: str, singular: str, plural: str, between: str = "") -> str:
    """`words` (a `part_words` name) capitalised as a sentence's subject, then `between`, then the verb that agrees
    with it: ("layer 0's MLP", "buys", "buy", " alone") → "Layer 0's MLP alone buys"; "the embeddings" → "The
    embeddings alone buy"."""
    return f"{words[:1].upper()}{words[1:]}{between} {plural if plural_part(words) else singular}"
