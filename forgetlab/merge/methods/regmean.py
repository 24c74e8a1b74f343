"""RegMean, ``regmean``, and RegMean++, ``regmean_pp`` (docs/methods.md#regmean; Jin et al., arXiv 2212.09849;
RegMean++, arXiv 2508.03121).

Per linear layer inside the decoder layers (nn.Linear, and GPT-2's Conv1D), with Gt = XtᵀXt / nt the Gram of
the inputs that layer receives on task t's probe split (real tokens only, nt of them) and G̃t = Gt with its
off-diagonal entries scaled by α:  W* = argmin Σt ‖Xt·W − Xt·Wt‖² = (Σt G̃t)⁻¹·Σt G̃t·Wt  (W as x ↦ x·W; for
nn.Linear's (out, in) storage W*ᵀ is computed). Every other tensor (biases, norms, embeddings, the head) is the
mean of the θt.

- ``regmean``: Xt is fine-tuned model t's own input to the layer.
- ``regmean_pp``: Xt is what the *merged* model feeds the layer: layers are merged in order, and task t's
  probe data runs through the merged layers 1..ℓ−1 (embeddings averaged) into fine-tuned model t's layer ℓ,
  whose linear layers give Gt (the paper's intra- and cross-layer dependencies).

Defaults: α = 0.6 for regmean (fusion-bench's gpt2_regmean.yaml, its decoder-LM setting) and 0.95 for regmean_pp
(fusion-bench's clip_regmean_plusplus.yaml, its only RegMean++ setting). The Grams come from the `prepare`
hook (a pool with probe data is needed, as for slwm); the merge of each tensor then streams."""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from forgetlab.core.checkpoints import load_model
from forgetlab.core.errors import ParameterError, ProbeDataError
from forgetlab.core.progress import report
from forgetlab.core.submodules import encode_samples, select_pairs
from forgetlab.merge.methods.common import UNIT
from forgetlab.merge.methods.slwm import pool_names_for
from forgetlab.merge.methods.spectral import is_embedding
from forgetlab.merge.registry import ParamSpec, TensorJob, WorkingMemory, method
from forgetlab.merge.working_copy import stored_params

DEFAULT_SAMPLES = 64
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks)\.(\d+)$")


@dataclass
class Gram:
    """The Grams Gt of one linear weight, stacked (T, d_in, d_in); `transposed`: the weight is stored (out, in)
    (nn.Linear), so the merge solves for Wᵀ."""

    grams: torch.Tensor
    transposed: bool


def scale_off_diagonal(g: torch.Tensor, alpha: float) -> torch.Tensor:
    """G with its off-diagonal entries multiplied by α (the diagonal kept)."""
    out = g * float(alpha)
    out.diagonal(dim1=-2, dim2=-1).copy_(g.diagonal(dim1=-2, dim2=-1))
    return out


def regmean_solve(weights: Sequence[torch.Tensor], grams: Sequence[torch.Tensor], alpha: float,
                  transposed: bool) -> torch.Tensor:
    """W* = (Σt G̃t)⁻¹·Σt G̃t·Wt (Wt in x ↦ x·W form; `transposed`: weights stored (out, in), the result too)."""
    # solved in float64: Σ G̃t is d_in × d_in (small next to the weights) and can be ill-conditioned
    gs = [scale_off_diagonal(g.to(torch.float64), alpha) for g in grams]
    ws = [(w.T if transposed else w).to(torch.float64) for w in weights]
    total = torch.stack(gs).sum(dim=0)
    rhs = torch.stack([g @ w for g, w in zip(gs, ws)]).sum(dim=0)
    eig = torch.linalg.eigvalsh(total)
    if float(eig[0]) > float(eig[-1]) * total.shape[0] * torch.finfo(torch.float64).eps:
        merged = torch.linalg.solve(total, rhs)
    else:   # singular (α = 1 and inputs spanning fewer than d_in directions): the least-norm minimiser
        merged = torch.linalg.pinv(total, hermitian=True) @ rhs
    merged = merged.to(torch.float32)
    return merged.T.contiguous() if transposed else merged


