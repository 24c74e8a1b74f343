"""The registry of merge methods: one name per method, used by the recipe YAML, the CLI, the app and the docs.

`METHODS` (a `forgetlab.core.registry.Registry`) maps a name to its `MethodSpec`: parameters (`ParamSpec`: name, type, default, range or choices,
help), a one-line description, and how it merges one tensor (`merge(job: TensorJob) -> Tensor`). The app
builds its forms from it; `validate_params` checks user input against it.

Hooks for methods that need more than the tensors of one name:

- **Global first pass** — `collector(n_tasks, total_entries, params) -> StatsCollector` (see
  `forgetlab.merge.select.RadixSelect`): the engine streams every tensor through the collector for `collector.passes`
  sweeps before merging and hands `collector.result()` to every `TensorJob` as `job.stats`. Used by
  `ties` with scope="global" and `pcb` with scope="global"; `MethodSpec.needs_global_pass(params)` says
  when it applies.
- **Prepared coefficients from a pool** — `prepare(ctx: PrepareContext) -> Mapping[str, Any]`: called once
  before the merge with the model pool (its models and probe data), the opened checkpoints and the
  validated parameters; it returns per-tensor coefficients keyed by tensor name (e.g. the weights a_j of
  submodule-linearity merging for every parameter of a submodule). The engine passes
  `prepared.get(name)` to the job as `job.prepared`. `merge_state_dicts(..., prepared=...)` accepts
  coefficients computed beforehand, and `forgetlab.merge.run(..., pool=...)` calls `prepare` itself.
  A method with `prepare` sets `needs_pool=True`.

A method is one file in `forgetlab/merge/methods/` (its family): the reference tensor function registered
with the `@method(...)` decorator, and where it pays a CPU kernel registered with `@fast_kernel(name)` — the
same result, computed in place block by block on float32 CPU tensors (`MethodSpec.apply` picks it, see
`forgetlab.merge.select.on_cpu_fast_path`). The registry finds the methods itself: asking for a name imports its
family's module (every module of forgetlab.merge.methods when no module has the method's name), so no module is
imported only to register its methods. Other modules may also `register(MethodSpec(...))` directly (a name can be
registered once). Formulas: docs/methods.md.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

from forgetlab.core.errors import ParameterError
from forgetlab.core.registry import Registry
from forgetlab.merge.select import on_cpu_fast_path

_GREEK = {"α": "alpha", "β": "beta", "γ": "gamma", "λ": "lambda", "τ": "tau"}   # spelt out in folder names


def tensor_generator(seed: int, name: str, index: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator for one (tensor, model) pair, seeded from sha256(seed, index, name).

    Seeding per tensor makes a DARE mask independent of the order in which tensors are visited, so a
    streamed merge and an in-memory merge draw the same masks; the same seed gives the same masks.
    """
    digest = hashlib.sha256(f"{int(seed)}\x00{int(index)}\x00{name}".encode("utf-8")).digest()
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return gen


