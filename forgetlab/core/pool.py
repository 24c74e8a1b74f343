"""ModelPool: one base model, named fine-tuned models (full or LoRA adapters) and per-task probe data.

A pool is built in code or read from a small YAML file (paths relative to the file):

```yaml
name: pico
base: base                      # HF folder, .gguf file or hub id
models:
  math: ft-math                 # a full fine-tune
  lora-math: {adapter: lora-math}
probes:
  general: data/general_heldout.txt
  general_train: data/general_train.txt
  tasks:
    math: {train: data/math_train.jsonl, probe: data/math_probe.jsonl, eval: data/math_eval.jsonl}
  template: null                # or "chat"
```

On creation the pool checks that every model matches the base (architecture, tensor names and shapes) and
warns about NaN/Inf weights, naming the tensors. Loaded models are cached: a model is never loaded twice;
a job that visits models one at a time `borrow`s each (unloaded after unless the caller had it loaded).
"""
from __future__ import annotations

import contextlib
import difflib
import json
import os
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch
import yaml
from ruamel.yaml.comments import CommentedMap

from forgetlab.core.anatomy import Anatomy
from forgetlab.core.benchmarks import BenchmarkSpec
from forgetlab.core.checkpoints import (Checkpoint, LoraCheckpoint, load_model, load_tokenizer, looks_like_hub_id,
                                        open_checkpoint)
from forgetlab.core.data import Probes, TaskData, check_template, read_general_text, read_task_pairs
from forgetlab.core.errors import (CheckpointError, ForgetlabError, IncompatibleModelsError, ParameterError,
                                   ProbeDataError)
from forgetlab.core.tokenization import check_same_tokenizer
from forgetlab.core.yamlio import edit_yaml_file, load_file

BASE = "base"
_TIED_HEAD = "lm_head.weight"


class NonFiniteWeightsWarning(UserWarning):
    """A checkpoint holds NaN or Inf values."""


@dataclass(frozen=True)
class PoolMember:
    """How a pool member is stored: a full model folder, or an adapter applied to the base."""

    name: str
    ref: str
    adapter: bool = False


def _is_tied(ckpt: Checkpoint) -> bool:
    return bool(getattr(ckpt.config, "tie_word_embeddings", False))


class DtypeMismatchWarning(UserWarning):
    """A fine-tune is stored in another floating dtype than its base."""


def stored_float_dtype(ckpt: Checkpoint):
    """The floating dtype most of a checkpoint's tensors are stored in (None if it has none)."""
    counts = Counter(i.dtype for i in ckpt.infos().values() if i.dtype.is_floating_point)
    return counts.most_common(1)[0][0] if counts else None


def warn_dtype_mismatch(base: Checkpoint, other: Checkpoint, other_name: str) -> str | None:
    """Warn (DtypeMismatchWarning) when `other` is stored in a lower-precision float dtype than `base`: the task
    vector τ = θ1 − θ0 is computed in float32, but θ1's rounding to its dtype is then part of τ and can dominate
    a small fine-tuning change. Returns the message (None when the dtypes agree)."""
    bd, od = stored_float_dtype(base), stored_float_dtype(other)
    if bd is None or od is None or bd == od:
        return None
    msg = (f"{other_name} is stored in {str(od).replace('torch.', '')} but the base in "
           f"{str(bd).replace('torch.', '')}: task vectors are computed in float32 from the stored values, so "
           f"they include the rounding of the lower-precision model (about {torch.finfo(od if od.itemsize < bd.itemsize else bd).eps:.0e} "
           "of each weight), which can dominate a small fine-tuning change. Compare models saved in the same "
           "dtype where you can.")
    warnings.warn(msg, DtypeMismatchWarning, stacklevel=3)
    return msg


def config_value(ckpt: Checkpoint, key: str):
    """`key` of the checkpoint's config: read from config.json as plain JSON when there is one (no transformers
    import: the merge engine avoids it), else from the config transformers builds (a GGUF file)."""
    folder = getattr(ckpt, "config_dir", None)
    if folder is not None and (Path(folder) / "config.json").is_file():
        try:
            data = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
            if isinstance(data, dict):
                return data.get(key)
        except (OSError, ValueError):
            pass
    return getattr(ckpt.config, key, None)