def _linears(model) -> dict[str, tuple[Any, bool]]:
    """Linear maps inside the decoder layers: module path → (module, stored (out, in))."""
    out = {}
    for path, mod in model.named_modules():
        if not re.search(r"(?:^|\.)(?:layers|h|layer|blocks)\.\d+\.", path + "."):
            continue
        if is_embedding(path + ".weight"):
            continue
        if isinstance(mod, torch.nn.Linear):
            out[path] = (mod, True)
        elif type(mod).__name__ == "Conv1D" and getattr(mod, "weight", None) is not None and mod.weight.dim() == 2:
            out[path] = (mod, False)
    return out


def _decoder_layers(model) -> list[tuple[str, Any]]:
    found = [(p, m) for p, m in model.named_modules() if _LAYER_RE.search(p)]
    found.sort(key=lambda pm: int(_LAYER_RE.search(pm[0]).group(1)))
    return found


class _GramHooks:
    """Forward pre-hooks accumulating Σ xᵀx over real tokens for each linear module."""

    def __init__(self, modules: dict[str, tuple[Any, bool]]):
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.mask: Optional[torch.Tensor] = None
        self.handles = [mod.register_forward_pre_hook(self._hook(path)) for path, (mod, _) in modules.items()]

    def _hook(self, path):
        def hook(module, inputs):
            x = inputs[0].detach()
            x = x[self.mask] if self.mask is not None and x.shape[:2] == self.mask.shape else x.reshape(-1, x.shape[-1])
            x = x.to(torch.float64)
            g = x.T @ x
            self.sums[path] = self.sums[path] + g if path in self.sums else g
            self.counts[path] = self.counts.get(path, 0) + int(x.shape[0])
        return hook

    def grams(self) -> dict[str, torch.Tensor]:
        """Σ xᵀx / n per module, float32 on the CPU; the float64 sums are let go as each Gram is made."""
        return {p: (self.sums.pop(p) / max(1, self.counts[p])).to(torch.float32).cpu() for p in list(self.sums)}

    def close(self) -> None:
        for h in self.handles:
            h.remove()


class _Stop(Exception):
    pass


def probe_inputs(ctx, samples: int, max_length: int = 128, method: str = "regmean"):
    """(pool model names, [Samples per task], tokenizer) for a prepare hook: each fine-tuned model's task's probe
    split (the task named like the model unless `tasks` says otherwise), `samples` pairs each."""
    pool = ctx.pool
    names = pool_names_for(pool, ctx.model_names, method)
    tasks = [t.strip() for t in str(ctx.params.get("tasks") or "").split(",") if t.strip()] or names
    if len(tasks) != len(names):
        raise ParameterError(f"{len(names)} models but {len(tasks)} tasks; give one task per model, in model order.")
    if pool.probes is None or not pool.probes.tasks:
        raise ProbeDataError("This merge computes its statistics on each model's task probe split; the pool has no "
                             "task probe data (pool.yaml probes: tasks:).")
    for t in tasks:
        if t not in pool.probes.tasks:
            raise ProbeDataError(f"No probe task named {t!r} for model {names[tasks.index(t)]!r}; the pool's tasks are "
                                 f"{', '.join(pool.probes.tasks)}. Name the models after their tasks or pass "
                                 "tasks: (one per model).")
    template = getattr(pool.probes, "template", None)
    encs = [encode_samples(pool.tokenizer, select_pairs(pool.probes.tasks[t].probe, samples, t), max_length=max_length,
                           template=template) for t in tasks]
    return names, encs, pool.tokenizer


def _run_batches(model, enc, hooks: _GramHooks, batch_size: int = 8, stop_at=None) -> None:
    dev = next(model.parameters()).device
    for a in range(0, len(enc), batch_size):
        chunk = enc.chunk(a, min(a + batch_size, len(enc)))
        hooks.mask = chunk.mask().to(dev)
        try:
            model(input_ids=chunk.input_ids.to(dev))
        except _Stop:
            pass


