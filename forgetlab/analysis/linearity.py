"""Non-linearity scores of a fine-tuned model and of its submodules (METHODS.md, "Submodule linearity").

For a submodule k with base parameters θ0,k and task vector τk, and an input x that the submodule receives:

- distance curve  d_x(α) = ‖f(x; θ0 + α·τ) − f(x; θ0 + τ)‖ / ‖f(x; θ0) − f(x; θ0 + τ)‖,  α ∈ {0, 0.1, …, 0.9};
  perfect linearity gives d(α) = 1 − α;
- non-linearity score  NLS_x = Σα |d_x(α) − (1 − α)|, reported as mean ± std (population std) over samples;
- Property 1 residual  r_x = meanα ‖f(x; θ0 + α·τ) − f(x; θ0) − α·(f(x; θ0 + τ) − f(x; θ0))‖ / ‖f(x; θ0 + τ) − f(x; θ0)‖
  (0 for a submodule whose features are affine in α).

Norms are Frobenius norms over every (non-padding) token position and feature of one sample.
Levels: ``model`` (features: last hidden state of the decoder), ``layer`` (a decoder block), ``attn``, ``mlp`` and
``head`` (head h's contribution to the attention output: softmax(q_h k_gᵀ·scale) v_g times head h's columns of
the output projection; the per-head contributions plus the output bias sum to the attention output).

How it stays cheap: the inputs of every layer, attention and MLP are captured ONCE with forward hooks (by default
from the fine-tuned model's forward pass on the task's probe samples; ``capture="base"`` uses the base) together
with the keyword arguments the module received (rotary position embeddings, attention mask). They are held fixed
while one working copy of the model is interpolated in place, layer by layer, to θ0 + α·τ, and each submodule is
re-run on its cached input. All heads of a layer come out of one computation. With the input fixed, the
attention's q/k/v projections (and rotary embeddings) and the MLP's input projections are affine in the
parameters, so they are computed at α = 0 and 1 only and interpolated: per α, the attention and MLP levels
cost only their core and output projection (`_LayerRerun`). The layer level re-runs the whole block per α —
its MLP input depends on α through the normalised attention output — so the full table costs at least about
twice the model level. `direct_scores` is the slow reference: one full forward pass per α per submodule.
"""
from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import pandas as pd
import torch

from forgetlab.core.anatomy import LEVELS, Anatomy
from forgetlab.core.errors import IncompatibleModelsError, ParameterError, ProbeDataError
from forgetlab.core.progress import Progress, report

DEFAULT_ALPHAS = tuple(round(0.1 * i, 1) for i in range(10))
"""α ∈ {0, 0.1, …, 0.9} (METHODS.md)."""
DEFAULT_LEVELS = LEVELS
CAPTURES = ("finetuned", "base")
SUBMODULE_LEVELS = ("layer", "attn", "mlp", "head")


# ====================================================================================== inputs


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
    from forgetlab.core.data import IGNORE, encode_pairs

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


def select_pairs(pairs: Sequence, samples: Optional[int], task: str) -> list:
    """The first ``samples`` probe pairs of a task (all when None), with messages for empty / too few."""
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
    return pairs[:samples]


# ====================================================================================== models


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


class WorkingCopy:
    """One mutable copy of the base model whose parameters are set in place (θ0 + α·τ, or another model's
    values), so that the pool's cached models are never touched and no second copy per α is made."""

    def __init__(self, base_model):
        self.model = copy.deepcopy(base_model).eval()
        self.params = dict(self.model.named_parameters(remove_duplicate=False))
        self.base = {n: p.detach() for n, p in base_model.named_parameters(remove_duplicate=False)}
        self.modules = dict(self.model.named_modules())

    @torch.no_grad()
    def lerp(self, target: dict, alpha: float, names: Optional[Iterable[str]] = None) -> None:
        """Set the parameters ``names`` (all when None) to θ0 + α·(θt − θ0), θt from ``target``."""
        for n in (self.params if names is None else names):
            torch.lerp(self.base[n], target[n], float(alpha), out=self.params[n].data)

    @torch.no_grad()
    def combine(self, targets: Sequence[dict], weights: Sequence[float],
                names: Optional[Iterable[str]] = None) -> None:
        """Set the parameters ``names`` to θ0 + Σj wj·(θj − θ0)."""
        for n in (self.params if names is None else names):
            out = self.params[n].data
            out.copy_(self.base[n])
            for t, w in zip(targets, weights):
                if w:
                    out.add_(t[n] - self.base[n], alpha=float(w))

    def module(self, path: str):
        """The working copy's module at ``path``."""
        return self.modules[path]