def check_same_architecture(base: Checkpoint, other: Checkpoint, other_name: str, vocab: bool = True) -> None:
    """Raise IncompatibleModelsError when `other` is another architecture family (config's model_type) or, with
    `vocab`, has another vocabulary size or another tokenizer than `base` (`forgetlab.core.tokenization`: the same
    size is not the same BPE). The one check of this kind that pools, textdiff and merges share: a Llama base
    and a Mistral fine-tune of identical shapes are still two architectures. `vocab=False`: a merge whose recipe
    rebuilds the vocabulary (merge/vocab.py) aligns the token rows itself."""
    bt, ot = config_value(base, "model_type"), config_value(other, "model_type")
    if bt and ot and bt != ot:
        raise IncompatibleModelsError(
            f"{other_name} is a {ot} model but the base is a {bt} model: task vectors need the same "
            "architecture. Pick a fine-tune of this base."
        )
    bv, ov = config_value(base, "vocab_size"), config_value(other, "vocab_size")
    if vocab and bv is not None and ov is not None and bv != ov:
        raise IncompatibleModelsError(
            f"{other_name} has a vocabulary of {ov} tokens but the base has {bv}: the embeddings differ in "
            "size, so the models cannot be compared entry by entry. Use a fine-tune that kept the base tokenizer, "
            "resize the embeddings of one model (e.g. model.resize_token_embeddings), or, to merge it, give the "
            "recipe a tokenizer (mergekit's `tokenizer_source: union`, `base` or a model's path)."
        )
    if vocab:
        check_same_tokenizer(base, other, other_name)


def check_compatible(base: Checkpoint, other: Checkpoint, other_name: str) -> None:
    """Raise IncompatibleModelsError naming the first difference between `other` and `base`.

    Checks the architecture family, the vocabulary size and the tokenizer (`check_same_architecture`), the set of tensor
    names (a tied lm_head that one file stores and the other omits is not a difference) and every tensor's
    shape.
    """
    check_same_architecture(base, other, other_name)
    bi, oi = base.infos(), other.infos()
    ignore = {_TIED_HEAD} if (_is_tied(base) or _is_tied(other)) else set()
    missing = sorted(set(bi) - set(oi) - ignore)
    extra = sorted(set(oi) - set(bi) - ignore)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} tensor(s) of the base, e.g. {', '.join(missing[:3])}")
        if extra:
            parts.append(f"{len(extra)} tensor(s) the base lacks, e.g. {', '.join(extra[:3])}")
        raise IncompatibleModelsError(f"{other_name} does not match the base: {'; '.join(parts)}.")
    if not isinstance(other, LoraCheckpoint):
        warn_dtype_mismatch(base, other, other_name)
    for name in bi:
        if name in oi and bi[name].shape != oi[name].shape:
            hint = " (a vocabulary-size mismatch)" if "embed" in name or name == _TIED_HEAD or "wte" in name else ""
            raise IncompatibleModelsError(
                f"Tensor {name} has shape {oi[name].shape} in {other_name} but {bi[name].shape} in the base"
                f"{hint}: the models are not the same architecture."
            )


