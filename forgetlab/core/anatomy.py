"""Which parameter and module belongs to which level: layer i, its attention, its MLP, one attention head, one
expert of a mixture of experts (docs/methods.md#submodule-levels, docs/methods.md#architectures).

The anatomy is read from the model itself: `forgetlab.core.layouts.discover` walks its module tree (a real model,
or one built on the ``meta`` device from a config) and finds the layer list, the attention and its projections,
the MLP, its experts and router. Parameter roles come from names under that layer list, so they hold for the
model's own names and for a checkpoint's (a Mixtral checkpoint's ``block_sparse_moe.experts.3.w1.weight`` as well
as the loaded model's fused ``mlp.experts.gate_up_proj``).

Head slicing: head h owns its rows of the q/k/v projections and its columns of the output projection. Under
grouped-query attention query head h reads key/value head ``h // (num_heads // num_kv_heads)``. Fused
projections are sliced by their layout (`forgetlab.core.layouts.FUSED_QKV`): Phi-3's ``qkv_proj`` rows are
[all q | all k | all v]; GPT-2's Conv1D ``c_attn`` has the same blocks along its columns and its ``attn.c_proj``
gives rows; GPT-NeoX's ``query_key_value`` rows go head by head, [q_h | k_h | v_h]. Where the q/k norms span every
head (OLMo-2) head h also owns its channels of their weights. Expert e owns index e of the fused 3-D expert
tensors, or the tensors ``experts.{e}.…`` of a checkpoint; the router belongs to the MLP and to no expert.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.core.layouts import (ATTENTION_NAMES, FAMILIES, MLP_NAMES, TESTED_TYPES, Layout, discover,
                                    skeleton, supported_text, text_config)

LEVELS = ("model", "layer", "attn", "mlp", "head", "expert")
"""Every level of docs/methods.md#submodule-levels, coarsest first (``expert`` only for a mixture of experts)."""

DENSE_LEVELS = LEVELS[:-1]
"""The levels every decoder has."""

SUPPORTED = FAMILIES
"""The tested families and their config ``model_type`` values (`forgetlab.core.layouts.FAMILIES`)."""

_EXPERT_RE = re.compile(r"(?:^|\.)experts\.(\d+)\.")


class UnsupportedArchitectureError(ParameterError):
    """The model's module tree is not one forgetlab's anatomy can read."""


def unsupported(config, reason: str) -> UnsupportedArchitectureError:
    """The message for a model whose anatomy cannot be read: the reason, what still works, the tested families
    and what another family would take."""
    config = text_config(config)
    model_type = getattr(config, "model_type", None) or "?"
    return UnsupportedArchitectureError(
        f"{reason.rstrip('.')}. So the layer, attention, MLP, head and expert levels are unavailable for "
        f"model_type={model_type}; use the 'model' level (merges, eval and whole-model jobs work as they are). "
        f"Tested families: {supported_text()}. Another decoder works when each layer holds an attention module with "
        f"q/k/v projections (or a fused qkv) and an output projection, and an MLP; a new fused layout needs its "
        f"slicing in forgetlab/core/layouts.py (docs/methods.md#architectures).")


def family_of(config) -> str:
    """The storage family of a config's attention (``llama``, ``gpt2``, ``phi3`` or ``gpt_neox``; see
    `forgetlab.core.layouts.Layout.family`); UnsupportedArchitectureError for a module tree forgetlab cannot
    read."""
    return Anatomy.from_config(config, names=()).family


@dataclass(frozen=True)
class ParamRole:
    """Where one named parameter sits: its decoder layer (None outside the stack), its module (``"attn"``,
    ``"mlp"``, ``"norm"`` inside a layer; None for embeddings, final norm and lm_head), its part (the path inside
    the module, e.g. ``"q_proj"``, ``"c_attn"``, ``"experts.3.w1"``; a norm's own name), its kind (``"weight"``
    or ``"bias"``) and its expert (a checkpoint's per-expert tensor; None otherwise)."""

    name: str
    layer: Optional[int]
    module: Optional[str]
    part: str
    kind: str = "weight"
    expert: Optional[int] = None


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