class StatsCollector(Protocol):
    """A global first pass: `passes` sweeps over every tensor, then `result()`."""

    passes: int

    def add(self, pass_index: int, name: str, base: torch.Tensor, taus: Sequence[torch.Tensor]) -> None: ...

    def end_pass(self, pass_index: int) -> None: ...

    def result(self) -> Any: ...


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of a method.

    type: "float" | "int" | "str" | "bool" | "floats" (a list of floats).
    range: inclusive (low, high) bounds for numbers (each element for "floats"); choices for "str".
    per_model: the value may be one number per fine-tuned model (a scalar applies to all); recipes give it
    per model under `model_key` (e.g. `weight` for `weights`).
    """

    name: str
    type: str
    default: Any
    help: str
    range: tuple[float, float] | None = None
    choices: tuple[str, ...] | None = None
    per_model: bool = False
    model_key: str | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "type": self.type, "default": self.default, "help": self.help,
                "range": list(self.range) if self.range else None,
                "choices": list(self.choices) if self.choices else None, "per_model": self.per_model}


@dataclass
class TensorJob:
    """Everything a method needs to merge one named tensor (float32 on `device`)."""

    name: str
    base: torch.Tensor
    finetuned: list[torch.Tensor]
    params: dict[str, Any]
    stats: Any = None
    prepared: Any = None
    layer: Any = "first"
    num_layers: int = 1
    device: str = "cpu"
    adapters: tuple[bool, ...] = ()  # per fine-tuned model: True for a LoRA adapter (τ = its low-rank ΔW)

    def is_adapter(self, index: int) -> bool:
        """Whether fine-tuned model `index` is a LoRA adapter."""
        return index < len(self.adapters) and bool(self.adapters[index])

    @cached_property
    def taus(self) -> list[torch.Tensor]:
        """Task vectors τt = θt − θ0 of this tensor."""
        return [ft - self.base for ft in self.finetuned]

    def take_taus(self) -> list[torch.Tensor]:
        """Task vectors computed in place in the fine-tuned tensors (which the job owns): saves one copy per
        model. `finetuned` then holds the task vectors too, so call this only if the method needs no θt."""
        if "taus" not in self.__dict__:
            for ft in self.finetuned:
                ft.sub_(self.base)
            self.__dict__["taus"] = self.finetuned
        return self.__dict__["taus"]

    def generator(self, index: int) -> torch.Generator:
        """The seeded generator of model `index` for this tensor (see sparsify.tensor_generator)."""
        return tensor_generator(int(self.params.get("seed", 0)), self.name, index, self.device)


@dataclass
class PrepareContext:
    """What a `prepare` hook receives: the pool, the opened checkpoints and the validated parameters."""

    pool: Any
    base: Any
    models: list[Any]
    model_names: list[str]
    params: dict[str, Any]
    progress: Any = None


REQUIRED = object()
"""The default of a mergekit parameter that mergekit requires (no default in its method's signature)."""


@dataclass(frozen=True)
class MkParam:
    """One mergekit parameter of a method: its forgetlab parameter (None: accepted, no effect), whether mergekit
    takes it per model and whether forgetlab does, value converters and mergekit's default. `collapse`: per-model
    values that agree are imported as one value (the sparsity knobs of the older methods, so that their recipes
    read as before); `ignored`: mergekit reads the parameter and ignores it — why, for the notice an imported
    recipe carries (`Recipe.notes`)."""

    mk: str
    fl: str | None
    mk_per_model: bool
    fl_per_model: bool
    default: Any = REQUIRED
    to_fl: Callable[[Any], Any] = lambda v: v
    to_mk: Callable[[Any], Any] = lambda v: v
    collapse: bool = False
    ignored: str | None = None


MERGEKIT_BASE = ("required", "ignored", "optional")


@dataclass(frozen=True)
class MergekitSpec:
    """How mergekit 0.1.5 names and reads a method (forgetlab.merge.mergekit_params; docs/merging.md), declared
    with the method.

    `name`: mergekit's merge_method (a recipe of that name is imported as this method). `base`: mergekit's base
    policy (its InputContract): "required"; "ignored" (base_model is one more input if given: it is averaged in);
    "optional" (without base_model the models themselves are interpolated). `params`: mergekit's parameter table
    by mergekit name, for the methods forgetlab had before mergekit's others (their own names for the sparsity
    knob); None: made from the method's parameters (mergekit's `lambda` is `lam`, a per-model parameter is
    given under its `model_key`, every other keeps its name), with `required` (the parameters mergekit requires),
    `int8_mask` (mergekit reads int8_mask, which only sets the dtype of a sign mask: no effect on the result) and
    `ignored` (parameters published configs give the method and mergekit ignores: accepted, with a notice)."""

    name: str
    base: str = "required"
    params: Mapping[str, MkParam] | None = None
    required: tuple[str, ...] = ()
    int8_mask: bool = False
    ignored: tuple[MkParam, ...] = ()

    def __post_init__(self):
        if self.base not in MERGEKIT_BASE:
            raise ParameterError(f"internal: mergekit base policy {self.base!r} of {self.name} is not one of "
                                 f"{', '.join(MERGEKIT_BASE)}.")


@dataclass(frozen=True)
class WorkingMemory:
    """What a method holds while it merges one tensor, beyond the tensors it reads (`forgetlab.merge.memory`):
    a + b·N float32 tensors of that tensor's size for N fine-tuned models, as (a, b), measured on the CPU at N = 2
    and 3 by `bench/merge_memory.py` (its table is in docs/scaling.md) and rounded up by 0.1.

    `fast`: what the CPU kernels hold (`MethodSpec.fast`, the path a float32 merge on the CPU takes; for a method
    without kernels, its reference function). `reference`: what the reference functions hold, the path on a GPU
    (measured on the CPU with the kernels turned off: `bench/merge_memory.py --reference`); None: as `fast`.
    `prepare`: for a method that prepares coefficients from a pool, the parts of that phase on the CPU,
    `prepare(model_bytes, n_models, linear_inputs) -> {part: bytes}` (the model's float32 bytes, the fine-tunes,
    Σ d_in² over the decoder's linear layers), measured by `bench/prepare_memory.py`."""

    fast: tuple[float, float]
    reference: tuple[float, float] | None = None
    prepare: Callable[[int, int, int], dict[str, int]] | None = None

    def units(self, n_models: int, *, reference: bool = False) -> float:
        """a + b·N for `n_models` fine-tuned models, on the reference path (a GPU's) or the CPU kernels'."""
        a, b = (self.reference or self.fast) if reference else self.fast
        return a + b * n_models


@dataclass(frozen=True)
class MethodSpec:
    """A registered merge method: name, one-line description, parameters, its reference per-tensor function
    `merge` and, optionally, `fast`: a CPU kernel giving the same tensor (None when it does not apply)."""

    name: str
    description: str
    params: tuple[ParamSpec, ...]
    merge: Callable[[TensorJob], torch.Tensor]
    min_models: int = 1
    max_models: int | None = None
    collector: Callable[[int, int, dict], Any] | None = None
    global_when: Callable[[dict], bool] | None = None
    prepare: Callable[[PrepareContext], Mapping[str, Any]] | None = None
    needs_pool: bool = False
    check: Callable[[dict, int], None] | None = None
    mergekit: MergekitSpec | None = None   # the mergekit method it computes and how mergekit names its parameters
    formula: str = ""
    needs_layers: bool = False  # the merge uses job.layer / job.num_layers (the engine then reads the config)
    extra: dict = field(default_factory=dict)
    fast: Callable[[TensorJob], torch.Tensor | None] | None = None
    in_place: bool = True       # False: the method only reads the job's tensors (callers need not copy them)
    # whether θ0 is an input of the merge (True, or a function of the parameters, e.g. multislerp's use_base);
    # a method without one takes config and tokenizer from its first model when a recipe names no base
    base_input: bool | Callable[[dict], bool] = True
    # its working memory (a + b·N tensors of the largest tensor's size) and any prepare phase's parts, as measured;
    # None: not measured (forgetlab.merge.memory then assumes the largest measured)
    memory: WorkingMemory | None = None
    title: str = ""             # its name in the app's words ("weight average", "Iso-C"); "" = the registry name
    paper: str = ""             # where the method comes from, in short ("Ilharco et al., … (ICLR 2023)"); "" = none

    @property
    def display_name(self) -> str:
        """What the app calls the method: its declared title, else its registry name."""
        return self.title or self.name

    @property
    def slug(self) -> str:
        """The display name as a folder-name part: lower case, Greek letters spelt out, "++" as "pp" and "+" as
        "plus", every other run of non-alphanumerics one "-" ("weight average" → "weight-average", "RegMean++" →
        "regmeanpp", "Iso-C" → "iso-c")."""
        text = self.display_name.lower().replace("++", "pp").replace("+", "plus")
        for letter, word in _GREEK.items():
            text = text.replace(letter, f" {word} ")
        return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or self.name

    def apply(self, job: TensorJob) -> torch.Tensor:
        """The merged tensor of one job: the CPU kernel when there is one and the job's tensors are float32 on
        the CPU (and it applies to these parameters), else the reference function."""
        if self.fast is not None and on_cpu_fast_path(job.base, *job.finetuned):
            merged = self.fast(job)
            if merged is not None:
                return merged
        return self.merge(job)

    @property
    def param_names(self) -> list[str]:
        return [p.name for p in self.params]

    def param(self, name: str) -> ParamSpec:
        for p in self.params:
            if p.name == name:
                return p
        raise ParameterError(f"{self.name} has no parameter {name!r}; its parameters are "
                             f"{', '.join(self.param_names) or '(none)'}.")

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def needs_global_pass(self, params: Mapping[str, Any] | None = None) -> bool:
        """True when the method takes a global first pass with these parameters (e.g. scope="global")."""
        if self.collector is None:
            return False
        if self.global_when is None:
            return True
        return bool(self.global_when({**self.defaults(), **dict(params or {})}))

    def needs_base(self, params: Mapping[str, Any] | None = None) -> bool:
        """Whether the merge reads the base's weights θ0 with these parameters (defaults filled in); without it a
        recipe may leave out `base` (the weighted average `linear`, `karcher`, multislerp with use_base false)."""
        if callable(self.base_input):
            return bool(self.base_input({**self.defaults(), **dict(params or {})}))
        return bool(self.base_input)

    @property
    def global_pass(self) -> bool:
        """Whether the method needs a global first pass with its default parameters."""
        return self.needs_global_pass({})

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "formula": self.formula,
                "params": [p.to_dict() for p in self.params], "min_models": self.min_models,
                "max_models": self.max_models, "global_pass": self.global_pass,
                "needs_pool": self.needs_pool, "mergekit": self.mergekit.name if self.mergekit else None,
                "title": self.display_name, "paper": self.paper}


