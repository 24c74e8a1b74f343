"""A model's submodules run on their own: inputs captured once at every decoder layer (with the keyword
arguments the layer received: rotary embeddings, attention mask), each layer / attention / MLP / head re-run on
those inputs, and the attention and MLP computed from their input projections (which are affine in the weights).

What the linearity analysis (`forgetlab.analysis.linearity`), the t-SNE features (`forgetlab.analysis.features`)
and submodule-linearity merging (`forgetlab.merge.methods.slwm`) stand on. A "working copy" here is anything
with `.module(path)` giving the module whose weights are being set (`forgetlab.merge.working_copy.WorkingCopy`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import numpy as np
import torch

from forgetlab.core.anatomy import Anatomy
from forgetlab.core.data import IGNORE, encode_pairs
from forgetlab.core.errors import IncompatibleModelsError, ParameterError, ProbeDataError


CAPTURES = ("finetuned", "base")
SUBMODULE_LEVELS = ("layer", "attn", "mlp", "head")


@dataclass
class Samples:
    """Encoded probe samples: right-padded token ids and the true length of each sequence, plus where the
    answer starts (for answer pooling in `forgetlab.analysis.features`)."""

    input_ids: torch.Tensor
    lengths: torch.Tensor
    answer_starts: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def chunk(self, start: int, stop: int) -> "Samples":
        """Samples ``start..stop`` with padding trimmed to the longest of them."""
        lengths = self.lengths[start:stop]
        width = int(lengths.max())
        return Samples(self.input_ids[start:stop, :width], lengths, self.answer_starts[start:stop])

    def mask(self) -> torch.Tensor:
        """Boolean ``[batch, seq]``: True on real tokens."""
        pos = torch.arange(self.input_ids.shape[1])
        return pos[None, :] < self.lengths[:, None]


def encode_samples(tokenizer, pairs: Sequence, max_length: int = 128, template: Optional[str] = None,
                   pad_id: int = 0) -> Samples:
    """Encode task pairs as prompt + answer (+ EOS) with `forgetlab.core.data.encode_pairs`, right-padded.

    Right padding under causal attention leaves every real token's hidden states exactly as without padding,
    so no attention mask is needed and padded positions are simply left out of every norm.
    """
    examples = encode_pairs(tokenizer, list(pairs), max_length=max_length, template=template)
    n = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    lengths = torch.zeros(len(examples), dtype=torch.long)
    starts = torch.zeros(len(examples), dtype=torch.long)
    for i, e in enumerate(examples):
        ids[i, : len(e.input_ids)] = torch.tensor(e.input_ids)
        lengths[i] = len(e.input_ids)
        starts[i] = next((j for j, lab in enumerate(e.labels) if lab != IGNORE), len(e.labels) - 1)
    return Samples(ids, lengths, starts)


def select_pairs(pairs: Sequence, samples: Optional[int], task: str, seed: Optional[int] = None) -> list:
    """The ``samples`` probe pairs of a task used by an analysis (all when None), with messages for empty / too
    few: the first ``samples`` when ``seed`` is None; otherwise ``samples`` pairs drawn at random without
    replacement with numpy's generator seeded by ``seed``, kept in the task's order (so a draw of all pairs is
    the first-N selection itself; docs/methods.md#probe-draws)."""
    pairs = list(pairs or [])
    if not pairs:
        raise ProbeDataError(f"Task {task!r} has no probe samples: add a probe file for it to the pool.")
    if samples is None:
        return pairs
    if not isinstance(samples, int) or samples < 1:
        raise ParameterError(f"samples must be a positive integer; got {samples!r}.")
    if samples > len(pairs):
        raise ProbeDataError(
            f"Task {task!r} has only {len(pairs)} probe samples but samples={samples} was asked; pass "
            f"samples ≤ {len(pairs)} or add probe samples.")
    if seed is None:
        return pairs[:samples]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ParameterError(f"seed must be a whole number ≥ 0 (or None for the first {samples} pairs); got "
                             f"{seed!r}.")
    chosen = np.sort(np.random.default_rng(seed).choice(len(pairs), size=samples, replace=False))
    return [pairs[int(i)] for i in chosen]


def check_same_structure(base, other, other_name: str = "fine-tuned") -> None:
    """Raise IncompatibleModelsError unless two models have the same parameter names and shapes and the same
    anatomy (layers, heads, kv heads, head size)."""
    a = dict(base.named_parameters(remove_duplicate=False))
    b = dict(other.named_parameters(remove_duplicate=False))
    if set(a) != set(b):
        only_a = sorted(set(a) - set(b))[:3]
        only_b = sorted(set(b) - set(a))[:3]
        raise IncompatibleModelsError(
            f"The base and {other_name} models have different submodule structure: only in base: "
            f"{only_a or '-'}; only in {other_name}: {only_b or '-'}. Use models of one architecture.")
    for name, p in a.items():
        if tuple(p.shape) != tuple(b[name].shape):
            raise IncompatibleModelsError(
                f"Tensor {name} has shape {tuple(p.shape)} in the base and {tuple(b[name].shape)} in "
                f"{other_name}; the models' structures differ.")
    cfg_a, cfg_b = getattr(base, "config", None), getattr(other, "config", None)
    if cfg_a is not None and cfg_b is not None:
        try:
            ana, anb = Anatomy.from_config(cfg_a), Anatomy.from_config(cfg_b)
        except ParameterError:
            return
        if not ana.same_structure(anb):
            raise IncompatibleModelsError(
                f"The base ({ana.describe()}) and {other_name} ({anb.describe()}) differ in structure.")


def param_dict(model) -> dict[str, torch.Tensor]:
    """Detached parameters of a model by name (tied parameters under every name)."""
    return {n: p.detach() for n, p in model.named_parameters(remove_duplicate=False)}


def first_tensor(out):
    """The first tensor of a module's output (modules return a tensor or a tuple whose first item is one)."""
    return out[0] if isinstance(out, (tuple, list)) else out


@dataclass
class LayerInputs:
    """What layer i's modules received during the capture pass: positional args and keyword arguments
    (rotary position embeddings, attention mask, …) of the layer, of its attention and of its MLP."""

    layer_args: tuple = ()
    layer_kwargs: dict = field(default_factory=dict)
    attn_args: tuple = ()
    attn_kwargs: dict = field(default_factory=dict)
    mlp_args: tuple = ()
    mlp_kwargs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)

    def attn_input(self) -> torch.Tensor:
        """The hidden states that entered the attention module."""
        return self.attn_args[0] if self.attn_args else self.attn_kwargs["hidden_states"]

    def mlp_input(self) -> torch.Tensor:
        """The hidden states that entered the MLP."""
        return self.mlp_args[0] if self.mlp_args else self.mlp_kwargs["hidden_states"]