class Anatomy:
    """The layer / attention / MLP / head / expert map of one model (see the module docstring).

    Build with `Anatomy.from_model(model)` (the loaded model's own parameter names) or
    `Anatomy.from_config(config, names)` (any names under the same layer list, e.g. a checkpoint's)."""

    def __init__(self, layout: Layout, names: Iterable[str]):
        self.layout = layout
        self.family = layout.family
        self.model_type = layout.model_type
        self.num_layers = layout.num_layers
        self.num_heads = layout.num_heads
        self.num_kv_heads = layout.num_kv_heads
        self.head_dim = layout.head_dim
        self.hidden_size = layout.hidden_size
        self.num_experts = layout.mlp.num_experts
        self.prefix = layout.prefix
        self.names = tuple(names)
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise ParameterError(
                f"num_attention_heads={self.num_heads} is not a multiple of num_key_value_heads="
                f"{self.num_kv_heads}; the config is inconsistent.")
        self._layer_re = re.compile(r"^" + re.escape(layout.layers) + r"\.(\d+)\.(.+)$")
        self._roles = {n: self._compute_role(n) for n in self.names}
        self._have = frozenset(self.names)
        self.head_error: Optional[str] = None   # why the head level is refused (a failed `verify_heads`)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, config, names: Optional[Iterable[str]] = None) -> "Anatomy":
        """Anatomy of the ``*ForCausalLM`` model of ``config`` (a transformers config), its module tree read from
        that model built on the ``meta`` device. ``names`` (e.g. a checkpoint's tensor names) replaces the model's
        parameter names. UnsupportedArchitectureError (a ForgetlabError) when the tree cannot be read."""
        try:
            model = skeleton(config)
        except ParameterError as exc:
            raise unsupported(config, str(exc)) from None
        anat = cls.from_model(model)
        if names is not None:
            anat = cls(anat.layout, names)
        return anat

    @classmethod
    def from_model(cls, model) -> "Anatomy":
        """Anatomy of a loaded transformers model (or a bare decoder), with its real parameter names. A family
        outside the tested ones (`forgetlab.core.layouts.FAMILIES`) has its head slices checked numerically first
        (`verify_heads`)."""
        config = getattr(model, "config", None)
        if config is None:
            raise ParameterError("This object has no .config; pass a transformers PreTrainedModel.")
        try:
            layout = discover(model)
        except ParameterError as exc:
            raise unsupported(config, str(exc)) from None
        anat = cls(layout, [n for n, _ in model.named_parameters(remove_duplicate=False)])
        if layout.model_type not in TESTED_TYPES and not _on_meta(model):
            anat.verify_heads(model)
        return anat

    # ------------------------------------------------------------------ roles
    def _compute_role(self, name: str) -> ParamRole:
        kind = "bias" if name.endswith(".bias") else "weight"
        stem = name[: name.rfind(".")] if name.endswith((".weight", ".bias")) else name
        m = self._layer_re.match(stem)
        if m is None:
            return ParamRole(name, None, None, stem.rsplit(".", 1)[-1], kind)
        layer, path = int(m.group(1)), m.group(2)
        first, _, rest = path.partition(".")
        if first in ATTENTION_NAMES or first == self.layout.attention.name:
            module = "attn"
        elif first in MLP_NAMES or first == self.layout.mlp.name:
            module = "mlp"
        else:
            module = "norm" if ("norm" in first or first.startswith("ln")) else None
            rest = first
        e = _EXPERT_RE.search("." + rest + ".") if module == "mlp" else None
        return ParamRole(name, layer, module, rest or first, kind, int(e.group(1)) if e else None)

    def role(self, param_name: str) -> ParamRole:
        """The `ParamRole` of a parameter name (layer, module, part, kind, expert)."""
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

    def _check_expert(self, e: int) -> int:
        if not self.num_experts:
            raise ParameterError(f"This model ({self.model_type}) has no experts: the 'expert' level is for a "
                                 "mixture of experts (Mixtral, Qwen2-MoE, OLMoE, …).")
        if not isinstance(e, int) or not (0 <= e < self.num_experts):
            raise ParameterError(f"Expert {e!r} does not exist: this model has experts 0..{self.num_experts - 1}.")
        return e

    def layer_path(self, i: int) -> str:
        """Module path of decoder layer i (e.g. ``model.layers.3``, ``transformer.h.3``)."""
        self._check_layer(i)
        return f"{self.layout.layers}.{i}"

    def attn_path(self, i: int) -> str:
        """Module path of layer i's self-attention."""
        return f"{self.layer_path(i)}.{self.layout.attention.name}"

    def mlp_path(self, i: int) -> str:
        """Module path of layer i's MLP (the whole mixture-of-experts block for a MoE)."""
        return f"{self.layer_path(i)}.{self.layout.mlp.name}"

    def experts_path(self, i: int) -> str:
        """Module path of layer i's experts (a MoE only)."""
        self._check_expert(0)
        return f"{self.mlp_path(i)}.{self.layout.mlp.experts}"

    def router_path(self, i: int) -> Optional[str]:
        """Module path of layer i's router (None for a dense model)."""
        r = self.layout.mlp.router
        return f"{self.mlp_path(i)}.{r}" if r else None

    def module_path(self, level: str, layer: Optional[int] = None) -> str:
        """Module path for a level: ``model`` → the decoder stack (its last hidden state), else a layer's part.
        ``head`` lives inside the attention module and ``expert`` inside the experts, whose paths they return."""
        level = self.check_level(level)
        if level == "model":
            return self.prefix.rstrip(".")
        if level == "layer":
            return self.layer_path(layer)
        if level == "mlp":
            return self.mlp_path(layer)
        if level == "expert":
            return self.experts_path(layer)
        return self.attn_path(layer)

    def proj_names(self, layer: int) -> dict[str, str]:
        """The attention projections' module paths of a layer: ``q``, ``k``, ``v`` (separate) or ``qkv`` (fused),
        and ``o``."""
        a, lay = self.attn_path(layer), self.layout.attention
        out = {"qkv": f"{a}.{lay.qkv}"} if lay.qkv else {k: f"{a}.{getattr(lay, k)}" for k in ("q", "k", "v")}
        out["o"] = f"{a}.{lay.o}"
        return out

    # ------------------------------------------------------------------ levels
    @property
    def levels(self) -> tuple[str, ...]:
        """Levels this model has: all of LEVELS for a mixture of experts, the dense ones otherwise."""
        return LEVELS if self.num_experts else DENSE_LEVELS

    def check_level(self, level: str) -> str:
        """Return ``level`` if this model has it, else raise ParameterError listing the valid ones."""
        if level == "expert" and not self.num_experts:
            self._check_expert(0)
        if level == "head" and self.head_error:
            raise UnsupportedArchitectureError(self.head_error)
        if level not in self.levels:
            raise ParameterError(f"Unknown level {level!r}; choose one of {', '.join(self.levels)}.")
        return level

    def kv_head(self, head: int) -> int:
        """The key/value head read by query head ``head`` (grouped-query attention)."""
        self._check_head(head)
        return head // (self.num_heads // self.num_kv_heads)

    def head_slices(self, layer: int, head: int) -> list[TensorSlice]:
        """Head ``head`` of layer ``layer`` as tensor slices: its q rows, its kv group's k and v rows (and the
        matching bias entries), its columns of the output projection, and its channels of q/k norms that span
        every head; fused projections by their layout (module docstring). Output-projection biases and head-sized
        norms are shared by all heads and belong to no head."""
        self._check_layer(layer)
        self._check_head(head)
        self.check_level("head")
        lay, d = self.layout.attention, self.head_dim
        nh, nkv, g = self.num_heads, self.num_kv_heads, self.kv_head(head)
        proj, a = self.proj_names(layer), self.attn_path(layer)
        out: list[TensorSlice] = []
        if lay.qkv is None:
            for key, idx in (("q", head), ("k", g), ("v", g)):
                for kind in ("weight", "bias"):
                    out.append(TensorSlice(f"{proj[key]}.{kind}", 0, idx * d, (idx + 1) * d))
        else:
            if lay.fused == "per_head":
                starts = [head * 3 * d + j * d for j in range(3)]
            else:
                starts = [head * d, nh * d + g * d, nh * d + nkv * d + g * d]
            for kind in ("weight", "bias"):
                dim = 1 if (lay.conv1d and kind == "weight") else 0
                out += [TensorSlice(f"{proj['qkv']}.{kind}", dim, s, s + d) for s in starts]
        out.append(TensorSlice(f"{proj['o']}.weight", 0 if lay.conv1d else 1, head * d, (head + 1) * d))
        if lay.norm_per_head:
            for norm, idx in zip(lay.norms, (head, g)):
                out.append(TensorSlice(f"{a}.{norm}.weight", 0, idx * d, (idx + 1) * d))
        if self._have:
            out = [s for s in out if s.name in self._have]
        return out

    def expert_tensors(self, layer: int, expert: int) -> list[str]:
        """The whole tensors of expert ``expert`` of layer ``layer``: a checkpoint's ``experts.{e}.…``."""
        self._check_layer(layer)
        self._check_expert(expert)
        return [n for n in self.names if self.role(n).layer == layer and self.role(n).expert == expert]

    def expert_slices(self, layer: int, expert: int) -> list[TensorSlice]:
        """Expert ``expert`` of layer ``layer`` as index ``expert`` (dim 0) of every fused 3-D expert tensor."""
        self._check_layer(layer)
        self._check_expert(expert)
        base = self.experts_path(layer) + "."
        return [TensorSlice(n, 0, expert, expert + 1) for n in self.names
                if n.startswith(base) and "." not in n[len(base):] and self.role(n).expert is None]

    def params_of(self, level: str, layer: Optional[int] = None, head: Optional[int] = None) -> list[str]:
        """Names of the parameters that belong to a level.

        ``model``: every parameter. ``layer``: everything of decoder layer ``layer`` (norms included; all layers
        when ``layer`` is None). ``attn`` / ``mlp``: that module's parameters of the layer (or of all layers; the
        MLP of a MoE holds its router and experts). ``head``: the tensors holding head ``head``'s slices (see
        `head_slices`); ``expert``: expert ``head``'s tensors (whole or sliced). ``none``: parameters outside
        every layer (embeddings, final norm, lm_head).
        """
        if level == "none":
            return [n for n in self.names if self.role(n).layer is None]
        level = self.check_level(level)
        if layer is not None:
            self._check_layer(layer)
        if level == "model":
            return list(self.names)
        if level in ("head", "expert"):
            if layer is None or head is None:
                raise ParameterError(f"The {level!r} level needs both layer= and head= (the {level}'s index).")
            if level == "head":
                return list(dict.fromkeys(s.name for s in self.head_slices(layer, head)))
            return self.expert_tensors(layer, head) + [s.name for s in self.expert_slices(layer, head)]
        out = []
        for n in self.names:
            r = self.role(n)
            if r.layer is None or (layer is not None and r.layer != layer):
                continue
            if level == "layer" or r.module == level:
                out.append(n)
        return out

    def submodules(self, level: str) -> list[tuple[Optional[int], Optional[int]]]:
        """Every (layer, index) of a level: ``[(None, None)]`` for model, ``(i, None)`` per layer for
        layer/attn/mlp, ``(i, h)`` for head, ``(i, e)`` for expert."""
        level = self.check_level(level)
        if level == "model":
            return [(None, None)]
        if level == "head":
            return [(i, h) for i in range(self.num_layers) for h in range(self.num_heads)]
        if level == "expert":
            return [(i, e) for i in range(self.num_layers) for e in range(self.num_experts)]
        return [(i, None) for i in range(self.num_layers)]

    # ------------------------------------------------------------------ checks
    @torch.no_grad()
    def verify_heads(self, model, layer: int = 0, tol: float = 1e-6) -> None:
        """Check numerically that `head_slices` are this model's heads: with head h's query rows perturbed, only
        head h's block of the output projection's input may move. When it fails the head level is refused with
        a message (`head_error`); the other levels stay."""
        o = dict(model.named_modules())[self.proj_names(layer)["o"]]
        params = dict(model.named_parameters(remove_duplicate=False))
        h = min(1, self.num_heads - 1)
        q = self.head_slices(layer, h)[0]
        got: dict = {}
        hook = o.register_forward_pre_hook(lambda m, args: got.__setitem__("x", args[0].detach().clone()))
        p = params[q.name]
        old = p.detach().clone()
        try:
            gen = torch.Generator().manual_seed(0)
            ids = torch.randint(0, int(getattr(model.config, "vocab_size", 2) or 2), (1, 6), generator=gen)
            ids = ids.to(p.device)
            model(input_ids=ids, use_cache=False)
            before = got["x"]
            q.take(p.data).add_(torch.randn(q.take(p.data).shape, generator=gen).to(p.device, p.dtype))
            model(input_ids=ids, use_cache=False)
            after = got["x"]
        finally:
            p.data.copy_(old)
            hook.remove()
        moved = (after - before).abs().float().reshape(*before.shape[:-1], -1, self.head_dim).amax(dim=(0, 1, 3))
        others = torch.cat([moved[:h], moved[h + 1:]])
        if not (float(moved[h]) > 0 and (others.numel() == 0 or float(others.max()) <= tol)):
            self.head_error = str(unsupported(model.config, "The head slices forgetlab reads from this model's "
                                                            "attention did not pass a numerical check (changing "
                                                            "one head's query rows moved other heads)")
                                  ).replace("layer, attention, MLP, head and expert levels are", "head level is")

    def same_structure(self, other: "Anatomy") -> bool:
        """True when both anatomies have the same family, layer count, heads, kv heads, head size, width and
        experts."""
        key = ("family", "num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size", "num_experts")
        return all(getattr(self, k) == getattr(other, k) for k in key)

    def describe(self) -> str:
        """One line: model type, layers, heads (kv heads), head size, width, experts."""
        experts = f", {self.num_experts} experts" if self.num_experts else ""
        return (f"{self.model_type}: {self.num_layers} layers, {self.num_heads} heads "
                f"({self.num_kv_heads} kv), head_dim {self.head_dim}, hidden {self.hidden_size}{experts}")

    def __repr__(self) -> str:
        return f"Anatomy({self.describe()})"


def _on_meta(model) -> bool:
    p = next(model.parameters(), None)
    return p is None or p.device.type == "meta"


OUTSIDE_WORDS = {"embed": "the embeddings", "norm": "the final norm", "lm_head": "the output head",
                 "other": "the weights outside the layers", "model": "the whole model"}
MODULE_WORDS = {"attn": "attention", "mlp": "MLP", "norm": "norms", "expert": "experts"}


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
    attention head 3", "layer 1's expert 5" (`module` "expert", its index in `head`), "layer 1" (a whole decoder
    layer), "the embeddings", "the output head". `layer` None (or negative: the tensors outside the layers) names
    the part by `module` alone."""
    if _missing(layer) or int(layer) < 0:
        return OUTSIDE_WORDS.get(str(module), str(module))
    layer = int(layer)
    if module == "expert" and not _missing(head):
        return f"layer {layer}'s expert {int(head)}"
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