METHODS: Registry[MethodSpec] = Registry("merge method", "forgetlab.merge.methods")
"""Every merge method by name. Each is declared in its family's module of forgetlab.merge.methods (`@method`,
`@fast_kernel`), which the registry imports on the first lookup of a name it does not hold."""


def register(spec: MethodSpec) -> MethodSpec:
    """Add a method to METHODS under `spec.name` (a name can be registered only once)."""
    return METHODS.add(spec.name, spec)


def method(name: str, description: str, params: Sequence[ParamSpec] = (), **options) -> Callable:
    """Decorator: register the decorated function (TensorJob → merged tensor) as the reference of merge method
    `name`; `options` are MethodSpec's other fields (formula, mergekit, memory, check, collector, …)."""
    def decorate(fn: Callable[[TensorJob], torch.Tensor]) -> Callable[[TensorJob], torch.Tensor]:
        register(MethodSpec(name, description, tuple(params), fn, **options))
        return fn
    return decorate


def method_title(name: str) -> str:
    """The display name of the registered method `name` (`MethodSpec.display_name`); `name` itself when no method
    of that name is registered (a saved merge of a method that no longer exists still gets a label)."""
    spec = METHODS.find(name)
    return spec.display_name if spec is not None else name


def fast_kernel(name: str) -> Callable:
    """Decorator: register the decorated function as the CPU kernel of the already registered method `name`.
    It returns the same tensor as the reference (tests compare them), or None where it does not apply."""
    def decorate(fn: Callable[[TensorJob], torch.Tensor | None]) -> Callable[[TensorJob], torch.Tensor | None]:
        METHODS.replace(name, replace(METHODS.get(name), fast=fn))
        return fn
    return decorate


