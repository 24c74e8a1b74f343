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
    experts_args: tuple = ()
    experts_kwargs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)

    def attn_input(self) -> torch.Tensor:
        """The hidden states that entered the attention module."""
        return self.attn_args[0] if self.attn_args else self.attn_kwargs["hidden_states"]

    def mlp_input(self) -> torch.Tensor:
        """The hidden states that entered the MLP."""
        return self.mlp_args[0] if self.mlp_args else self.mlp_kwargs["hidden_states"]

    def routing(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A mixture of experts' routing in the capture pass: the token rows that entered its experts module
        ``[tokens, hidden]`` and the experts each token was sent to ``[tokens, top_k]``."""
        names = ("hidden_states", "top_k_index")
        got = list(self.experts_args[:2]) + [self.experts_kwargs.get(n) for n in names[len(self.experts_args):]]
        if len(got) < 2 or any(t is None for t in got[:2]):
            raise ParameterError("The experts module's inputs were not captured (hidden states and top_k_index); "
                                 "the 'expert' level needs a mixture of experts whose block calls its experts "
                                 "module with (hidden_states, top_k_index, top_k_weights).")
        return got[0], got[1]


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
    """One forward pass with pre-hooks on each requested layer, its attention, its MLP (and a mixture of
    experts' experts module: the routed tokens, `LayerInputs.routing`): returns their inputs (args + kwargs) per
    layer (and their outputs in ``.outputs`` when asked), and the last hidden
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
            slots = [("layer", anatomy.layer_path(i)), ("attn", anatomy.attn_path(i)), ("mlp", anatomy.mlp_path(i))]
            if anatomy.num_experts and anatomy.experts_path(i) in mods:
                slots.append(("experts", anatomy.experts_path(i)))
            for slot, path in slots:
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


def output_projection(anatomy: Anatomy, attn) -> torch.nn.Module:
    """The attention module's output projection (``o_proj``, ``dense``, ``c_proj``, … as its layout names it)."""
    return getattr(attn, anatomy.layout.attention.o)


def attention_shortcut(anatomy: Anatomy, attn, kwargs: dict) -> bool:
    """Whether the projection shortcut (`attention_projections` → `split_heads` → `attend`) can be exact for this
    attention module: separate q/k/v projections (Llama family) or GPT-2's ``c_attn``, full rotary embeddings on
    every head, no step between the projections and the heads that is not linear in them other than head-sized
    q/k norms (which `split_heads` re-applies per α), and plain softmax attention. Refused: fused Phi-3 / GPT-NeoX
    projections, q/k norms spanning every head (OLMo-2), clipped q/k/v (OLMo), soft-capped attention logits
    (Gemma-2), partial rotary embeddings. Where it is True the shortcut is still checked numerically against the
    capture pass before it is used (`forgetlab.analysis.linearity`); elsewhere heads come from
    `attention_and_heads`."""
    lay = anatomy.layout.attention
    if anatomy.family not in ("llama", "gpt2") or lay.norm_per_head:
        return False
    cfg = getattr(attn, "config", None)
    for quirk in ("attn_logit_softcapping", "clip_qkv", "logit_cap"):
        if getattr(cfg, quirk, None) or getattr(attn, quirk, None):
            return False
    pe = kwargs.get("position_embeddings")
    if anatomy.family == "llama" and pe is not None and int(pe[0].shape[-1]) != anatomy.head_dim:
        return False
    return True


@torch.no_grad()
def attention_projections(anatomy: Anatomy, attn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The raw query, key and value projections ``[batch, seq, width]`` of an attention module on input ``x``
    (before q/k norms and rotary embeddings). They are affine in the module's parameters, so for parameters
    θ0 + α·τ they equal lerp(projections at θ0, projections at θ0 + τ, α). Only for the modules
    `attention_shortcut` accepts."""
    lay = anatomy.layout.attention
    if anatomy.family == "llama":
        return getattr(attn, lay.q)(x), getattr(attn, lay.k)(x), getattr(attn, lay.v)(x)
    if anatomy.family == "gpt2":
        return tuple(getattr(attn, lay.qkv)(x).split(anatomy.hidden_size, dim=2))
    raise ParameterError(f"The projection shortcut does not model {anatomy.model_type}'s fused attention; its "
                         "heads come from attention_and_heads.")


def attention_is_affine(attn) -> bool:
    """True when the step from raw projections to per-head queries/keys/values (`split_heads`) is linear —
    reshapes and rotary embeddings — and False with q/k norms (Qwen3), which are not."""
    return getattr(attn, "q_norm", None) is None and getattr(attn, "k_norm", None) is None


@torch.no_grad()
def split_heads(anatomy: Anatomy, attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-head queries, keys and values ``[batch, heads, seq, head_dim]`` from raw projections: head-sized q/k
    norms (Qwen3, Gemma-3), rotary embeddings from the captured ``position_embeddings``, key/value heads repeated
    per group (see `attention_shortcut` for where this is exact)."""
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


def per_head_contributions(anatomy: Anatomy, o_proj, x: torch.Tensor) -> torch.Tensor:
    """Head by head, what the output projection makes of its input ``x`` ``[batch, seq, heads·head_dim]`` (head
    h's block at columns h·head_dim…): ``[batch, heads, seq, hidden]``, head h's block times head h's columns of
    the weight (rows of GPT-2's Conv1D), without the bias. Summed over heads plus the bias: the projection's
    output."""
    b, s, _ = x.shape
    nh, d = anatomy.num_heads, anatomy.head_dim
    xh = x.reshape(b, s, nh, d).to(o_proj.weight.dtype)
    if anatomy.layout.attention.conv1d:
        return torch.einsum("bsnd,ndh->bnsh", xh, o_proj.weight.view(nh, d, -1))
    return torch.einsum("bsnd,hnd->bnsh", xh, o_proj.weight.view(-1, nh, d))


@torch.no_grad()
def attend(anatomy: Anatomy, attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict,
           per_head: bool = True) -> torch.Tensor:
    """softmax(q·kᵀ·scale + mask)·v (causal unless the captured ``attention_mask`` says otherwise) through the
    module's output projection: per head ``[batch, heads, seq, hidden]`` (no bias) when ``per_head``, else the
    module's output ``[batch, seq, hidden]`` (bias included)."""
    b, nh, s, d = q.shape
    mask = kwargs.get("attention_mask")
    scale = getattr(attn, "scaling", None) or 1.0 / math.sqrt(d)
    if isinstance(mask, torch.Tensor):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[..., :s, :s], scale=scale)
    else:
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    proj = output_projection(anatomy, attn)
    o = o.transpose(1, 2).reshape(b, s, nh * d)
    return per_head_contributions(anatomy, proj, o) if per_head else proj(o)


@torch.no_grad()
def attention_from_projections(anatomy: Anatomy, attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               kwargs: dict, per_head: bool = True) -> torch.Tensor:
    """Attention output from raw projections (see `attention_projections`): `split_heads`, then `attend`."""
    return attend(anatomy, attn, *split_heads(anatomy, attn, q, k, v, kwargs), kwargs, per_head=per_head)


@torch.no_grad()
def attention_and_heads(anatomy: Anatomy, attn, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention module's own output on its captured ``args`` / ``kwargs`` and its heads' contributions
    ``[batch, heads, seq, hidden]``: transformers runs the module (whatever its layout: fused projections,
    partial rotary, q/k norms, soft-capping, sliding windows, multipliers), a pre-hook reads the output
    projection's input, and head h's contribution is its block of that input times its columns of the output
    projection (`per_head_contributions`). Where q/k norms span every head (OLMo-2) head h's queries and keys are
    normalised over all heads, so its contribution also depends on the other heads' q/k rows."""
    got: dict = {}
    hook = output_projection(anatomy, attn).register_forward_pre_hook(
        lambda mod, a: got.__setitem__("x", a[0]))
    try:
        out = first_tensor(attn(*args, **kwargs))
    finally:
        hook.remove()
    return out, per_head_contributions(anatomy, output_projection(anatomy, attn), got["x"])


@torch.no_grad()
def head_outputs(anatomy: Anatomy, attn, args: tuple, kwargs: dict) -> torch.Tensor:
    """Per-head contributions ``[batch, heads, seq, hidden]`` of an attention module on its captured inputs
    (`attention_and_heads`). Summed over heads, plus the output-projection bias (`attention_bias`), they give the
    module's output."""
    return attention_and_heads(anatomy, attn, args, kwargs)[1]


@torch.no_grad()
def mlp_projections(anatomy: Anatomy, mlp, x: torch.Tensor) -> Optional[tuple[torch.Tensor, ...]]:
    """The MLP's input projections on ``x`` (gated MLPs with separate gate_proj / up_proj: both; GPT-2: c_fc),
    affine in its parameters like `attention_projections`; None for an MLP of another shape (fused gate_up_proj,
    GPT-NeoX's, a mixture of experts: it is then re-run whole)."""
    if all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return mlp.gate_proj(x), mlp.up_proj(x)
    if all(hasattr(mlp, n) for n in ("c_fc", "c_proj", "act", "dropout")):
        return (mlp.c_fc(x),)
    return None


@torch.no_grad()
def mlp_from_projections(anatomy: Anatomy, mlp, pre: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The MLP's output from its input projections (see `mlp_projections`) with its own activation and
    output projection."""
    if len(pre) == 2:
        gate, up = pre
        return mlp.down_proj(mlp.act_fn(gate) * up)
    return mlp.dropout(mlp.c_proj(mlp.act(pre[0])))


def attention_bias(anatomy: Anatomy, attn) -> Optional[torch.Tensor]:
    """The output projection's bias (shared by all heads), or None."""
    return getattr(output_projection(anatomy, attn), "bias", None)


@torch.no_grad()
def one_expert(experts, x: torch.Tensor, index: torch.Tensor, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``expert``'s output on the token rows ``x`` ``[tokens, hidden]`` that the router sent it
    (``index`` ``[tokens, top_k]``: the experts each token went to), without the routing weight: transformers'
    experts module called with every token routed to ``expert`` alone, with weight 1, then zero on the tokens the
    router did not send to it. Returns the output ``[tokens, hidden]`` and the routed tokens ``[tokens]``
    (bool)."""
    n = x.shape[0]
    only = torch.full((n, 1), expert, dtype=index.dtype, device=index.device)
    y = first_tensor(experts(x, only, torch.ones((n, 1), dtype=x.dtype, device=x.device)))
    routed = (index == expert).any(dim=-1)
    return y * routed[:, None].to(y.dtype), routed


@torch.no_grad()
def expert_outputs(work, anatomy: Anatomy, layer: int, cap: LayerInputs) -> torch.Tensor:
    """Every expert's output on the tokens the router sent it in the capture pass, ``[batch, experts, seq,
    hidden]`` (`one_expert`; zero on the tokens not routed to it). The routing (which tokens, which experts) is
    the capture pass's and stays fixed; only the experts' parameters move."""
    experts = work.module(anatomy.experts_path(layer))
    x, index = cap.routing()
    b, s = cap.mlp_input().shape[:2]
    outs = [one_expert(experts, x, index, e)[0].reshape(b, s, -1) for e in range(anatomy.num_experts)]
    return torch.stack(outs, dim=1)


@torch.no_grad()
def run_submodule(work, anatomy: Anatomy, layer: int, level: str, cap: LayerInputs) -> torch.Tensor:
    """Re-run one submodule (``layer``, ``attn``, ``mlp``) of the working copy on its cached inputs; for
    ``head`` return all heads' contributions ``[batch, heads, seq, hidden]`` (`head_outputs`), for ``expert``
    every expert's output on its routed tokens ``[batch, experts, seq, hidden]`` (`expert_outputs`)."""
    if level == "layer":
        return first_tensor(work.module(anatomy.layer_path(layer))(*cap.layer_args, **cap.layer_kwargs))
    if level == "attn":
        return first_tensor(work.module(anatomy.attn_path(layer))(*cap.attn_args, **cap.attn_kwargs))
    if level == "mlp":
        return first_tensor(work.module(anatomy.mlp_path(layer))(*cap.mlp_args, **cap.mlp_kwargs))
    if level == "head":
        return head_outputs(anatomy, work.module(anatomy.attn_path(layer)), cap.attn_args, cap.attn_kwargs)
    if level == "expert":
        return expert_outputs(work, anatomy, layer, cap)
    raise ParameterError(f"Unknown submodule level {level!r}; choose one of {', '.join(SUBMODULE_LEVELS)}, "
                         "expert.")


def check_head_decomposition(work, anatomy: Anatomy, layer: int, cap: LayerInputs,
                             heads: Optional[torch.Tensor] = None, tol: float = 1e-4) -> None:
    """Raise ParameterError unless Σ_h head contributions + output bias equals the attention module's own
    output on the cached input (it would not for an attention variant forgetlab does not model, e.g. one that
    transforms the output projection's result)."""
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