def _stopper(layer_module):
    def hook(module, inputs, output):
        raise _Stop()
    return layer_module.register_forward_hook(hook)


@torch.no_grad()
def regmean_grams(ctx, plus_plus: bool = False) -> dict[str, Gram]:
    """The prepare hook of regmean / regmean_pp: per linear weight name, the stacked Grams (module docstring).

    regmean loads one fine-tuned model at a time (`ModelPool.borrow`: unloaded after unless the caller held it).
    regmean_pp runs a merged model of its own (the base loaded afresh) and reads each fine-tuned model's
    parameters from its checkpoint, one decoder layer at a time (`stored_params`); only a model whose
    checkpoint cannot be read so (an adapter, GGUF, .bin) is loaded whole, for the length of the hook."""
    p = ctx.params
    names, encs, _ = probe_inputs(ctx, int(p["samples"]), method="regmean_pp" if plus_plus else "regmean")
    T = len(names)
    out: dict[str, list] = {}
    transposed: dict[str, bool] = {}
    if not plus_plus:
        for t, (name, enc) in enumerate(zip(names, encs)):
            with ctx.pool.borrow(name) as m:
                lins = _linears(m)
                if not lins:
                    raise ParameterError("regmean found no linear layers inside decoder layers (layers.<i>. / "
                                         "h.<i>.) of the model.")
                transposed = transposed or {path: tr for path, (_, tr) in lins.items()}
                hooks = _GramHooks(lins)
                try:
                    _run_batches(m, enc, hooks)
                finally:
                    hooks.close()
            for path, g in hooks.grams().items():
                out.setdefault(path, [None] * T)[t] = g
            report(ctx.progress, (t + 1) / T, f"regmean: Grams of {names[t]}")
    else:
        with contextlib.ExitStack() as stack:
            transposed = _regmean_pp_grams(ctx, names, encs, out, stack)
    # stacked path by path, each list let go once stacked (not every Gram twice at the end)
    return {f"{path}.weight": Gram(torch.stack(gs), transposed[path]) for path, gs in
            ((path, out.pop(path)) for path in list(out)) if all(g is not None for g in gs)}


def _regmean_pp_grams(ctx, names: list[str], encs: list, out: dict[str, list], stack) -> dict[str, bool]:
    """RegMean++'s layer-by-layer pass (module docstring): fills `out` (module path → the T Grams) and returns
    module path → stored (out, in). Fine-tuned parameters are read from the checkpoints layer by layer; a model
    whose checkpoint cannot be read so is borrowed whole from the pool into `stack` (an ExitStack)."""
    p, T, pool = ctx.params, len(names), ctx.pool
    merged = load_model(pool.checkpoint("base"), device="cpu", dtype=torch.float32).eval()   # our own copy
    lin_all = _linears(merged)
    if not lin_all:
        raise ParameterError("regmean found no linear layers inside decoder layers (layers.<i>. / h.<i>.) of the model.")
    sds = []
    for n in names:
        sd = stored_params(pool.checkpoint(n), merged)
        if sd is None:
            sd = dict(stack.enter_context(pool.borrow(n)).named_parameters())
        sds.append(sd)
    layers = _decoder_layers(merged)
    in_layer = {n for path, _ in layers for n, _ in merged.get_submodule(path).named_parameters(prefix=path)}
    params = dict(merged.named_parameters())
    for n, prm in params.items():       # outside the decoder layers: the mean of the θt
        if n not in in_layer:
            prm.copy_(torch.stack([sd[n].detach().to(prm.device) for sd in sds]).mean(dim=0))
    for li, (path, layer) in enumerate(layers):
        lp = [n for n in params if n.startswith(path + ".")]
        theirs = [{n: sd[n].detach() for n in lp} for sd in sds]     # layer ℓ of every model: T layers at once
        lins = {k: v for k, v in lin_all.items() if k.startswith(path + ".")}
        grams: dict[str, list] = {}
        stop = _stopper(layer)
        try:
            for t in range(T):
                for n in lp:
                    params[n].copy_(theirs[t][n])
                hooks = _GramHooks(lins)
                try:
                    _run_batches(merged, encs[t], hooks)
                finally:
                    hooks.close()
                for k, g in hooks.grams().items():
                    grams.setdefault(k, [None] * T)[t] = g
        finally:
            stop.remove()
        for n in lp:                      # merge layer ℓ now: the next layer's inputs pass through it
            mod_path = n.rsplit(".", 1)[0]
            if n.endswith(".weight") and mod_path in grams:
                w = regmean_solve([th[n] for th in theirs], grams[mod_path], p["alpha"], lins[mod_path][1])
            else:
                w = torch.stack([th[n] for th in theirs]).mean(dim=0)
            params[n].copy_(w.to(params[n].device, params[n].dtype))
        del theirs
        for k, g in grams.items():
            out[k] = g
        report(ctx.progress, (li + 1) / len(layers), f"regmean++: layer {li} merged")
    return {path: tr for path, (_, tr) in lin_all.items()}