def get_method(name: str) -> MethodSpec:
    """The MethodSpec called `name` (its module imported on first use), or a ParameterError listing the registered
    methods."""
    return METHODS.get(name)


def _number(spec_name: str, p: ParamSpec, value: Any, integer: bool) -> float | int:
    if isinstance(value, bool):
        raise ParameterError(f"{spec_name}: {p.name} must be a number; got {value!r}.")
    try:
        v = int(value) if integer else float(value)
        if integer and float(value) != v:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        kind = "an integer" if integer else "a number"
        raise ParameterError(f"{spec_name}: {p.name} must be {kind}; got {value!r}.") from None
    if not integer and not math.isfinite(v):
        raise ParameterError(f"{spec_name}: {p.name} must be finite; got {value!r}.")
    if p.range is not None and not (p.range[0] <= v <= p.range[1]):
        raise ParameterError(f"{spec_name}: {p.name} must lie in [{p.range[0]}, {p.range[1]}]; got {v}. "
                             f"{p.help}")
    return v


def _coerce(spec_name: str, p: ParamSpec, value: Any, n_models: int | None) -> Any:
    if p.per_model and isinstance(value, (list, tuple)):
        if n_models is not None and len(value) != n_models:
            raise ParameterError(f"{spec_name}: {p.name} has {len(value)} values for {n_models} fine-tuned "
                                 "models; give one per model or a single number for all.")
        return [_coerce(spec_name, ParamSpec(p.name, p.type, p.default, p.help, p.range, p.choices), v, None)
                for v in value]
    if p.type == "float":
        v = _number(spec_name, p, value, integer=False)
        return [v] * n_models if (p.per_model and n_models is not None) else v
    if p.type == "int":
        return _number(spec_name, p, value, integer=True)
    if p.type == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ParameterError(f"{spec_name}: {p.name} must be true or false; got {value!r}.")
    if p.type == "str":
        if p.choices and value not in p.choices:
            raise ParameterError(f"{spec_name}: {p.name} must be one of {', '.join(p.choices)}; got {value!r}.")
        return str(value)
    if p.type == "floats":
        if isinstance(value, str):
            value = [x for x in value.replace(",", " ").split() if x]
        if not isinstance(value, (list, tuple)) or not value:
            raise ParameterError(f"{spec_name}: {p.name} must be a non-empty list of numbers; got {value!r}.")
        return [_number(spec_name, p, v, integer=False) for v in value]
    raise ParameterError(f"internal: unknown parameter type {p.type!r} for {p.name}.")


