"""Weights built through the registry, for analyses that evaluate many models made from the same checkpoints.

- `TensorMerger`: a registered method with fixed parameters as a function of one tensor,
  `merger(name, θ0, θ1, …) → θ` — exactly what `forgetlab merge` writes for that tensor (the same TensorJob,
  the same reference or CPU kernel), so a sweep point, an attribution cell and a merge agree bit for bit.
- `WorkingCopy`: ONE mutable model whose parameters are rewritten in place by a merger, tensor by tensor
  (never the pool's cached models, never a second copy per point). It is made from a loaded model
  (`WorkingCopy.of`: linearity, slwm) or loaded from a pool's base (`WorkingCopy.load`: sweeps, with
  accelerate device maps and offloading).
"""
from __future__ import annotations

import copy
import tempfile
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import torch

from forgetlab.core.checkpoints import SafetensorsCheckpoint, load_model
from forgetlab.core.devicemap import ParamAccess, Placement
from forgetlab.core.errors import ForgetlabError, IncompatibleModelsError, ParameterError
from forgetlab.core.layouts import skeleton
from forgetlab.merge.layers import layer_locator, num_layers_of
from forgetlab.merge.registry import TensorJob, get_method, validate_params


class TensorMerger:
    """Merge method `method` with `params` (validated for `n_models` models) as a function of one tensor.

    `merger(name, base, *finetuned)` returns the merged float32 tensor of `name`; the tensors it is given become
    the job's own (methods work in place), so pass tensors nobody else reads, or `owned=False` to have them
    copied first. Methods that need a global first pass or prepared coefficients cannot be applied tensor by
    tensor and are refused. `config` and `names` give layer positions (HMA, submodule_alpha)."""

    def __init__(self, method: str, params: Mapping[str, Any] | None = None, *, n_models: int = 1, config=None,
                 names: Sequence[str] = (), device: str = "cpu"):
        self.spec = get_method(method)
        self.params = validate_params(self.spec, dict(params or {}), n_models=n_models)
        if self.spec.needs_global_pass(self.params) or self.spec.needs_pool:
            raise ParameterError(f"{method} with these settings needs statistics over the whole model (or a pool), "
                                 "so it cannot be applied one tensor at a time; use forgetlab.merge.run.")
        self.locate = layer_locator(config)
        self.num_layers = num_layers_of(config, names)
        self.device = device

    def __call__(self, name: str, base: torch.Tensor, *finetuned: torch.Tensor, owned: bool = True) -> torch.Tensor:
        if not owned and self.spec.in_place:
            base, finetuned = base.clone(), tuple(t.clone() for t in finetuned)
        job = TensorJob(name=name, base=base, finetuned=list(finetuned), params=self.params, layer=self.locate(name),
                        num_layers=self.num_layers, device=self.device)
        return self.spec.apply(job)

    def __getstate__(self) -> dict:   # pickled for Ray workers: the method by name, re-resolved there
        return {**self.__dict__, "spec": self.spec.name}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.spec = get_method(state["spec"])