class ModelPool:
    """A base model, named fine-tuned models and probe data, checked for compatibility on creation."""

    def __init__(self, base: str | Path, models: dict[str, Any] | None = None, probes: Probes | None = None,
                 *, name: str = "pool", source: Path | None = None, scan_nonfinite: bool = True):
        self.name = name
        self.source = Path(source) if source else None
        self.probes = probes or Probes()
        self.base_ref = str(base)
        self.base = open_checkpoint(base)
        self._tokenizer = None
        self._check_template()
        self.entries: dict[str, PoolMember] = {}
        self._checkpoints: dict[str, Checkpoint] = {BASE: self.base}
        self._loaded: dict[tuple[str, str, torch.dtype], Any] = {}
        self.warnings: list[str] = []
        self.probe_files: dict[str, Any] = {}
        for mname, spec in (models or {}).items():
            self.add(mname, spec, scan_nonfinite=False)
        if scan_nonfinite:
            for mname, ckpt in self._checkpoints.items():
                self._warn_nonfinite(mname, ckpt)

    def _check_template(self) -> None:
        """With `probes.template: chat`, the base's tokenizer must have a chat template: checked when the pool
        opens (loading the tokenizer, which is kept), not after a first evaluation. A base without tokenizer
        files is left to the first command that needs its tokenizer, which says so."""
        if self.probes.template != "chat":
            return
        try:
            tok = self.tokenizer
        except CheckpointError:
            return
        where = f"`probes.template: chat` in {self.source}" if self.source else "The pool's `template: chat`"
        check_template(tok, "chat", where=where, tokenizer_of=f"the base {self.base_ref}")

    # -- members
    def add(self, name: str, spec: Any, scan_nonfinite: bool = True) -> Checkpoint:
        """Add a fine-tuned model (`path`) or an adapter (`{"adapter": path}`) under `name`, checked."""
        if name == BASE:
            raise ForgetlabError("'base' names the base model; give the fine-tuned model another name.")
        if name in self.entries:
            raise ForgetlabError(f"The pool has a model named {name!r} already; choose another name.")
        adapter = isinstance(spec, dict) and "adapter" in spec
        ref = spec["adapter"] if adapter else (spec["path"] if isinstance(spec, dict) else spec)
        ckpt = open_checkpoint(ref, base=self.base) if adapter else open_checkpoint(ref)
        if isinstance(ckpt, LoraCheckpoint):
            adapter = True
        check_compatible(self.base, ckpt, name)
        self.entries[name] = PoolMember(name, str(ref), adapter)
        self._checkpoints[name] = ckpt
        if scan_nonfinite:
            self._warn_nonfinite(name, ckpt)
        return ckpt

    def remove(self, name: str) -> None:
        """Forget the fine-tuned model `name` (its files and the pool file are left as they are)."""
        if name not in self.entries:
            raise ForgetlabError(f"The pool has no model named {name!r}.")
        del self.entries[name]
        self._checkpoints.pop(name, None)
        for key in [k for k in self._loaded if k[0] == name]:
            del self._loaded[key]

    def _warn_nonfinite(self, name: str, ckpt: Checkpoint) -> None:
        bad = ckpt.nonfinite_tensors()
        if bad:
            msg = (f"{name} has NaN/Inf values in {len(bad)} tensor(s): {', '.join(bad[:5])}"
                   f"{' …' if len(bad) > 5 else ''}. Results involving it will be NaN.")
            self.warnings.append(msg)
            warnings.warn(msg, NonFiniteWeightsWarning, stacklevel=3)

    @property
    def model_names(self) -> list[str]:
        """Names of the fine-tuned models (the base is `"base"`)."""
        return list(self.entries)

    @property
    def task_names(self) -> list[str]:
        return list(self.probes.tasks)

    def check_tasks(self, names: Iterable[str], where: str = "") -> None:
        """Refuse task names the pool's probe data does not have, listing the ones it has (`where` says what
        asked, e.g. " (for model 'math')")."""
        missing = [t for t in names if t not in self.task_names]
        if missing:
            raise ProbeDataError(f"The pool has no task {', '.join(map(repr, missing))}{where}; its tasks are: "
                                 f"{', '.join(self.task_names) or 'none'}.")

    def check_models(self, names: Iterable[str], *, base: bool = False) -> None:
        """Refuse model names that are not fine-tuned models of the pool (or the base, with `base`), listing the
        ones it has and saying how to add one."""
        known = [BASE, *self.model_names] if base else list(self.model_names)
        missing = [m for m in names if m not in known]
        if missing:
            what = "model" if base else "fine-tuned model"
            raise ParameterError(f"The pool has no {what} {', '.join(map(repr, missing))}; its {what}s are: "
                                 f"{', '.join(known) or 'none'}. Add it to the pool file or pick another.")

    def model_for_task(self, task: str | None, model: str | None = None) -> str:
        """The fine-tuned model an analysis of `task` looks at: `model` when given, else the one named like the
        task, else the pool's only model; ParameterError saying what to pass otherwise."""
        if task is None:
            raise ParameterError(f"Name a task; the pool's tasks are: {', '.join(self.task_names) or 'none'}.")
        if model is not None:
            return model
        names = self.model_names
        if task in names:
            return task
        if len(names) == 1:
            return names[0]
        raise ParameterError(f"No model of the pool is named like task {task!r}; pass model= one of "
                             f"{', '.join(names)}.")

    def checkpoint(self, name: str) -> Checkpoint:
        """The opened checkpoint of a member (`"base"` for the base)."""
        try:
            return self._checkpoints[name]
        except KeyError:
            known = ", ".join([BASE, *self.entries])
            raise ForgetlabError(f"The pool has no model {name!r}; its models are: {known}.") from None

    def resolve_ref(self, ref: str) -> str:
        """The checkpoint reference behind `ref`: a member's name ("base" included) gives its folder, file or hub
        id; anything else (a path, a hub id) is returned as it is."""
        if ref == BASE:
            return self.base_ref
        if ref in self.entries:
            return self.entries[ref].ref
        return ref

    def load(self, name: str, device: str | None = None, dtype: torch.dtype = torch.float32):
        """The model for forward passes, loaded once per (name, device, dtype) and cached."""
        ckpt = self.checkpoint(name)
        device = device or "cpu"
        key = (name, device, dtype)
        if key not in self._loaded:
            if isinstance(ckpt, LoraCheckpoint):
                ckpt = open_checkpoint(ckpt.ref, base=self.base)
            if not ckpt.path.exists():
                raise CheckpointError(f"{name} ({ckpt.ref}) is no longer on disk; restore it or reload the pool.")
            self._loaded[key] = load_model(ckpt, device=device, dtype=dtype)
        return self._loaded[key]

    def unload(self, name: str | None = None) -> None:
        """Forget loaded models (one, or all when `name` is None) to free memory."""
        for key in [k for k in self._loaded if name is None or k[0] == name]:
            del self._loaded[key]

    def loaded(self) -> list[tuple[str, str, torch.dtype]]:
        """The (name, device, dtype) of every model the pool holds loaded now, in the order they were loaded."""
        return list(self._loaded)

    @contextlib.contextmanager
    def released(self):
        """A block after which the models it loaded are forgotten again (those loaded before it stay): a job that
        scores models one after another holds one at a time, and the models a caller keeps loaded stay loaded."""
        before = set(self._loaded)
        try:
            yield self
        finally:
            for key in [k for k in self._loaded if k not in before]:
                del self._loaded[key]

    @contextlib.contextmanager
    def borrow(self, name: str, device: str | None = None, dtype: torch.dtype = torch.float32):
        """`load(name, device, dtype)` for the length of a `with` block (`released`): on leaving it the model is
        unloaded again unless the pool held it (same name, device and dtype) before the block."""
        with self.released():
            yield self.load(name, device=device, dtype=dtype)

    @property
    def tokenizer(self):
        """The base model's tokenizer (loaded once)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.base)
        return self._tokenizer

    @property
    def config(self):
        return self.base.config

    @property
    def anatomy(self):
        """Which parameter belongs to which layer/attn/mlp/head, from the base's config."""
        return Anatomy.from_config(self.base.config)

    @property
    def key(self) -> str:
        """A string that changes when the pool's definition changes (for caches)."""
        if self.source and self.source.exists():
            return f"{self.source.resolve()}:{self.source.stat().st_mtime_ns}"
        return f"{self.base_ref}|{sorted((e.name, e.ref) for e in self.entries.values())}"

    # -- YAML
    @classmethod
    def from_yaml(cls, path: str | Path, scan_nonfinite: bool = True) -> "ModelPool":
        """Read a pool file; paths inside are relative to it."""
        p = Path(path).expanduser()
        if not p.is_file():
            raise ForgetlabError(f"The pool file {p} does not exist. Pass a pool.yaml, or build the demo zoo "
                                 "with `forgetlab zoo build`.")
        spec = load_file(p, "pool file")
        if not isinstance(spec, dict) or "base" not in spec:
            raise ForgetlabError(f"The pool file {p} must be a mapping with at least `base:` (and `models:`).")
        _check_keys(spec, POOL_KEYS, f"The pool file {p}")
        if not isinstance(spec["base"], str) or not spec["base"].strip():
            raise ForgetlabError(f"`base:` in {p} must be a model folder, a .gguf file or a hub id; got "
                                 f"{spec['base']!r}.")
        root = p.parent.resolve()

        def rel(ref: str) -> str:
            cand = (root / str(ref)).expanduser()
            return str(cand) if cand.exists() or not looks_like_hub_id(str(ref)) else str(ref)

        models = {}
        raw_models = spec.get("models") or {}
        if not isinstance(raw_models, dict):
            raise ForgetlabError(f"`models:` in {p} must map names to model folders.")
        for name, m in raw_models.items():
            if isinstance(m, dict) and "adapter" in m:
                models[str(name)] = {"adapter": rel(m["adapter"])}
            elif isinstance(m, dict) and "path" in m:
                models[str(name)] = rel(m["path"])
            elif isinstance(m, str):
                models[str(name)] = rel(m)
            else:
                raise ForgetlabError(f"Model {name!r} in {p} must be a path or {{adapter: path}}; got {m!r}.")
        probes = _read_probes(spec.get("probes") or {}, root, p)
        pool = cls(rel(spec["base"]), models, probes, name=str(spec.get("name", p.parent.name)), source=p,
                   scan_nonfinite=scan_nonfinite)
        pool.probe_files = _probe_files(spec.get("probes") or {}, root)
        return pool

    def to_yaml(self, path: str | Path) -> Path:
        """Write the pool's definition (models and the probe files it was read from, if any)."""
        p = Path(path)
        root = p.parent.resolve()

        def rel(ref: str) -> str:
            q = Path(ref)
            try:
                return str(q.resolve().relative_to(root)) if q.exists() else ref
            except ValueError:
                return str(q.resolve())

        spec: dict[str, Any] = {"name": self.name, "base": rel(self.base_ref), "models": {}}
        for e in self.entries.values():
            spec["models"][e.name] = {"adapter": rel(e.ref)} if e.adapter else rel(e.ref)
        if self.probe_files:
            files = dict(self.probe_files)
            spec["probes"] = {k: rel(v) if k in ("general", "general_train") else v for k, v in files.items()
                              if k != "tasks"}
            spec["probes"]["tasks"] = {t: {s: rel(f) for s, f in d.items()}
                                       for t, d in files.get("tasks", {}).items()}
        p.write_text(yaml.safe_dump(spec, sort_keys=False))
        return p

    def add_to_yaml(self, name: str, path: str | Path | None = None) -> Path:
        """Add the pool's model `name` to the pool file (`path`, default the file the pool was read from)
        without rewriting the rest: comments, key order and keys forgetlab does not know are kept
        (forgetlab.core.yamlio.edit_yaml_file). Writes a new file with `to_yaml` when there is none."""
        p = Path(path or self.source or "")
        if not p.name:
            raise ForgetlabError("This pool was not read from a file; pass the pool file to write.")
        if not p.is_file():
            return self.to_yaml(p)
        entry = self.entries[name]
        root = p.parent.resolve()
        ref = Path(entry.ref)
        # Paths in a pool file are read relative to the folder it is opened from; a link elsewhere to a shared
        # file is read from two folders, so a new entry is written absolute to be right from both.
        shared = p.is_symlink() and Path(os.path.realpath(p)).parent != root
        try:
            ref_text = str(ref.resolve().relative_to(root)) if ref.exists() and not shared else entry.ref
        except ValueError:
            ref_text = str(ref.resolve())
        if shared and ref.exists():
            ref_text = str(ref.resolve())

        def change(doc) -> None:
            if not isinstance(doc, dict):
                raise ForgetlabError(f"The pool file {p} is not a mapping; cannot add {name!r} to it.")
            models = doc.get("models")
            if models is None:
                models = doc["models"] = CommentedMap()
            if not isinstance(models, dict):
                raise ForgetlabError(f"`models:` in {p} is not a mapping; cannot add {name!r} to it.")
            if name in models:
                raise ForgetlabError(f"The pool file {p} has a model named {name!r} already; choose another name.")
            models[name] = CommentedMap(adapter=ref_text) if entry.adapter else ref_text

        edit_yaml_file(p, change, "pool file")
        return p

    def __repr__(self) -> str:
        return f"ModelPool({self.name!r}, base={self.base_ref!r}, models={self.model_names})"