def validate_params(method: str | MethodSpec, params: Mapping[str, Any], n_models: int | None = None) -> dict:
    """Check and complete a method's parameters: unknown names are refused (the message lists the valid
    ones), values are coerced to their type and checked against their range/choices, per-model values are
    expanded to one per model, and missing ones take their defaults; one given as None (a YAML null) is refused
    rather than silently given its default. Also checks the number of models."""
    spec = get_method(method) if isinstance(method, str) else method
    empty = [k for k, v in params.items() if v is None or (isinstance(v, (list, tuple)) and None in v)]
    if empty:
        p = next(q for q in spec.params if q.name == empty[0]) if empty[0] in spec.param_names else None
        default = f", {p.default!r}" if p is not None else ""
        raise ParameterError(f"{spec.name}: {empty[0]} has no value (None, or an empty YAML `{empty[0]}:`); give "
                             f"one, or leave {empty[0]} out to use its default{default}.")
    unknown = [k for k in params if k not in spec.param_names]
    if unknown:
        raise ParameterError(f"{spec.name} has no parameter {', '.join(map(repr, unknown))}; its parameters "
                             f"are {', '.join(spec.param_names) or '(none)'}.")
    if n_models is not None:
        if n_models < 1 and spec.min_models >= 1:
            raise ParameterError(f"{spec.name} needs at least one fine-tuned model; none was given.")
        hint = spec.extra.get("models_hint")  # a method's own advice on how many models it takes, if any
        if n_models < spec.min_models:
            raise ParameterError(f"{spec.name} needs at least {spec.min_models} fine-tuned models; got {n_models}."
                                 + (f" {hint}" if hint else ""))
        if spec.max_models is not None and n_models > spec.max_models:
            raise ParameterError(f"{spec.name} takes at most {spec.max_models} fine-tuned model(s) besides the base; "
                                 f"got {n_models}. " + (hint or "Pick fewer models or another method."))
    out = {}
    for p in spec.params:
        value = params.get(p.name, p.default)
        out[p.name] = _coerce(spec.name, p, value, n_models)
    if spec.check is not None:
        spec.check(out, n_models or 0)
    return out