def _decoder(work_model, anatomy: Optional[Anatomy]):
    if anatomy is None:
        return None
    path = anatomy.prefix.rstrip(".")
    return dict(work_model.named_modules()).get(path) if path else work_model


@torch.no_grad()
def last_hidden(model, anatomy: Optional[Anatomy], input_ids: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden state (after its final norm) for ``input_ids``: the `model`-level features."""
    dec = _decoder(model, anatomy)
    if dec is not None:
        return dec(input_ids=input_ids, use_cache=False).last_hidden_state
    out = model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1]


def strip_kwargs(kwargs: dict) -> dict:
    """The kwargs a module received, without any KV cache (re-runs must not append to one)."""
    kw = dict(kwargs)
    for k in ("cache", "past_key_values", "layer_past"):
        if k in kw:
            kw[k] = None
    if "use_cache" in kw:
        kw["use_cache"] = False
    return kw


@torch.no_grad()
def capture_inputs(model, anatomy: Anatomy, input_ids: torch.Tensor, layers: Iterable[int],
                   want_last_hidden: bool = False,
                   want_outputs: bool = False) -> tuple[dict[int, LayerInputs], Optional[torch.Tensor]]:
    """One forward pass with pre-hooks on each requested layer, its attention and its MLP: returns their
    inputs (args + kwargs) per layer (and their outputs in ``.outputs`` when asked), and the last hidden
    state when asked."""
    mods = dict(model.named_modules())
    got: dict[int, LayerInputs] = {i: LayerInputs() for i in layers}
    handles = []

    def hook(i, slot):
        def pre(mod, args, kwargs):
            setattr(got[i], f"{slot}_args", tuple(args))
            setattr(got[i], f"{slot}_kwargs", strip_kwargs(kwargs))
        return pre

    def out_hook(i, slot):
        def post(mod, args, out):
            got[i].outputs[slot] = first_tensor(out)
        return post

    try:
        for i in got:
            for slot, path in (("layer", anatomy.layer_path(i)), ("attn", anatomy.attn_path(i)),
                               ("mlp", anatomy.mlp_path(i))):
                handles.append(mods[path].register_forward_pre_hook(hook(i, slot), with_kwargs=True))
                if want_outputs:
                    handles.append(mods[path].register_forward_hook(out_hook(i, slot)))
        hidden = last_hidden(model, anatomy, input_ids)
    finally:
        for h in handles:
            h.remove()
    return got, (hidden if want_last_hidden else None)


def _apply_rotary(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@torch.no_grad()
def attention_projections(anatomy: Anatomy, attn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The raw query, key and value projections ``[batch, seq, width]`` of an attention module on input ``x``
    (before q/k norms and rotary embeddings). They are affine in the module's parameters, so for parameters
    θ0 + α·τ they equal lerp(projections at θ0, projections at θ0 + τ, α)."""
    if anatomy.family == "llama":
        return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    return tuple(attn.c_attn(x).split(anatomy.hidden_size, dim=2))


def attention_is_affine(attn) -> bool:
    """True when the step from raw projections to per-head queries/keys/values (`split_heads`) is linear —
    reshapes and rotary embeddings — and False with q/k norms (Qwen3), which are not."""
    return getattr(attn, "q_norm", None) is None and getattr(attn, "k_norm", None) is None


@torch.no_grad()
def split_heads(anatomy: Anatomy, attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-head queries, keys and values ``[batch, heads, seq, head_dim]`` from raw projections: q/k norms
    (Qwen3), rotary embeddings from the captured ``position_embeddings``, key/value heads repeated per group."""
    b, s, _ = q.shape
    nh, nkv, d = anatomy.num_heads, anatomy.num_kv_heads, anatomy.head_dim
    if anatomy.family != "llama":
        return tuple(t.view(b, s, nh, d).transpose(1, 2) for t in (q, k, v))
    q, k, v = q.view(b, s, nh, d), k.view(b, s, nkv, d), v.view(b, s, nkv, d)
    if getattr(attn, "q_norm", None) is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    pe = kwargs.get("position_embeddings")
    if pe is not None:
        cos, sin = pe
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
    if nkv != nh:
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
    return q, k, v


@torch.no_grad()
def attend(anatomy: Anatomy, attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict,
           per_head: bool = True) -> torch.Tensor:
    """softmax(q·kᵀ·scale + mask)·v (causal unless the captured ``attention_mask`` says otherwise) through the
    module's output projection: per head ``[batch, heads, seq, hidden]`` (no bias) when ``per_head``, else the
    module's output ``[batch, seq, hidden]`` (bias included)."""
    b, nh, s, d = q.shape
    hid = anatomy.hidden_size
    mask = kwargs.get("attention_mask")
    scale = getattr(attn, "scaling", None) or 1.0 / math.sqrt(d)
    if isinstance(mask, torch.Tensor):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[..., :s, :s], scale=scale)
    else:
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    proj = attn.o_proj if anatomy.family == "llama" else attn.c_proj
    if not per_head:
        return proj(o.transpose(1, 2).reshape(b, s, nh * d))
    if anatomy.family == "llama":
        return torch.einsum("bnsd,hnd->bnsh", o, proj.weight.view(hid, nh, d))
    return torch.einsum("bnsd,ndh->bnsh", o, proj.weight.view(nh, d, hid))


@torch.no_grad()
def attention_from_projections(anatomy: Anatomy, attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               kwargs: dict, per_head: bool = True) -> torch.Tensor:
    """Attention output from raw projections (see `attention_projections`): `split_heads`, then `attend`."""
    return attend(anatomy, attn, *split_heads(anatomy, attn, q, k, v, kwargs), kwargs, per_head=per_head)


@torch.no_grad()
def head_outputs(anatomy: Anatomy, attn, x: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """Per-head contributions ``[batch, heads, seq, hidden]`` of an attention module on input ``x``.

    Head h: softmax(q_h·k_gᵀ·scale + mask)·v_g (g = its key/value head) times head h's columns of o_proj
    (Llama family, rotary embeddings from the captured ``position_embeddings``; Qwen3's q/k norms applied) or
    head h's rows of ``attn.c_proj`` (GPT-2). Summed over heads, plus the output-projection bias, they give the
    module's output; `attention_bias` returns that bias.
    """
    return attention_from_projections(anatomy, attn, *attention_projections(anatomy, attn, x), kwargs)


@torch.no_grad()
def mlp_projections(anatomy: Anatomy, mlp, x: torch.Tensor) -> Optional[tuple[torch.Tensor, ...]]:
    """The MLP's input projections on ``x`` (Llama family: gate and up; GPT-2: c_fc), affine in its parameters
    like `attention_projections`; None for an MLP of another shape (it is then re-run whole)."""
    if anatomy.family == "llama":
        if all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return mlp.gate_proj(x), mlp.up_proj(x)
        return None
    if all(hasattr(mlp, n) for n in ("c_fc", "c_proj", "act")):
        return (mlp.c_fc(x),)
    return None


@torch.no_grad()
def mlp_from_projections(anatomy: Anatomy, mlp, pre: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The MLP's output from its input projections (see `mlp_projections`) with its own activation and
    output projection."""
    if anatomy.family == "llama":
        gate, up = pre
        return mlp.down_proj(mlp.act_fn(gate) * up)
    return mlp.dropout(mlp.c_proj(mlp.act(pre[0])))


def attention_bias(anatomy: Anatomy, attn) -> Optional[torch.Tensor]:
    """The output projection's bias (shared by all heads), or None."""
    proj = attn.o_proj if anatomy.family == "llama" else attn.c_proj
    return getattr(proj, "bias", None)


@torch.no_grad()
def run_submodule(work, anatomy: Anatomy, layer: int, level: str, cap: LayerInputs) -> torch.Tensor:
    """Re-run one submodule (``layer``, ``attn``, ``mlp``) of the working copy on its cached inputs; for
    ``head`` return all heads' contributions ``[batch, heads, seq, hidden]``."""
    if level == "layer":
        return first_tensor(work.module(anatomy.layer_path(layer))(*cap.layer_args, **cap.layer_kwargs))
    if level == "attn":
        return first_tensor(work.module(anatomy.attn_path(layer))(*cap.attn_args, **cap.attn_kwargs))
    if level == "mlp":
        return first_tensor(work.module(anatomy.mlp_path(layer))(*cap.mlp_args, **cap.mlp_kwargs))
    if level == "head":
        return head_outputs(anatomy, work.module(anatomy.attn_path(layer)), cap.attn_input(), cap.attn_kwargs)
    raise ParameterError(f"Unknown submodule level {level!r}; choose one of {', '.join(SUBMODULE_LEVELS)}.")


def check_head_decomposition(work, anatomy: Anatomy, layer: int, cap: LayerInputs,
                             heads: Optional[torch.Tensor] = None, tol: float = 1e-4) -> None:
    """Raise ParameterError unless Σ_h head contributions + output bias equals the attention module's own
    output on the cached input (it would not for an attention variant forgetlab does not model)."""
    heads = run_submodule(work, anatomy, layer, "head", cap) if heads is None else heads
    total = heads.sum(1)
    bias = attention_bias(anatomy, work.module(anatomy.attn_path(layer)))
    if bias is not None:
        total = total + bias
    ref = run_submodule(work, anatomy, layer, "attn", cap)
    err = float((total - ref).abs().max())
    scale = float(ref.abs().max()) + 1e-12
    if not err <= tol * max(1.0, scale):
        raise ParameterError(
            f"The 'head' level is unavailable for this attention variant ({anatomy.model_type}): per-head parts "
            f"do not add up to layer {layer}'s attention output (max error {err:.2e}). Use the layer, attn and mlp "
            f"levels.")
