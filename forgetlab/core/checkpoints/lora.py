"""PEFT LoRA adapters as checkpoints: an adapter folder read against its base, every adapted weight being
W0 + (α/r)·B·A (with rsLoRA, DoRA-free variants and the tensor kinds PEFT writes; unsupported kinds are refused
by name)."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from forgetlab.core.checkpoints.readers import BinCheckpoint, Checkpoint, SafetensorsCheckpoint
from forgetlab.core.errors import CheckpointError, IncompatibleModelsError
from forgetlab.core.progress import Progress


@dataclass(frozen=True)
class LoraPair:
    """What a PEFT adapter does to one base tensor `target`.

    Plain LoRA: ΔW = scale · B · A (transposed when fan_in_fan_out); on an embedding (lora_embedding_A/B)
    ΔW = scale · (B · A)ᵀ. DoRA (`magnitude` set): W' = m ⊙ (W0 + ΔW) / ‖W0 + ΔW‖, the norm taken per output
    feature (over each row of an nn.Linear weight [out, in]; over each column of a fan_in_fan_out Conv1D weight
    or of an embedding [num_embeddings, dim]), exactly as PEFT's merge. `replacement` names a full tensor that
    the adapter stores for the target (modules_to_save, a saved embedding `base_layer`), which then stands in
    for W0. `bias_of` marks a lora_B bias: Δb = scale · b_B (PEFT's `lora_bias`).
    """

    target: str
    a_name: str | None = None
    b_name: str | None = None
    scale: float = 1.0
    fan_in_fan_out: bool = False
    embedding: bool = False
    magnitude: str | None = None
    replacement: str | None = None
    bias_of: str | None = None

    @property
    def exact_delta(self) -> bool:
        """True when ΔW does not depend on the base weights (plain LoRA, no replacement, no DoRA)."""
        return self.magnitude is None and self.replacement is None


# PEFT LoraConfig switches whose merged weights forgetlab does not reproduce (key → what to call it)
_LORA_UNSUPPORTED = {
    "use_qalora": "QA-LoRA (use_qalora)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens), which changes only tokens after an "
                               "invocation sequence and has no merged weights",
    "layer_replication": "layer replication (layer_replication), which changes the architecture",
    "target_parameters": "LoRA on nn.Parameter targets (target_parameters)",
    "trainable_token_indices": "trainable tokens (trainable_token_indices)",
    "velora_config": "VeLoRA (velora_config)",
    "monteclora_config": "MonteCLoRA (monteclora_config)",
    "use_bdlora": "block-diagonal LoRA (use_bdlora)",
    "arrow_config": "Arrow routing (arrow_config)",
    "kasa_config": "KaSA (kasa_config)",
    "megatron_config": "Megatron parallel layers (megatron_config)",
}
_LORA_TENSOR_KINDS = (
    ("A", re.compile(r"^(.*)\.lora_A(?:\.[^.]+)?\.weight$")),
    ("B", re.compile(r"^(.*)\.lora_B(?:\.[^.]+)?\.weight$")),
    ("B_bias", re.compile(r"^(.*)\.lora_B(?:\.[^.]+)?\.bias$")),
    ("embA", re.compile(r"^(.*)\.lora_embedding_A(?:\.[^.]+)?$")),
    ("embB", re.compile(r"^(.*)\.lora_embedding_B(?:\.[^.]+)?$")),
    ("mag", re.compile(r"^(.*)\.lora_magnitude_vector(?:\.[^.]+)?(?:\.weight)?$")),
    ("saved", re.compile(r"^(.*)\.modules_to_save(?:\.[^.]+)?\.(weight|bias)$")),
    ("saved", re.compile(r"^(.*)\.base_layer\.(weight|bias)$")),
    ("full", re.compile(r"^(.*)\.(weight|bias)$")),
)
_MERGE_IT_YOURSELF = ("Merge it with PEFT (PeftModel.from_pretrained(base, adapter).merge_and_unload()"
                      ".save_pretrained(folder)) and pass the merged folder instead.")


def _lora_number(cfg_file, key: str, value, *, integer: bool):
    """A rank (positive int) or alpha (finite number) from adapter_config.json, else a CheckpointError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if integer:
        ok = ok and float(value).is_integer() and value > 0
    if not ok:
        want = "a positive whole number" if integer else "a finite number"
        raise CheckpointError(
            f"{cfg_file}: {key} is {value!r}, but it must be {want} (the LoRA rank r and lora_alpha set the "
            f"scale lora_alpha / r). Fix {key} in the adapter's config to the value it was trained with.")
    return int(value) if integer else float(value)


class LoraCheckpoint(Checkpoint):
    """A PEFT LoRA adapter applied to a base checkpoint: read(name) = PEFT's merge_and_unload() weight.

    Plain LoRA: read = θ0 + ΔW with ΔW = (lora_alpha / r) · B · A (`lora_alpha / sqrt(r)` with rsLoRA;
    rank_pattern / alpha_pattern matched as PEFT does); LoRA on embeddings (lora_embedding_A/B), DoRA
    (W' = m ⊙ (W0 + ΔW) / ‖W0 + ΔW‖ per output feature), lora_bias and full tensors stored by the adapter
    (modules_to_save such as a trained lm_head, a saved embedding base layer) are applied as PEFT applies
    them. `delta(name)` = read(name) − θ0(name): exactly ΔW for plain LoRA, computed from the base weights
    for DoRA and replaced tensors. Anything else the adapter holds or asks for is refused with a message.
    """

    kind = "lora"

    def __init__(self, ref, path: Path, base: Checkpoint):
        super().__init__(ref, path)
        self.base = base
        self.adapter_config = read_adapter_config(path)
        files = sorted(path.glob("adapter_model*.safetensors"))
        if files:
            self._factors = SafetensorsCheckpoint(ref, path, files)
        elif (path / "adapter_model.bin").exists():
            self._factors = BinCheckpoint(ref, path, [path / "adapter_model.bin"])
        else:
            raise CheckpointError(
                f"{path} has adapter_config.json but no adapter_model.safetensors: the adapter is incomplete."
            )
        self._check_config()
        self.pairs = self._pair_factors()
        self._check_against_base()

    # -- adapter config
    def _check_config(self) -> None:
        cfg, where = self.adapter_config, self.path / "adapter_config.json"
        peft_type = cfg.get("peft_type")
        if peft_type is not None and str(peft_type).upper() != "LORA":
            raise CheckpointError(
                f"{self.path} is a PEFT {peft_type} adapter; forgetlab reads LoRA and DoRA adapters only. "
                + _MERGE_IT_YOURSELF)
        for key, what in _LORA_UNSUPPORTED.items():
            if cfg.get(key):
                raise CheckpointError(f"{self.path} uses {what}, which forgetlab does not support. "
                                      + _MERGE_IT_YOURSELF)
        init = cfg.get("init_lora_weights")
        if isinstance(init, str) and init.lower().startswith(("pissa", "corda", "olora", "loftq", "lora_ga")):
            raise CheckpointError(
                f"{self.path} was trained with init_lora_weights={init!r}, which rewrites the base weights "
                "(W − B0·A0, or a quantised W) before training: its factors apply to that modified base, not to "
                "the base model, and adding them to the base gives wrong weights. Convert it to a plain LoRA "
                "adapter with PEFT (save_pretrained(..., path_initial_model_for_weight_conversion=...)) and "
                "pass the converted adapter.")
        _lora_number(where, "r", cfg.get("r", 8), integer=True)
        _lora_number(where, "lora_alpha", cfg.get("lora_alpha", 8), integer=False)
        for key, integer in (("rank_pattern", True), ("alpha_pattern", False)):
            pats = cfg.get(key) or {}
            if not isinstance(pats, dict):
                raise CheckpointError(f"{where}: {key} must map module-name patterns to numbers; got {pats!r}.")
            for pat, val in pats.items():
                _lora_number(where, f"{key}[{pat!r}]", val, integer=integer)
                try:
                    re.compile(str(pat))
                except re.error as exc:
                    raise CheckpointError(f"{where}: {key} pattern {pat!r} is not a valid regex ({exc}).") from None

    @staticmethod
    def _pattern_value(patterns: dict, module: str, default):
        # PEFT's get_pattern_key: the first key k with re.match(rf"(.*\.)?({k})$", module)
        for pat, val in patterns.items():
            if re.match(rf"(.*\.)?({pat})$", module):
                return val
        return default

    @property
    def stored_bytes(self) -> int:
        """Bytes of the adapter's own files (its factors), not of the base it applies to."""
        return self._factors.stored_bytes

    def summary(self) -> dict:
        """The adapter itself: rank, alpha, rsLoRA, DoRA, target modules, modules saved whole, its parameters
        (factors and saved tensors) and size on disk."""
        cfg = self.adapter_config
        targets = cfg.get("target_modules")
        return {"rank": cfg.get("r", 8), "alpha": cfg.get("lora_alpha", 8), "rslora": bool(cfg.get("use_rslora")),
                "dora": bool(cfg.get("use_dora")),
                "target_modules": sorted(targets) if isinstance(targets, (list, tuple, set)) else targets,
                "modules_to_save": cfg.get("modules_to_save") or [],
                "parameters": sum(i.numel for i in self._factors.infos().values()),
                "stored_bytes": self.stored_bytes, "base": str(self.base.ref)}

    def _scale_for(self, target_module: str) -> float:
        """lora_alpha / r for one module (lora_alpha / √r with rsLoRA), after rank_pattern / alpha_pattern."""
        cfg = self.adapter_config
        r = cfg.get("r", 8)
        alpha = cfg.get("lora_alpha", 8)
        r = self._pattern_value(cfg.get("rank_pattern") or {}, target_module, r)
        alpha = self._pattern_value(cfg.get("alpha_pattern") or {}, target_module, alpha)
        return alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r

    # -- factor names → targets
    def _pair_factors(self) -> dict[str, LoraPair]:
        base_names = set(self.base.names())
        groups: dict[str, dict[str, str]] = {}
        full: dict[str, str] = {}
        unknown: list[str] = []
        for name in self._factors.names():
            short = name.removeprefix("base_model.model.")
            for kind, pat in _LORA_TENSOR_KINDS:
                m = pat.match(short)
                if not m:
                    continue
                if kind in ("saved", "full"):
                    target = f"{m.group(1)}.{m.group(2)}"
                    known = (target, f"model.{target}", target.removeprefix("model."))
                    saved_module = m.group(1).rsplit(".", 1)[-1] in (self.adapter_config.get("modules_to_save") or ())
                    if kind == "full" and not saved_module and not any(c in base_names for c in known):
                        continue  # a plain X.weight the base lacks: not a full tensor of the base
                    full[self._match_base_name(target, base_names)] = name
                else:
                    groups.setdefault(m.group(1), {})[kind] = name
                break
            else:
                unknown.append(name)
        if unknown:
            raise CheckpointError(
                f"The adapter {self.path} holds tensors that are not LoRA factors forgetlab knows: "
                f"{', '.join(unknown[:5])}{' …' if len(unknown) > 5 else ''}. forgetlab reads lora_A/lora_B, "
                "lora_embedding_A/B, DoRA magnitudes, lora_B biases and full tensors of modules_to_save. "
                + _MERGE_IT_YOURSELF)
        use_dora = bool(self.adapter_config.get("use_dora", False))
        fan = bool(self.adapter_config.get("fan_in_fan_out", False))
        pairs: dict[str, LoraPair] = {}
        for module, g in groups.items():
            emb = "embA" in g or "embB" in g
            a, b = (g.get("embA"), g.get("embB")) if emb else (g.get("A"), g.get("B"))
            if a is None or b is None or (emb and ("A" in g or "B" in g)):
                raise CheckpointError(
                    f"The adapter {self.path} stores an incomplete LoRA pair for {module} "
                    f"(found {', '.join(sorted(g))}; need both A and B): the adapter file is damaged.")
            if use_dora != ("mag" in g):
                raise CheckpointError(
                    f"The adapter {self.path} {'says use_dora but stores no magnitude vector' if use_dora else 'stores a DoRA magnitude vector but its config lacks use_dora'} "
                    f"for {module}: config and weights disagree. Re-save the adapter with PEFT.")
            target = self._match_base_name(module + ".weight", base_names)
            scale = self._scale_for(module)
            pairs[target] = LoraPair(target, a, b, scale, fan_in_fan_out=fan and not emb, embedding=emb,
                                     magnitude=g.get("mag"), replacement=full.pop(target, None))
            if "B_bias" in g:
                if not {f"{module}.bias", f"model.{module}.bias", module.removeprefix("model.") + ".bias"} & base_names:
                    raise CheckpointError(
                        f"The LoRA adapter {self.ref} was trained with lora_bias=True: it adds a bias to {module}, "
                        f"which has no bias in the base {self.base.ref}. PEFT cannot merge it into this base either "
                        "('Impossible to merge LoRA with lora_bias=True because the base layer has no bias'). "
                        "Retrain the adapter without lora_bias, or pass a base whose layer has a bias.")
                bias_target = self._match_base_name(module + ".bias", base_names)
                pairs[bias_target] = LoraPair(bias_target, None, g["B_bias"], scale,
                                              replacement=full.pop(bias_target, None), bias_of=target)
        for target, name in full.items():
            pairs[target] = LoraPair(target, replacement=name)
        if not pairs:
            raise CheckpointError(f"{self.path} holds no LoRA A/B factors (expected *.lora_A.weight tensors).")
        return pairs

    def _match_base_name(self, name: str, base_names: set[str]) -> str:
        if name in base_names:
            return name
        # PEFT saves names relative to the wrapped model; allow a missing or extra leading "model."
        for cand in (f"model.{name}", name.removeprefix("model.")):
            if cand in base_names:
                return cand
        if name.endswith("lm_head.weight") and getattr(self.base.config, "tie_word_embeddings", False):
            raise CheckpointError(
                f"The LoRA adapter {self.ref} changes lm_head, but the base {self.base.ref} ties lm_head to the "
                "embeddings and stores no lm_head of its own; forgetlab does not untie weights. "
                + _MERGE_IT_YOURSELF)
        raise IncompatibleModelsError(
            f"The LoRA adapter {self.ref} targets {name}, which the base {self.base.ref} does not have: "
            "the adapter was trained on another base model. Pass the base it was trained on."
        )

    def _check_against_base(self) -> None:
        for target, pair in self.pairs.items():
            base_shape = tuple(self.base.info(target).shape)
            shapes = {}
            if pair.replacement is not None:
                shapes["the stored tensor"] = tuple(self._factors.info(pair.replacement).shape)
            if pair.bias_of is not None:
                shapes["the lora_B bias"] = tuple(self._factors.info(pair.b_name).shape)
            elif pair.a_name is not None:
                a = tuple(self._factors.info(pair.a_name).shape)
                b = tuple(self._factors.info(pair.b_name).shape)
                if len(a) != 2 or len(b) != 2 or a[0] != b[1]:
                    raise CheckpointError(
                        f"The adapter {self.path} has LoRA factors of shapes A {a} and B {b} for {target}, which "
                        "cannot be multiplied (A must be r × in and B out × r): the adapter file is damaged.")
                if pair.embedding:
                    shape = (a[1], b[0])
                else:
                    shape = (a[1], b[0]) if pair.fan_in_fan_out else (b[0], a[1])
                shapes["the LoRA delta"] = shape
                if pair.magnitude is not None:
                    out = shape[1] if (pair.embedding or pair.fan_in_fan_out) else shape[0]
                    mag = tuple(self._factors.info(pair.magnitude).shape)
                    if mag != (out,):
                        raise CheckpointError(
                            f"The adapter {self.path} has a DoRA magnitude of shape {mag} for {target}, but the "
                            f"target has {out} output features: the adapter file is damaged.")
            for what, shape in shapes.items():
                if tuple(shape) != base_shape:
                    raise IncompatibleModelsError(
                        f"The LoRA adapter {self.ref} gives {target} {what} of shape {tuple(shape)}, "
                        f"but the base {self.base.ref} has shape {base_shape}: the adapter belongs to "
                        "another base model (or one with a resized vocabulary)."
                    )

    # -- reading
    def nonfinite_tensors(self, progress: Progress = None) -> list[str]:
        """Names of the adapter's stored tensors (factors, DoRA magnitudes, saved modules) holding NaN or Inf.

        ΔW = scale·B·A is finite when its factors are (the base is scanned on its own), so the factors are
        read instead of every ΔW: a few MiB instead of a matrix product per target module."""
        return self._factors.nonfinite_tensors(progress)

    def infos(self):
        return self.base.infos()

    def delta_names(self) -> list[str]:
        """Base tensor names that the adapter changes."""
        return list(self.pairs)

    def _lora_delta(self, pair: LoraPair) -> torch.Tensor:
        """scale · B · A in the target's layout (float32); for a lora_B bias, scale · b_B."""
        b = self._factors.read(pair.b_name, torch.float32)
        if pair.bias_of is not None:
            return pair.scale * b
        a = self._factors.read(pair.a_name, torch.float32)
        d = pair.scale * (b @ a)
        return d.T if (pair.fan_in_fan_out or pair.embedding) else d

    def _merged(self, pair: LoraPair) -> torch.Tensor:
        """The target tensor after PEFT's merge_and_unload(), in float32."""
        if pair.replacement is not None:
            w0 = self._factors.read(pair.replacement, torch.float32)
        else:
            w0 = self.base.read(pair.target, torch.float32)
        if pair.b_name is None:
            return w0
        v = w0 + self._lora_delta(pair)
        if pair.magnitude is None:
            return v
        m = self._factors.read(pair.magnitude, torch.float32)
        if pair.embedding or pair.fan_in_fan_out:  # weight stored [in, out]: one norm per column
            return v * (m / torch.linalg.norm(v, dim=0)).view(1, -1)
        return v * (m / torch.linalg.norm(v, dim=1)).view(-1, 1)

    def delta(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """τ = merged − θ0 for one base tensor: exactly scale · B · A for plain LoRA; merged weight minus the
        base for DoRA and stored tensors (depends on the base); zeros if the adapter does not touch it."""
        pair = self.pairs.get(name)
        if pair is None:
            return torch.zeros(self.base.info(name).shape, dtype=dtype)
        if pair.exact_delta:
            return self._lora_delta(pair).to(dtype)
        return (self._merged(pair) - self.base.read(name, torch.float32)).to(dtype)

    def read(self, name, dtype=torch.float32):
        pair = self.pairs.get(name)
        if pair is None:
            base = self.base.read(name, dtype=None)
            return base if dtype is None else base.to(dtype)
        if pair.exact_delta:
            base = self.base.read(name, dtype=None)
            return (base.to(torch.float32) + self._lora_delta(pair)).to(dtype or base.dtype)
        if pair.b_name is None:  # a stored full tensor, as it was saved
            t = self._factors.read(pair.replacement, dtype=None)
            return t if dtype is None else t.to(dtype)
        return self._merged(pair).to(dtype or self.base.info(name).dtype)

    @property
    def config_dir(self):
        return self.base.config_dir

    @cached_property
    def config(self):
        """The base's config (a GGUF base has no config.json beside it: its config comes from the file)."""
        return self.base.config

    @property
    def tokenizer_dir(self):
        return super().tokenizer_dir or self.base.tokenizer_dir


def read_adapter_config(path: Path) -> dict:
    """adapter_config.json of a PEFT adapter folder as a dict, or a CheckpointError saying what is wrong."""
    file = path / "adapter_config.json"
    try:
        cfg = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"{file} is unreadable ({exc}). An adapter folder needs the adapter_config.json PEFT wrote; "
            "restore it or re-save the adapter.") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{file} holds a {type(cfg).__name__}, not a JSON object: it is not a PEFT "
                              "adapter config; restore it or re-save the adapter.")
    return cfg