def param_dict(model) -> dict[str, torch.Tensor]:
    """Detached parameters of a model by name (tied parameters under every name)."""
    return {n: p.detach() for n, p in model.named_parameters(remove_duplicate=False)}


def _first_tensor(out):
    return out[0] if isinstance(out, (tuple, list)) else out


# ====================================================================================== capture & re-run


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


def _strip_kwargs(kwargs: dict) -> dict:
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
            setattr(got[i], f"{slot}_kwargs", _strip_kwargs(kwargs))
        return pre

    def out_hook(i, slot):
        def post(mod, args, out):
            got[i].outputs[slot] = _first_tensor(out)
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
def run_submodule(work: WorkingCopy, anatomy: Anatomy, layer: int, level: str, cap: LayerInputs) -> torch.Tensor:
    """Re-run one submodule (``layer``, ``attn``, ``mlp``) of the working copy on its cached inputs; for
    ``head`` return all heads' contributions ``[batch, heads, seq, hidden]``."""
    if level == "layer":
        return _first_tensor(work.module(anatomy.layer_path(layer))(*cap.layer_args, **cap.layer_kwargs))
    if level == "attn":
        return _first_tensor(work.module(anatomy.attn_path(layer))(*cap.attn_args, **cap.attn_kwargs))
    if level == "mlp":
        return _first_tensor(work.module(anatomy.mlp_path(layer))(*cap.mlp_args, **cap.mlp_kwargs))
    if level == "head":
        return head_outputs(anatomy, work.module(anatomy.attn_path(layer)), cap.attn_input(), cap.attn_kwargs)
    raise ParameterError(f"Unknown submodule level {level!r}; choose one of {', '.join(SUBMODULE_LEVELS)}.")