POOL_KEYS = ("name", "base", "models", "probes")
PROBE_KEYS = ("general", "general_train", "tasks", "template", "benchmarks")
TEMPLATES = (None, "chat")


def _check_keys(spec: dict, known: tuple[str, ...], where: str) -> None:
    """Keys forgetlab does not know are the user's own and are kept; one that looks like a misspelt known key
    (e.g. `modles`) is refused, since the setting it was meant for would silently be missing."""
    for key in spec:
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.75)
        if close:
            raise ForgetlabError(f"{where} has a key {key!r}; did you mean {close[0]!r}? (Known keys: "
                                 f"{', '.join(known)}.)")


def _read_probes(spec: dict, root: Path, source: Path) -> Probes:
    if not isinstance(spec, dict):
        raise ProbeDataError(f"`probes:` in {source} must be a mapping (general, tasks, template).")
    _check_keys(spec, PROBE_KEYS, f"`probes:` in {source}")
    if spec.get("template") not in TEMPLATES:
        raise ProbeDataError(f"`probes.template` in {source} is {spec.get('template')!r}; use `chat` (wrap prompts "
                             "in the tokenizer's chat template) or leave it out (prompts as written).")
    probes = Probes(template=spec.get("template"))
    if spec.get("benchmarks") is not None:
        probes.benchmarks = BenchmarkSpec.from_pool_yaml(spec["benchmarks"], root, str(source))
    if spec.get("general"):
        probes.general = read_general_text(root / spec["general"])
    if spec.get("general_train"):
        probes.general_train = read_general_text(root / spec["general_train"])
    tasks = spec.get("tasks") or {}
    if not isinstance(tasks, dict):
        raise ProbeDataError(f"`probes.tasks` in {source} must map task names to their files.")
    for tname, files in tasks.items():
        if isinstance(files, str):
            files = {"eval": files}
        if not isinstance(files, dict):
            raise ProbeDataError(f"Task {tname!r} in {source} must give train/probe/eval files.")
        unknown = set(files) - {"train", "probe", "eval"}
        if unknown:
            raise ProbeDataError(f"Task {tname!r} in {source} has unknown splits {sorted(unknown)}; "
                                 "use train, probe and eval.")
        data = TaskData(str(tname))
        for split, f in files.items():
            setattr(data, split, read_task_pairs(root / f))
        if not data.probe:
            data.probe = data.eval
        if not data.eval:
            data.eval = data.probe
        probes.tasks[str(tname)] = data
    return probes


def _probe_files(spec: dict, root: Path) -> dict[str, Any]:
    """The probe section with absolute paths, so that `to_yaml` can write it relative to a new place."""
    out: dict[str, Any] = {"template": spec.get("template")}
    for key in ("general", "general_train"):
        if spec.get(key):
            out[key] = str((root / spec[key]).resolve())
    tasks = {}
    for tname, files in (spec.get("tasks") or {}).items():
        files = {"eval": files} if isinstance(files, str) else files
        tasks[str(tname)] = {s: str((root / f).resolve()) for s, f in files.items()}
    out["tasks"] = tasks
    if isinstance(spec.get("benchmarks"), dict):
        bench = dict(spec["benchmarks"])
        if bench.get("include"):
            bench["include"] = str((root / str(bench["include"])).resolve())
        out["benchmarks"] = bench
    return out
