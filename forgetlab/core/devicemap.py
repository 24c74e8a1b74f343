"""Models larger than one device: accelerate device maps (`device_map="auto"` with `max_memory`), and
in-place weight writes that also reach offloaded weights.

`Placement(device_map="auto", max_memory={0: "70GiB", 1: "70GiB", "cpu": "200GiB"}, offload_folder=…)` can be
given wherever forgetlab takes a `device` for loading a model to evaluate (`forgetlab.core.checkpoints.load_model`,
the sweeps' working copy): transformers/accelerate spread the layers over the GPUs, then the CPU, then disk.
Merges need no placement: they stream tensor by tensor from disk whatever the model's size.

A sweep rewrites its working copy in place for every point. On a dispatched model a parameter on a device is
written with `copy_`; an offloaded one (on the `meta` device, its value held by accelerate's hook) is written
into the hook's storage: the CPU copy in place, or a `.dat` file in the working copy's own offload folder (the
index entry is repointed there, so the checkpoint on disk is never touched). `ParamAccess` does both, and reads
the current values back (for D(θ, θ0)).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

import torch

from forgetlab.core.errors import ParameterError


@dataclass
class Placement:
    """How to place a model that may not fit one device (passed to `from_pretrained` through accelerate).

    `device_map`: "auto" (GPUs in order, then CPU, then disk), "balanced", "sequential" or an explicit dict;
    `max_memory`: per device, e.g. ``{0: "20GiB", "cpu": "64GiB"}`` (ints are bytes); `offload_folder`: where
    weights that fit nowhere go (default: a temporary folder owned by the working copy).
    """

    device_map: Any = "auto"
    max_memory: Optional[dict] = None
    offload_folder: Optional[str] = None

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for transformers' `from_pretrained`."""
        kw: dict[str, Any] = {"device_map": self.device_map}
        if self.max_memory:
            kw["max_memory"] = self.max_memory
        if self.offload_folder:
            kw["offload_folder"] = str(self.offload_folder)
        return kw


def parse_max_memory(text: str) -> dict:
    """``"0=20GiB,1=20GiB,cpu=64GiB"`` → ``{0: "20GiB", 1: "20GiB", "cpu": "64GiB"}`` (ParameterError if malformed)."""
    out: dict = {}
    for part in [p.strip() for p in str(text).split(",") if p.strip()]:
        key, sep, value = part.partition("=")
        if not sep or not value.strip():
            raise ParameterError(f"--max-memory takes DEVICE=SIZE pairs such as 0=20GiB,cpu=64GiB; got {part!r}.")
        key = key.strip()
        value = value.strip()
        out[int(key) if key.isdigit() else key] = int(value) if value.isdigit() else value
    if not out:
        raise ParameterError("--max-memory is empty; give DEVICE=SIZE pairs such as 0=20GiB,cpu=64GiB.")
    return out


PLACEMENTS = ("auto", "balanced", "sequential")
"""The device maps a command takes by name (`--device-map`)."""
DEVICE_MAP_HELP = ("spread a model that does not fit one device over the GPUs, then CPU, then disk (accelerate); "
                   "overrides --device")
MAX_MEMORY_HELP = "memory per device for --device-map, e.g. 0=70GiB,1=70GiB,cpu=200GiB"


def placement_for(device: Optional[str], device_map: Optional[str] = None, max_memory: Optional[str] = None):
    """Where a job puts its model: `device`, or a `Placement` when a device map is named (`max_memory` written
    as `parse_max_memory` reads it); ParameterError for a memory limit without a device map."""
    if device_map:
        return Placement(device_map, parse_max_memory(max_memory) if max_memory else None)
    if max_memory:
        raise ParameterError("--max-memory needs --device-map auto (or balanced / sequential).")
    return device


def _hook_map(module):
    """The accelerate weights map of a module's hook (None when its weights are not offloaded)."""
    hook = getattr(module, "_hf_hook", None)
    for h in getattr(hook, "hooks", [hook]) if hook is not None else []:
        if getattr(h, "offload", False) and getattr(h, "weights_map", None) is not None:
            return h.weights_map
    return None


class ParamAccess(Mapping):
    """Read and write a model's parameters by name, whether they sit on a device or are offloaded by accelerate.

    As a Mapping it gives each parameter's current value (float32, on the CPU for offloaded ones). Tied weights
    are one parameter under the first name `named_parameters` gives.
    """

    def __init__(self, model):
        self.model = model
        self._writers: dict[str, list[Callable[[torch.Tensor], None]]] = {}
        self._readers: dict[str, Callable[[], torch.Tensor]] = {}
        canonical = {id(p): n for n, p in model.named_parameters()}
        for mname, module in model.named_modules():
            wmap = None
            for pname, p in module.named_parameters(recurse=False):
                name = canonical.get(id(p))
                if name is None:
                    continue
                if p.device.type != "meta":
                    self._writers.setdefault(name, []).append(self._device_writer(p))
                    self._readers.setdefault(name, lambda p=p: p.detach())
                    continue
                wmap = wmap if wmap is not None else _hook_map(module)
                if wmap is None:
                    raise ParameterError(f"Parameter {name} is on the meta device without an accelerate offload "
                                         "hook; the model was not loaded with a device map.")
                key = f"{wmap.prefix}{pname}"
                self._writers.setdefault(name, []).append(self._offload_writer(wmap.dataset, key))
                self._readers.setdefault(name, lambda d=wmap.dataset, k=key: d[k])
        self._names = list(canonical.values())

    @staticmethod
    def _device_writer(p) -> Callable[[torch.Tensor], None]:
        def write(value: torch.Tensor) -> None:
            with torch.no_grad():
                p.copy_(value.to(device=p.device, dtype=p.dtype))
        return write

    @staticmethod
    def _offload_writer(loader, key: str) -> Callable[[torch.Tensor], None]:
        from accelerate.utils import offload_weight

        def write(value: torch.Tensor) -> None:
            if key in getattr(loader, "state_dict", {}):              # offloaded to the CPU: a tensor in memory
                held = loader.state_dict[key]
                held.copy_(value.to(device=held.device, dtype=held.dtype))
                return
            info = loader.index[key]
            dtype = getattr(torch, str(info.get("dtype", "float32")).replace("torch.", ""))
            # a .dat of our own (never the checkpoint's safetensors file); the loader reads it at every forward
            offload_weight(value.detach().to("cpu", dtype), key, loader.save_folder, index=loader.index)
        return write

    def write(self, name: str, value: torch.Tensor) -> None:
        """Set parameter `name` (every alias of a tied weight) to `value`."""
        for w in self._writers[name]:
            w(value)

    @property
    def offloaded(self) -> bool:
        """True when some parameter is offloaded (on the meta device)."""
        return any(p.device.type == "meta" for p in self.model.parameters())

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._readers[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