class LazyTensors(Mapping):
    """A read-only mapping name → tensor that reads each tensor from a checkpoint when asked (float32, moved to
    `device` when one is given; `alias` maps a name to the one the checkpoint stores it under, for tied
    parameters). A read may share memory with the checkpoint's memory map: never write into it."""

    def __init__(self, ckpt, names: Sequence[str], device=None, alias: Optional[dict[str, str]] = None):
        self.ckpt = ckpt
        self._names = list(names)
        self._set = set(names)
        self.device = device
        self._alias = alias or {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._set:
            raise KeyError(name)
        t = self.ckpt.read(self._alias.get(name, name), dtype=torch.float32)
        return t if self.device is None else t.to(self.device)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._set


def stored_params(ckpt, model, device=None) -> Optional[LazyTensors]:
    """The parameters of `model` (named as `model.named_parameters(remove_duplicate=False)` names them) read
    lazily from the checkpoint `ckpt`, when those reads are exactly what loading `ckpt` in float32 gives: a
    safetensors folder that stores every parameter under the model's name and shape (a tied alias through the
    name stored). None otherwise (an adapter, a GGUF or .bin file, renamed tensors): then load the model."""
    if type(ckpt) is not SafetensorsCheckpoint:
        return None
    infos = ckpt.infos()
    params = dict(model.named_parameters(remove_duplicate=False))
    stored = {id(p): n for n, p in reversed(list(params.items()))}
    for name, p in params.items():
        info = infos.get(stored[id(p)])
        if info is None or tuple(info.shape) != tuple(p.shape):
            return None
    return LazyTensors(ckpt, list(params), device, alias={n: stored[id(p)] for n, p in params.items()})


class PartlyStored(Mapping):
    """A read-only mapping name → float32 tensor: the names a checkpoint stores as they are read lazily from it
    (`LazyTensors`), the others (renamed or fused on load, e.g. a MoE's experts) held as loaded."""

    def __init__(self, lazy: LazyTensors, loaded: dict[str, torch.Tensor], names: Sequence[str]):
        self.lazy, self.loaded, self._names = lazy, loaded, list(names)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.loaded[name] if name in self.loaded else self.lazy[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self.loaded or name in self.lazy


def checkpoint_params(ckpt, model, names: Sequence[str]) -> Mapping[str, torch.Tensor]:
    """The parameters `names` of `model` as the checkpoint `ckpt` holds them, in float32: read lazily where a
    safetensors folder stores a parameter under the model's name and shape; the others (a checkpoint whose names
    transformers converts on load: a MoE's per-expert tensors fused into 3-D ones, GPT-NeoX's ``embed_out``, or a
    .bin/GGUF file) taken from the checkpoint loaded once on the CPU, keeping only those tensors (they stay in
    memory: for a MoE most of the model). IncompatibleModelsError when the checkpoint lacks one of them."""
    infos = ckpt.infos() if type(ckpt) is SafetensorsCheckpoint else {}
    params = dict(model.named_parameters(remove_duplicate=False))
    lazy = [n for n in names if n in infos and tuple(infos[n].shape) == tuple(params[n].shape)]
    rest = [n for n in names if n not in set(lazy)]
    if not rest:
        return LazyTensors(ckpt, names)
    full = dict(load_model(ckpt, device="cpu", dtype=torch.float32).named_parameters(remove_duplicate=False))
    for n in rest:
        if n not in full or tuple(full[n].shape) != tuple(params[n].shape):
            raise IncompatibleModelsError(f"Parameter {n} of the model is not stored in {ckpt.ref}; the checkpoint "
                                          "does not match its config.")
    loaded = {n: full[n].detach() for n in rest}
    del full
    return PartlyStored(LazyTensors(ckpt, lazy), loaded, names)


def renamed_numel(ckpt) -> int:
    """Entries of the parameters `checkpoint_params` holds in memory for `ckpt` (those its model names otherwise
    than the checkpoint, e.g. a MoE's fused experts), from headers and the model built on the meta device; 0 when
    every parameter is stored under its name, or when that cannot be read."""
    if type(ckpt) is not SafetensorsCheckpoint:
        return 0
    try:
        model = skeleton(ckpt.config)
        infos = ckpt.infos()
    except (ForgetlabError, OSError, ValueError):
        return 0
    return sum(p.numel() for n, p in model.named_parameters()
               if n not in infos or tuple(infos[n].shape) != tuple(p.shape))


class WorkingCopy:
    """One model whose parameters are rewritten in place with weights built by a `TensorMerger`.

    `base` maps every parameter name to θ0 (a dict of tensors, or `LazyTensors` read from a checkpoint);
    `set(merger, targets, names)` writes merger(name, θ0, θ1, …) into the parameters `names` (all when None),
    θt read from the mappings `targets`. Writes go through `forgetlab.core.devicemap.ParamAccess`, so a copy
    spread by an accelerate device map (GPUs, CPU, disk) is written where accelerate keeps each weight.
    `names` lists each stored parameter once (tied weights once), `params` every name (tied ones twice)."""

    def __init__(self, model, base: Mapping[str, torch.Tensor], *, offload_dir=None):
        self.model = model
        self.base = base
        self.access = ParamAccess(model)
        self.params = dict(model.named_parameters(remove_duplicate=False))
        self.names = [n for n, _ in model.named_parameters()]
        first = {id(p): n for n, p in reversed(list(self.params.items()))}
        self._stored = {n: first[id(p)] for n, p in self.params.items()}   # a tied alias → the name stored
        self.modules = dict(model.named_modules())
        self._offload_dir = offload_dir       # a TemporaryDirectory removed with the copy

    @classmethod
    def of(cls, base_model) -> "WorkingCopy":
        """A deep copy of a loaded model (in eval mode) with θ0 = its parameters; the model itself is untouched."""
        base = {n: p.detach() for n, p in base_model.named_parameters(remove_duplicate=False)}
        return cls(copy.deepcopy(base_model).eval(), base)

    @classmethod
    def load(cls, pool, model: str, device=None, dtype=None) -> "WorkingCopy":
        """The pool's base loaded afresh (never the pool's cached model) as a working copy for fine-tuned model
        `model`, with θ0 and θt read from the checkpoints (`checkpoint_params`: lazily where names match). `device` may be a
        `forgetlab.core.devicemap.Placement` (an offload folder of the copy's own is made when it names none);
        `dtype` (default float32) is the copy's precision: merged tensors are computed in float32 and rounded
        once when written."""
        if model == "base":
            raise ParameterError("Sweeps need a fine-tuned model; 'base' has no task vector. Pick one of: "
                                 f"{', '.join(pool.model_names) or 'none (add one to the pool)'}.")
        base_ck, tuned_ck = pool.checkpoint("base"), pool.checkpoint(model)
        offload = None
        if isinstance(device, Placement) and not device.offload_folder:
            offload = tempfile.TemporaryDirectory(prefix="forgetlab-offload-")
            device = Placement(device.device_map, device.max_memory, offload.name)
        loaded = load_model(base_ck, device=device, dtype=dtype or torch.float32)
        names = [n for n, _ in loaded.named_parameters()]
        work = cls(loaded, checkpoint_params(base_ck, loaded, names), offload_dir=offload)
        work.tuned = checkpoint_params(tuned_ck, loaded, names)
        return work

    @torch.no_grad()
    def set(self, merger: TensorMerger, targets: Sequence[Mapping[str, torch.Tensor]],
            names: Optional[Iterable[str]] = None) -> None:
        """Write merger(name, θ0, θ1, …) into the parameters `names` (default: every stored parameter). `merger` is a
        TensorMerger, or any function of (name, θ0, θ1, …) that leaves its inputs as they are."""
        todo = self.names if names is None else list(dict.fromkeys(self._stored[n] for n in names))
        for name in todo:
            tensors = (self.base[name], *[t[name] for t in targets])
            # the reads are shared (the base model's own tensors, or a checkpoint's memory map): a method that
            # works in place gets copies
            new = merger(name, *tensors, owned=False) if isinstance(merger, TensorMerger) else merger(name, *tensors)
            if tuple(new.shape) != tuple(self.params[name].shape):
                raise IncompatibleModelsError(f"Tensor {name}: new value has shape {tuple(new.shape)}, "
                                              f"the model expects {tuple(self.params[name].shape)}.")
            self.access.write(name, new)
            del new

    def lerp(self, target: Mapping[str, torch.Tensor], alpha: float, names: Optional[Iterable[str]] = None) -> None:
        """Set the parameters `names` to WiSE-FT θ0 + α·(θt − θ0), θt from `target` (the `wise_ft` method)."""
        self.set(TensorMerger("wise_ft", {"alpha": float(alpha)}), [target], names)

    def module(self, path: str):
        """The working copy's module at `path`."""
        return self.modules[path]