def _regmean(job: TensorJob) -> torch.Tensor:
    g = job.prepared
    if isinstance(g, Gram) and job.base.dim() == 2:
        return regmean_solve(job.finetuned, list(g.grams.to(job.base.device)), job.params["alpha"], g.transposed)
    return torch.stack(job.finetuned).mean(dim=0)


def _params(alpha: float) -> tuple:
    return (ParamSpec("alpha", "float", alpha, "Scale α of the Grams' off-diagonal entries (1: plain RegMean; "
                      "0: a diagonal, per-input-feature weighting).", UNIT),
            ParamSpec("samples", "int", DEFAULT_SAMPLES, "Probe pairs per task whose inputs give the Grams.",
                      (1, 100000)),
            ParamSpec("tasks", "str", "", "Task of each model, comma-separated in model order (default: the task "
                      "named like the model)."))


def _prepare_memory(models: float) -> Any:
    """The prepare phase on the CPU in bytes (`WorkingMemory.prepare`): the model and the forward passes, `models`
    model sizes (float32; measured by bench/prepare_memory.py on a 42M Llama — regmean 2.2, regmean_pp 2.3 — and
    rounded up), and the Grams, which the formula needs whole: d_in² float32 entries per linear layer and
    fine-tune (`linear_inputs` = Σ d_in²)."""
    def parts(model: int, n_models: int, linear_inputs: int) -> dict[str, int]:
        return {"model and forward passes": int(models * model), "Gram matrices": n_models * linear_inputs * 4}
    return parts


method("regmean", "RegMean: per linear layer, the weights that best reproduce every model's outputs on its task's inputs.",
       _params(0.6), prepare=lambda ctx: regmean_grams(ctx, False), needs_pool=True, in_place=False,
       formula="W* = (Σt G̃t)⁻¹·Σt G̃t·Wt per linear layer; mean of the θt elsewhere",
       memory=WorkingMemory((1.0, 3.3), prepare=_prepare_memory(2.3)),
       title="RegMean",
       paper="Jin et al., Dataless knowledge fusion by merging weights of language models (arXiv 2212.09849)")(_regmean)
method("regmean_pp", "RegMean++: RegMean with each layer's inputs taken from the merged model's earlier layers.",
       _params(0.95), prepare=lambda ctx: regmean_grams(ctx, True), needs_pool=True, in_place=False,
       formula="W* = (Σt G̃t)⁻¹·Σt G̃t·Wt, Xt through the merged layers < ℓ; mean elsewhere",
       memory=WorkingMemory((4.7, 1.9), prepare=_prepare_memory(2.4)),
       title="RegMean++", paper="RegMean++ (arXiv 2508.03121)")(_regmean)