def check_head_decomposition(work: WorkingCopy, anatomy: Anatomy, layer: int, cap: LayerInputs,
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


# ====================================================================================== scoring


class _Curve:
    """Accumulates d(α) and the Property 1 residual for one submodule (or all heads of a layer) on a chunk.

    With u = f(α) − f(1) and Δ = f(1) − f(0) (padding zeroed): d = ‖u‖ / ‖Δ‖ and the residual is
    ‖u + (1 − α)·Δ‖ / ‖Δ‖ = ‖f(α) − f(0) − α·(f(1) − f(0))‖ / ‖f(1) − f(0)‖ — four tensor passes per α."""

    def __init__(self, f1: torch.Tensor, f0: torch.Tensor, mask: torch.Tensor, alphas: Sequence[float]):
        self.alphas = list(alphas)
        dt = f1.dtype if f1.dtype == torch.float64 else torch.float32
        self.m = (mask[:, None, :, None] if f1.dim() == 4 else mask[:, :, None]).to(dt)
        self.f1m = f1.to(dt) * self.m
        self.neg_f1m = -self.f1m
        self.delta = (f1.to(dt) - f0.to(dt)) * self.m
        self.den = torch.linalg.vector_norm(self.delta, dim=(-1, -2)).double()
        ref = torch.linalg.vector_norm(self.f1m, dim=(-1, -2)).double()
        dead = self.den <= 1e-7 * (ref + 1e-30)
        self.den = torch.where(dead, torch.full_like(self.den, float("nan")), self.den)
        shape = tuple(self.den.shape) + (len(self.alphas),)
        self.d = torch.full(shape, float("nan"), dtype=torch.float64)
        self.res = torch.full(shape, float("nan"), dtype=torch.float64)

    def add(self, alpha: float, fa: torch.Tensor) -> None:
        j = self.alphas.index(alpha)
        u = torch.addcmul(self.neg_f1m, fa.to(self.f1m.dtype), self.m)
        self.d[..., j] = torch.linalg.vector_norm(u, dim=(-1, -2)).double() / self.den
        u.add_(self.delta, alpha=1.0 - float(alpha))
        self.res[..., j] = torch.linalg.vector_norm(u, dim=(-1, -2)).double() / self.den

    def finish(self) -> "_Curve":
        """Drop the feature tensors once every α is in (keeps only the per-sample numbers)."""
        self.m = self.f1m = self.neg_f1m = self.delta = None
        return self


@dataclass
class SubmoduleScore:
    """Scores of one submodule over the samples: ``d`` [samples, alphas], ``nls`` [samples] (NLS_x) and
    ``residual`` [samples] (the Property 1 residual r_x). NaN where the submodule did not change (τ = 0)."""

    level: str
    layer: Optional[int]
    head: Optional[int]
    module: str
    d: np.ndarray
    nls: np.ndarray
    residual: np.ndarray

    @staticmethod
    def _nanstat(fn, x, axis=None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return fn(x, axis=axis)

    @property
    def nls_mean(self) -> float:
        """Mean NLS over samples."""
        return float(self._nanstat(np.nanmean, self.nls))

    @property
    def nls_std(self) -> float:
        """Population standard deviation of NLS over samples."""
        return float(self._nanstat(np.nanstd, self.nls))

    @property
    def curve(self) -> np.ndarray:
        """Mean d(α) over samples, one value per α."""
        return self._nanstat(np.nanmean, self.d, axis=0)

    @property
    def curve_std(self) -> np.ndarray:
        """Standard deviation of d(α) over samples."""
        return self._nanstat(np.nanstd, self.d, axis=0)


@dataclass
class NonlinearityResult:
    """Non-linearity scores of every requested submodule for one task and model (see the module docstring)."""

    task: str
    model: str
    alphas: tuple
    samples: int
    capture: str
    levels: tuple
    scores: list[SubmoduleScore]

    def to_frame(self) -> pd.DataFrame:
        """One row per submodule: level, layer, module, head, nls_mean, nls_std, residual_mean, n, curve
        (mean d per α, a list), curve_std."""
        rows = []
        for s in self.scores:
            rows.append({
                "level": s.level, "layer": s.layer, "module": s.module, "head": s.head,
                "nls_mean": s.nls_mean, "nls_std": s.nls_std,
                "residual_mean": float(SubmoduleScore._nanstat(np.nanmean, s.residual)),
                "n": int(np.isfinite(s.nls).sum()),
                "curve": [float(v) for v in s.curve], "curve_std": [float(v) for v in s.curve_std],
            })
        df = pd.DataFrame(rows, columns=["level", "layer", "module", "head", "nls_mean", "nls_std",
                                         "residual_mean", "n", "curve", "curve_std"])
        df["layer"] = df["layer"].astype("Int64")
        df["head"] = df["head"].astype("Int64")
        return df

    def curves_frame(self) -> pd.DataFrame:
        """Long format: level, layer, module, head, alpha, d_mean, d_std, ideal (= 1 − α)."""
        rows = []
        for s in self.scores:
            for a, m, sd in zip(self.alphas, s.curve, s.curve_std):
                rows.append({"level": s.level, "layer": s.layer, "module": s.module, "head": s.head,
                             "alpha": float(a), "d_mean": float(m), "d_std": float(sd), "ideal": 1.0 - float(a)})
        df = pd.DataFrame(rows)
        if len(df):
            df["layer"] = df["layer"].astype("Int64")
            df["head"] = df["head"].astype("Int64")
        return df

    def by_level(self) -> pd.DataFrame:
        """Per level: mean and std of NLS over all samples of all its submodules, the count of submodules and
        of those the task vector leaves unchanged (τ = 0 there, e.g. modules a LoRA adapter does not target:
        their NLS is undefined, NaN, and left out of the mean)."""
        rows = []
        for level in self.levels:
            mine = [s for s in self.scores if s.level == level]
            vals = np.concatenate([s.nls for s in mine] or [np.array([])])
            vals = vals[np.isfinite(vals)]
            rows.append({"level": level, "nls_mean": float(vals.mean()) if len(vals) else float("nan"),
                         "nls_std": float(vals.std()) if len(vals) else float("nan"),
                         "submodules": len(mine),
                         "unchanged": sum(not np.isfinite(s.nls).any() for s in mine)})
        return pd.DataFrame(rows)

    def unchanged_note(self) -> str | None:
        """A sentence naming the levels whose NLS is NaN because τ = 0 on every one of their submodules."""
        df = self.by_level()
        empty = [r.level for r in df.itertuples() if r.submodules and r.unchanged == r.submodules]
        if not empty:
            return None
        return (f"NLS is undefined (NaN) at the {', '.join(empty)} level(s): the task vector is zero on every "
                "submodule there (a LoRA adapter changes only the modules it targets), so nothing moves with α.")

    def get(self, level: str, layer: Optional[int] = None, head: Optional[int] = None) -> SubmoduleScore:
        """The score of one submodule."""
        for s in self.scores:
            if s.level == level and s.layer == layer and s.head == head:
                return s
        raise ParameterError(f"No score for level={level}, layer={layer}, head={head} in this result.")

    def to_dict(self) -> dict:
        """A JSON-ready dict (per-sample arrays included)."""
        return {"task": self.task, "model": self.model, "alphas": list(self.alphas), "samples": self.samples,
                "capture": self.capture, "levels": list(self.levels),
                "scores": [{"level": s.level, "layer": s.layer, "head": s.head, "module": s.module,
                            "d": np.nan_to_num(s.d, nan=-1.0).tolist(), "nls": s.nls.tolist(),
                            "residual": s.residual.tolist()} for s in self.scores]}

    @classmethod
    def from_dict(cls, data: dict) -> "NonlinearityResult":
        """Inverse of `to_dict`."""
        scores = []
        for s in data["scores"]:
            d = np.asarray(s["d"], dtype=float)
            d[d == -1.0] = np.nan
            scores.append(SubmoduleScore(s["level"], s["layer"], s["head"], s["module"], d,
                                         np.asarray(s["nls"], dtype=float), np.asarray(s["residual"], dtype=float)))
        return cls(data["task"], data["model"], tuple(data["alphas"]), int(data["samples"]), data["capture"],
                   tuple(data["levels"]), scores)


def _lerp_all(a: tuple, b: tuple, alpha: float) -> tuple:
    return tuple(torch.lerp(x, y, float(alpha)) for x, y in zip(a, b))


def _same(fast: torch.Tensor, ref: torch.Tensor, tol: float = 1e-4) -> bool:
    return bool((fast - ref).abs().max() <= tol * max(1.0, float(ref.abs().max())))


class _LayerRerun:
    """The outputs of one layer's submodules (``layer``, ``attn``, ``mlp``, ``head``) of the working copy on
    their cached inputs, for the α its parameters are currently set to.

    Why it is cheap: with the input held fixed, the attention's q/k/v projections and the MLP's input
    projections are affine in the parameters, so they are computed at α = 0 and α = 1 only and interpolated
    for every other α; per α only the attention core, the output projections and the whole layer are re-run.
    Call `outputs` for α = 1 and α = 0 before any other α. Whether the shortcut reproduces a module (an
    unknown variant might not) is checked once per run against the capture pass's own outputs (``fast``
    holds the verdict per module kind); where it does not, the module is re-run whole."""

    def __init__(self, work: WorkingCopy, anatomy: Anatomy, layer: int, cap: LayerInputs, levels: Sequence[str],
                 cap_alpha: float, fast: dict[str, bool]):
        self.work, self.anatomy, self.layer, self.cap = work, anatomy, layer, cap
        self.levels, self.cap_alpha, self.fast = tuple(levels), cap_alpha, fast
        self.attn = work.module(anatomy.attn_path(layer))
        self.mlp = work.module(anatomy.mlp_path(layer))
        self.ends: dict[tuple[str, float], Optional[tuple]] = {}
        self.affine_heads = attention_is_affine(self.attn)

    def _attention(self, qkv: tuple, per_head: bool) -> torch.Tensor:
        if self.affine_heads:
            return attend(self.anatomy, self.attn, *qkv, self.cap.attn_kwargs, per_head=per_head)
        return attention_from_projections(self.anatomy, self.attn, *qkv, self.cap.attn_kwargs, per_head=per_head)

    def _projections(self, kind: str, alpha: float) -> Optional[tuple]:
        if alpha in (0.0, 1.0):
            if kind == "attn":
                got = attention_projections(self.anatomy, self.attn, self.cap.attn_input())
                if self.affine_heads:  # rotary embeddings are linear too: apply them to the two ends only
                    got = split_heads(self.anatomy, self.attn, *got, self.cap.attn_kwargs)
            else:
                got = mlp_projections(self.anatomy, self.mlp, self.cap.mlp_input())
            self.ends[(kind, alpha)] = got
            return got
        lo, hi = self.ends[(kind, 0.0)], self.ends[(kind, 1.0)]
        return None if lo is None else _lerp_all(lo, hi, alpha)

    def _verified(self, kind: str, fast_out: Optional[torch.Tensor]) -> bool:
        if kind not in self.fast:
            self.fast[kind] = fast_out is not None and _same(fast_out, self.cap.outputs[kind])
        return self.fast[kind]

    def outputs(self, alpha: float) -> dict[str, torch.Tensor]:
        """``{level: features}`` at the working copy's current parameters (θ0 + α·τ on this layer)."""
        a, cap, outs = self.anatomy, self.cap, {}
        at_capture = alpha == self.cap_alpha  # the capture pass ran these very inputs at these parameters
        if "head" in self.levels or "attn" in self.levels:
            qkv = self._projections("attn", alpha)
            if "head" in self.levels:
                outs["head"] = self._attention(qkv, per_head=True)
                if "attn" in self.levels:
                    bias = attention_bias(a, self.attn)
                    outs["attn"] = outs["head"].sum(1) + (bias if bias is not None else 0)
            else:
                fast_out = None
                if at_capture or self.fast.get("attn"):
                    fast_out = self._attention(qkv, per_head=False)
                if at_capture:
                    self._verified("attn", fast_out)
                # one computation path for every α, so that an unchanged module gives bitwise-equal ends
                outs["attn"] = fast_out if self.fast.get("attn") else run_submodule(self.work, a, self.layer,
                                                                                    "attn", cap)
        if "mlp" in self.levels:
            pre = self._projections("mlp", alpha)
            fast_out = None
            if pre is not None and (at_capture or self.fast.get("mlp")):
                fast_out = mlp_from_projections(a, self.mlp, pre)
            if at_capture:
                self._verified("mlp", fast_out)
            outs["mlp"] = fast_out if self.fast.get("mlp") and fast_out is not None else run_submodule(
                self.work, a, self.layer, "mlp", cap)
        if "layer" in self.levels:
            outs["layer"] = cap.outputs["layer"] if at_capture else run_submodule(self.work, a, self.layer, "layer",
                                                                                  cap)
        return outs


def check_alphas(alphas) -> tuple:
    """The α grid as a tuple of floats: distinct, in [0, 1) (α = 1 is the reference); ParameterError otherwise."""
    try:
        al = tuple(float(a) for a in alphas)
    except (TypeError, ValueError):
        raise ParameterError(f"alphas must be numbers in [0, 1); got {alphas!r}.") from None
    if not al:
        raise ParameterError("alphas is empty; pass e.g. 0,0.1,...,0.9.")
    if any(not (0.0 <= a < 1.0) for a in al) or len(set(al)) != len(al):
        raise ParameterError(f"alphas must be distinct numbers in [0, 1) (α = 1 is the reference); got {al}.")
    return al


def _check_levels(levels, anatomy: Optional[Anatomy], anatomy_error: Optional[Exception]) -> tuple:
    lv = tuple(dict.fromkeys([levels] if isinstance(levels, str) else levels))
    if not lv:
        raise ParameterError(f"No level asked; choose from {', '.join(LEVELS)}.")
    for level in lv:
        if level not in LEVELS:
            raise ParameterError(f"Unknown level {level!r}; choose from {', '.join(LEVELS)}.")
        if level != "model" and anatomy is None:
            raise ParameterError(f"The {level!r} level is unavailable for this architecture: {anatomy_error}")
    return lv


@dataclass
class _Inputs:
    base: Any
    finetuned: Any
    tokenizer: Any
    pairs: list
    task: str
    model_name: str
    template: Optional[str]


def resolve_models(pool_or_models, task: Optional[str], model: Optional[str] = None,
                   device: Optional[str] = None) -> _Inputs:
    """(base, fine-tuned, tokenizer, probe pairs) from a ModelPool (the fine-tuned model is ``model``, else the
    one named like the task, else the pool's only model) or from a ``(base, finetuned, tokenizer, pairs)``
    tuple."""
    if isinstance(pool_or_models, (tuple, list)):
        if len(pool_or_models) != 4:
            raise ParameterError("Pass a ModelPool or a (base_model, finetuned_model, tokenizer, pairs) tuple.")
        base, ft, tok, pairs = pool_or_models
        return _Inputs(base, ft, tok, list(pairs or []), task or "task", model or "finetuned", None)
    pool = pool_or_models
    if task is None:
        raise ParameterError(f"Name a task; the pool's tasks are: {', '.join(pool.probes.tasks) or 'none'}.")
    data = pool.probes.task(task)
    if model is None:
        names = pool.model_names
        if task in names:
            model = task
        elif len(names) == 1:
            model = names[0]
        else:
            raise ParameterError(
                f"No model of the pool is named like task {task!r}; pass model= one of {', '.join(names)}.")
    base = pool.load("base", device=device)
    ft = pool.load(model, device=device)
    return _Inputs(base, ft, pool.tokenizer, list(data.probe), task, model, getattr(pool.probes, "template", None))


def nonlinearity_scores(pool_or_models, task: Optional[str] = None, *, model: Optional[str] = None,
                        levels: Sequence[str] = DEFAULT_LEVELS, alphas: Sequence[float] = DEFAULT_ALPHAS,
                        samples: Optional[int] = 30, capture: str = "finetuned", batch_size: int = 8,
                        max_length: int = 128, device: Optional[str] = None,
                        progress: Progress = None) -> NonlinearityResult:
    """Distance curves d_x(α), non-linearity scores NLS_x and Property 1 residuals (METHODS.md, "Submodule
    linearity") at every requested level, layer and head, on the first ``samples`` probe pairs of ``task``.

    ``pool_or_models`` is a `forgetlab.core.pool.ModelPool` or a ``(base, finetuned, tokenizer, pairs)`` tuple.
    Submodule inputs are captured once per batch from the ``capture`` model ("finetuned" or "base") and held
    fixed; each submodule is re-run on them with parameters θ0 + α·τ (see the module docstring).
    """
    if capture not in CAPTURES:
        raise ParameterError(f"capture must be one of {', '.join(CAPTURES)}; got {capture!r}.")
    al = check_alphas(alphas)
    inp = resolve_models(pool_or_models, task, model, device)
    pairs = select_pairs(inp.pairs, samples, inp.task)
    check_same_structure(inp.base, inp.finetuned)
    try:
        anatomy, an_err = Anatomy.from_model(inp.base), None
    except ParameterError as exc:
        anatomy, an_err = None, exc
    lv = _check_levels(levels, anatomy, an_err)
    if batch_size < 1:
        raise ParameterError(f"batch_size must be ≥ 1; got {batch_size}.")

    enc = encode_samples(inp.tokenizer, pairs, max_length=max_length, template=inp.template)
    target = param_dict(inp.finetuned)
    work = WorkingCopy(inp.base)
    device_ = next(work.model.parameters()).device
    cap_alpha = 1.0 if capture == "finetuned" else 0.0
    # α = 1 first (reference), then 0 (denominator), then the grid
    order = [1.0, 0.0] + [a for a in al if a not in (0.0, 1.0)]
    sub = [x for x in lv if x != "model"]
    layers = list(range(anatomy.num_layers)) if sub else []
    chunks = [(i, min(i + batch_size, len(enc))) for i in range(0, len(enc), batch_size)]
    steps_per_chunk = (len(order) if "model" in lv else 0) + len(layers) * len(order) + 1
    total_steps = max(1, steps_per_chunk * len(chunks))
    step = 0
    acc: dict[tuple, list] = {}
    head_checked = False
    fast: dict[str, bool] = {}  # per module kind: does the projection shortcut reproduce the module? (checked once)

    def tick(msg):
        nonlocal step
        step += 1
        report(progress, step / total_steps, msg)

    with torch.no_grad():
        for ci, (a, b) in enumerate(chunks):
            chunk = enc.chunk(a, b)
            ids = chunk.input_ids.to(device_)
            mask = chunk.mask().to(device_)
            work.lerp(target, cap_alpha)
            caps, h_cap = (capture_inputs(work.model, anatomy, ids, layers, want_last_hidden="model" in lv,
                                          want_outputs=True)
                           if anatomy is not None else ({}, last_hidden(work.model, None, ids)))
            tick(f"captured inputs of samples {a + 1}-{b}")
            if "model" in lv:
                curve = None
                f_first = None
                for alpha in order:
                    if alpha == cap_alpha:
                        fa = h_cap
                    else:
                        work.lerp(target, alpha)
                        fa = last_hidden(work.model, anatomy, ids)
                    if alpha == 1.0:
                        f_first = fa
                    elif alpha == 0.0:
                        curve = _Curve(f_first, fa, mask, al)
                    if alpha in al:
                        curve.add(alpha, fa)
                    tick(f"model level, α = {alpha:g}")
                acc.setdefault(("model", None), []).append(curve.finish())
            for i in layers:
                names = anatomy.params_of("layer", layer=i)
                f1: dict[str, torch.Tensor] = {}
                curves: dict[str, _Curve] = {}
                rerun = _LayerRerun(work, anatomy, i, caps[i], sub, cap_alpha, fast)
                for alpha in order:
                    work.lerp(target, alpha, names)
                    outs = rerun.outputs(alpha)
                    if "head" in outs and not head_checked:
                        check_head_decomposition(work, anatomy, i, caps[i], outs["head"])
                        head_checked = True
                    for level, fa in outs.items():
                        if alpha == 1.0:
                            f1[level] = fa
                        elif alpha == 0.0:
                            curves[level] = _Curve(f1[level], fa, mask, al)
                        if alpha in al:
                            curves[level].add(alpha, fa)
                    tick(f"layer {i}, α = {alpha:g}")
                for level, c in curves.items():
                    acc.setdefault((level, i), []).append(c.finish())
                f1.clear()
                caps[i] = None  # this layer's inputs are no longer needed
            del caps

    scores = []
    for level in lv:
        keys = [k for k in acc if k[0] == level]
        for key in keys:
            parts = acc[key]
            d = torch.cat([p.d for p in parts], dim=0).numpy()
            res = torch.cat([p.res for p in parts], dim=0).numpy()
            ideal = 1.0 - np.asarray(al)
            if level == "head":
                for h in range(anatomy.num_heads):
                    dh = d[:, h, :]
                    scores.append(_make_score(level, key[1], h, anatomy.attn_path(key[1]) + f".head{h}",
                                              dh, res[:, h, :], ideal))
            else:
                path = anatomy.module_path(level, key[1]) if anatomy is not None else "model"
                scores.append(_make_score(level, key[1], None, path, d, res, ideal))
    report(progress, 1.0, "done")
    return NonlinearityResult(inp.task, inp.model_name, al, len(pairs), capture, lv, scores)


def _make_score(level, layer, head, module, d, res, ideal) -> SubmoduleScore:
    nls = np.abs(d - ideal[None, :]).sum(axis=1)  # NaN where the submodule did not change
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        r = np.nanmean(res, axis=1)
    return SubmoduleScore(level, layer, head, module, d, nls, r)


def score_function(fn, theta0, theta1, inputs: torch.Tensor, alphas: Sequence[float] = DEFAULT_ALPHAS,
                   level: str = "function", module: str = "fn") -> SubmoduleScore:
    """d_x(α), NLS_x and the Property 1 residual of any function ``fn(x, θ)`` on a batch of inputs
    (``inputs[i]`` is sample x_i; ``θ`` a tensor or a tuple of tensors, interpolated as θ0 + α·(θ1 − θ0)).
    The same formulas as `nonlinearity_scores`, for a submodule given as a plain function."""
    al = check_alphas(alphas)
    t0 = theta0 if isinstance(theta0, (tuple, list)) else (theta0,)
    t1 = theta1 if isinstance(theta1, (tuple, list)) else (theta1,)

    def feats(alpha):
        th = tuple(torch.lerp(a.double(), b.double(), float(alpha)) for a, b in zip(t0, t1))
        out = torch.stack([fn(x.double(), th if len(th) > 1 else th[0]) for x in inputs]).double()
        return out.reshape(out.shape[0], 1, -1)

    f1, f0 = feats(1.0), feats(0.0)
    mask = torch.ones(f1.shape[0], 1, dtype=torch.bool)
    curve = _Curve(f1, f0, mask, al)
    for a in al:
        curve.add(a, f0 if a == 0.0 else feats(a))
    return _make_score(level, None, None, module, curve.d.numpy(), curve.res.numpy(), 1.0 - np.asarray(al))


# ====================================================================================== reference


def _set_head_slices(work: WorkingCopy, anatomy: Anatomy, target: dict, layer: int, head: int, alpha: float):
    """Head ``head``'s slices to θ0 + α·τ, and the q/k norm weights (Qwen3) with them: they are shared by every
    head, so each head's function moves with them (as in `nonlinearity_scores`, which moves the whole layer)."""
    for sl in anatomy.head_slices(layer, head):
        dst = sl.take(work.params[sl.name].data)
        dst.copy_(torch.lerp(sl.take(work.base[sl.name]), sl.take(target[sl.name]), float(alpha)))
    shared = [n for n in anatomy.params_of("attn", layer=layer) if ".q_norm." in n or ".k_norm." in n]
    work.lerp(target, alpha, shared)


def direct_scores(pool_or_models, task: Optional[str] = None, *, model: Optional[str] = None,
                  levels: Sequence[str] = DEFAULT_LEVELS, alphas: Sequence[float] = DEFAULT_ALPHAS,
                  samples: Optional[int] = 30, capture: str = "finetuned", batch_size: int = 8,
                  max_length: int = 128, progress: Progress = None) -> NonlinearityResult:
    """The same scores as `nonlinearity_scores`, by naive recomputation: for every submodule and every α, the
    whole ``capture`` model is run with only that submodule's parameters (a head: only its slices) set to
    θ0 + α·τ, and the submodule's output is read with a hook. Slow; the reference for tests and benchmarks."""
    if capture not in CAPTURES:
        raise ParameterError(f"capture must be one of {', '.join(CAPTURES)}; got {capture!r}.")
    al = check_alphas(alphas)
    inp = resolve_models(pool_or_models, task, model)
    pairs = select_pairs(inp.pairs, samples, inp.task)
    check_same_structure(inp.base, inp.finetuned)
    anatomy = Anatomy.from_model(inp.base)
    lv = _check_levels(levels, anatomy, None)
    enc = encode_samples(inp.tokenizer, pairs, max_length=max_length, template=inp.template)
    target = param_dict(inp.finetuned)
    work = WorkingCopy(inp.base)
    cap_alpha = 1.0 if capture == "finetuned" else 0.0
    order = [1.0, 0.0] + [a for a in al if a not in (0.0, 1.0)]
    ideal = 1.0 - np.asarray(al)
    subs = []
    for level in lv:
        for layer, head in anatomy.submodules(level):
            subs.append((level, layer, head))
    scores = []
    for si, (level, layer, head) in enumerate(subs):
        d_parts, r_parts = [], []
        for a, b in [(i, min(i + batch_size, len(enc))) for i in range(0, len(enc), batch_size)]:
            chunk = enc.chunk(a, b)
            ids, mask = chunk.input_ids, chunk.mask()
            curve, f1 = None, None
            for alpha in order:
                work.lerp(target, cap_alpha)
                if level == "model":
                    work.lerp(target, alpha)
                    fa = last_hidden(work.model, anatomy, ids)
                elif level == "head":
                    _set_head_slices(work, anatomy, target, layer, head, alpha)
                    caps, _ = capture_inputs(work.model, anatomy, ids, [layer])
                    fa = run_submodule(work, anatomy, layer, "head", caps[layer])[:, head]
                else:
                    work.lerp(target, alpha, anatomy.params_of(level, layer=layer))
                    got = {}
                    path = anatomy.module_path(level, layer)
                    hk = work.module(path).register_forward_hook(
                        lambda m, i_, o: got.__setitem__("out", _first_tensor(o)))
                    try:
                        last_hidden(work.model, anatomy, ids)
                    finally:
                        hk.remove()
                    fa = got["out"]
                if alpha == 1.0:
                    f1 = fa
                elif alpha == 0.0:
                    curve = _Curve(f1, fa, mask, al)
                if alpha in al:
                    curve.add(alpha, fa)
            d_parts.append(curve.finish().d)
            r_parts.append(curve.res)
        d = torch.cat(d_parts).numpy()
        r = torch.cat(r_parts).numpy()
        module = (anatomy.attn_path(layer) + f".head{head}") if level == "head" else anatomy.module_path(level, layer)
        scores.append(_make_score(level, layer, head, module, d, r, ideal))
        report(progress, (si + 1) / len(subs), f"{level} {layer if layer is not None else ''}")
    return NonlinearityResult(inp.task, inp.model_name, al, len(pairs), capture, lv, scores)
