"""The streaming merge engine: checkpoints on disk → merged HF folder, tensor by tensor.

`run(recipe, out_dir)` opens the base and the fine-tuned models lazily (`forgetlab.core.checkpoints`; LoRA
adapters read as base + ΔW), checks names and shapes from the headers, runs the method's global first pass
when it has one (TIES/PCB with scope="global": exact statistics streamed, see forgetlab.merge.select.RadixSelect), then
merges one tensor at a time into `write_hf_folder` (sharded safetensors + index, config and tokenizer from
the base, recipe.yaml). Peak memory: one tensor per model plus the output tensor. A mixture of experts' expert
tensors are merged as the fused tensors transformers loads and written back per expert (forgetlab.merge.experts),
so for them "one tensor" is a layer's experts together. The output appears only
when complete (a temporary folder renamed into place); a failure removes it and leaves inputs untouched.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import torch
import yaml

from forgetlab.core import checkpoints as ck
from forgetlab.core.checkpoints import load_tokenizer
from forgetlab.core.errors import ParameterError
from forgetlab.core.outputs import check_output_dir
from forgetlab.core.pool import ModelPool, warn_dtype_mismatch
from forgetlab.core.progress import Progress, report, scaled
from forgetlab.merge.core import (CheckpointSource, TensorReader, check_compatible, collect_stats, merge_tensors,
                                  resident_budget, resident_bytes)
from forgetlab.merge import experts as ex
from forgetlab.merge import settings
from forgetlab.merge import vocab as vb
from forgetlab.merge.layers import filter_names, layer_from_name
from forgetlab.merge.mergekit_params import base_policy
from forgetlab.merge.recipes import TOKENIZER_SOURCES, Recipe
from forgetlab.merge.registry import PrepareContext, get_method
from forgetlab.merge.slicing import output_layers, sliced_stream, with_layer
from forgetlab.merge.vocab import AlignedSource

# Merging is element-wise and memory-bound. bench/merge_vs_mergekit.py measured 1 torch thread faster than 2
# on the 2-core machine (task arithmetic 14.5 s vs 17.7 s, TIES 147 s vs 390 s on a 134M-parameter Llama,
# three models; docs/merging.md), so a merge runs with 1 thread unless the caller asks otherwise
# (threads=None keeps the caller's setting). The caller's setting is restored afterwards.
DEFAULT_THREADS: int | None = 1

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclass
class MergeResult:
    """Where a merge went and what it did."""

    out_dir: Path
    method: str
    params: dict[str, Any]
    n_tensors: int
    n_parameters: int
    seconds: float
    global_pass: bool
    stats: Any = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list)   # the recipe's notes (`Recipe.notes`), for the CLI and the page

    def to_dict(self) -> dict:
        return {"out_dir": str(self.out_dir), "method": self.method, "params": self.params,
                "n_tensors": self.n_tensors, "n_parameters": self.n_parameters, "seconds": self.seconds,
                "global_pass": self.global_pass, "notes": list(self.notes)}

    def to_frame(self):
        return pd.DataFrame([{k: v for k, v in self.to_dict().items() if k != "params"}])


def _check_device(device: str) -> str:
    return ck.check_device(device or "cpu")


@dataclass
class Sources:
    """A recipe's checkpoints, opened once (headers only; tensors are read lazily): the base checkpoint, the base
    and fine-tuned models as merge sources, and every file or folder the merge reads (`inputs`: an output
    folder that holds one of them is never replaced)."""

    base_ck: Any
    base: CheckpointSource
    models: list[CheckpointSource]
    inputs: list[Path]


def open_sources(recipe: Recipe) -> Sources:
    """Open the recipe's base and models lazily (warning about fine-tunes stored in a lower precision)."""
    base_ck = ck.open_checkpoint(recipe.base)
    base = CheckpointSource(base_ck, str(recipe.base))
    models = [CheckpointSource(ck.open_checkpoint(m.model, base=base_ck), m.model) for m in recipe.models]
    for m in models:
        if not m.is_lora:
            warn_dtype_mismatch(base_ck, m.ckpt, m.label)
    return Sources(base_ck, base, models, merge_inputs(base_ck, [m.ckpt for m in models], recipe))


def merge_inputs(base_ck, model_cks, recipe: Recipe) -> list[Path]:
    """Every file or folder a merge reads (base, models, adapters' bases, the pool file)."""
    paths = [Path(base_ck.path)]
    for m in model_cks:
        paths.append(Path(m.path))
        base_of = getattr(m, "base", None)
        if base_of is not None and getattr(base_of, "path", None):
            paths.append(Path(base_of.path))
    if recipe.pool:
        paths.append(Path(recipe.pool))
    return paths


def run(recipe: Recipe, out_dir: str | Path, progress: Progress = None, overwrite: bool = False,
        device: str = "cpu", pool=None, prepared: Mapping[str, Any] | None = None,
        max_shard_bytes: int = ck.DEFAULT_SHARD_BYTES, threads: int | None = DEFAULT_THREADS,
        sources: Sources | None = None) -> MergeResult:
    """Merge the checkpoints of a parsed `recipe` (`forgetlab.merge.recipe_io.load_recipe`; `forgetlab.merge.run`
    takes a file or dict too) into an HF folder at `out_dir` (see the module docstring). `sources`: the
    recipe's checkpoints already opened (`open_sources`), so that a caller that needed them first (to know the
    inputs an output must not hold) does not open them again.

    An existing `out_dir` is refused unless `overwrite`. `device` ("cpu" or "cuda") is where the arithmetic
    runs. Methods with a `prepare` hook (e.g. submodule-linearity merging) need `pool` (a ModelPool with
    probe data) or `prepared` coefficients. `threads` sets torch's intra-op threads for the merge (restored
    afterwards; None keeps the caller's setting): see DEFAULT_THREADS.
    """
    if threads is None:
        return _run(recipe, out_dir, progress, overwrite, device, pool, prepared, max_shard_bytes, sources)
    old = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        return _run(recipe, out_dir, progress, overwrite, device, pool, prepared, max_shard_bytes, sources)
    finally:
        torch.set_num_threads(old)


def _run(recipe, out_dir, progress, overwrite, device, pool, prepared, max_shard_bytes, sources) -> MergeResult:
    t0 = time.perf_counter()
    if not isinstance(recipe, Recipe):
        raise ParameterError("internal: the merge engine takes a parsed Recipe (forgetlab.merge.recipe_io.load_recipe); "
                             "forgetlab.merge.run also takes a file or a dict.")
    spec = get_method(recipe.method)
    params = recipe.validated_params()
    device = _check_device(device)
    sources = sources or open_sources(recipe)          # headers only: cheap, and the inputs are then known
    base_ck, base, models, inputs = sources.base_ck, sources.base, sources.models, sources.inputs
    out = check_output_dir(out_dir, overwrite, inputs)
    tokenizer_from, vocab = check_tokenizer_source(recipe, base_ck, [m.ckpt for m in models])
    if vocab is not None:
        sources = align_sources(recipe, sources, vocab)
        base, models = sources.base, sources.models
        tokenizer_from = None
    if recipe.slices is not None:
        return _run_slices(recipe, spec, params, sources, out, device, progress, overwrite, max_shard_bytes,
                           tokenizer_from, t0, vocab)
    entries = check_compatible(base, models)
    # a mixture of experts: each group of expert tensors that transformers fuses on loading is merged as that one
    # tensor (forgetlab.merge.experts), then written back as the checkpoint's per-expert tensors
    groups = ex.expert_groups(_model_type(base_ck), entries)
    if groups:
        entries = ex.fused_entries(entries, groups)
        base, models = ex.FusedSource(base, groups), [ex.FusedSource(m, groups) for m in models]
    params_for = None
    if recipe.varying:
        if spec.needs_global_pass(params) or spec.needs_pool:
            raise ParameterError(f"{spec.name} with these settings computes one statistic over the whole model, so "
                                 "its parameters cannot vary by tensor; give plain values instead of gradients or "
                                 "filters (or scope: tensor).")
        cache: dict = {}
        params_for = (lambda name, layer, n: recipe.params_at(names_of(name), settings.layer_t(layer, n),
                                                              cache=cache))
    cfg_file = Path(base_ck.config_dir) / "config.json"
    # transformers' AutoConfig costs seconds of imports: read it only when the method needs layer positions
    # or the folder has no config.json to copy (GGUF).
    config = base_ck.config if (spec.needs_layers or spec.needs_pool or recipe.varying or not cfg_file.exists()) \
        else None
    names_of = filter_names(config) if recipe.varying else None
    if spec.needs_pool and prepared is None:
        if pool is None and recipe.pool:
            pool = ModelPool.from_yaml(recipe.pool)
        if pool is None:
            raise ParameterError(f"{spec.name} computes its coefficients from a model pool with probe data: "
                                 "pass pool=… or give `pool: path/to/pool.yaml` in the recipe.")
        prepared = spec.prepare(PrepareContext(pool, base_ck, [m.ckpt for m in models],
                                               [m.model for m in recipe.models], params,
                                               scaled(progress, 0.0, 0.2)))
    start = 0.2 if spec.needs_pool else 0.0
    glob = spec.needs_global_pass(params)
    mid = start + (0.5 * (1 - start) if glob else 0.0)
    # one reader for every pass: its read slots are reused (write_hf_folder writes each merged tensor before it
    # asks for the next, so a merged tensor may live in a slot)
    reader = TensorReader(base, models, device, reuse=True, prefetch=True)
    # a global pass reads every input 2–5 times; a device with room keeps them after the first read
    kept = {} if glob and resident_bytes(models, entries) <= resident_budget(device) else None
    stats = collect_stats(spec, params, base, models, entries, device, scaled(progress, start, mid), reader=reader,
                          inputs=kept)
    out_dtype = _DTYPES[recipe.dtype] if recipe.dtype else None
    plan = ex.output_plan(entries, groups, lambda dt: out_dtype if (out_dtype and dt.is_floating_point) else dt)
    extra = {} if vocab is None else vocab.tokenizer_files()
    if cfg_file.exists():
        cfg_arg = None if (recipe.dtype or vocab) else cfg_file
        if recipe.dtype or vocab:
            cfg_json = json.loads(cfg_file.read_text())
            if recipe.dtype:
                cfg_json["dtype"] = recipe.dtype
                if "torch_dtype" in cfg_json:
                    cfg_json["torch_dtype"] = recipe.dtype
            if vocab:
                cfg_json["vocab_size"] = vocab.size
            extra["config.json"] = json.dumps(cfg_json, indent=2) + "\n"
    else:
        if recipe.dtype:
            config.dtype = recipe.dtype
        if vocab:
            config.vocab_size = vocab.size
        cfg_arg = config
    stream = merge_tensors(spec, params, base, models, entries, stats=stats, prepared=prepared, config=config,
                           device=device, out_dtype=out_dtype, progress=scaled(progress, mid, 1.0), reader=reader,
                           params_for=params_for, inputs=kept)
    if groups:
        stream = ex.split_stream(stream, groups)
    recipe_text = _recipe_text(recipe, params)
    ck.write_hf_folder(out, stream, cfg_arg, plan=plan, tokenizer_from=tokenizer_from, overwrite=overwrite,
                       extra_files={**extra, "recipe.yaml": recipe_text}, max_shard_bytes=max_shard_bytes,
                       inputs=inputs, kind="merge")
    report(progress, 1.0, f"merged into {out}")
    return MergeResult(out, spec.name, params, len(plan), sum(e.numel for e in plan),
                       time.perf_counter() - t0, glob, stats, list(recipe.notes))


def _model_type(base_ck) -> str | None:
    """The base's model_type, from its config.json when it has one (no AutoConfig import), else its config."""
    cfg_file = Path(base_ck.config_dir) / "config.json"
    try:
        if cfg_file.exists():
            return json.loads(cfg_file.read_text()).get("model_type")
        return getattr(base_ck.config, "model_type", None)
    except Exception:   # no readable config: nothing is known to be fused
        return None


def _recipe_text(recipe: Recipe, params: dict) -> str:
    """The merge's recipe.yaml: the recipe, and under `forgetlab` the versions, the resolved parameters and the
    recipe's notes (a saved merge shows them again)."""
    meta = {"version": _version(), "torch": str(torch.__version__), "resolved_params": params}
    if recipe.notes:
        meta["notes"] = list(recipe.notes)
    return yaml.safe_dump({**recipe.to_dict(), "forgetlab": meta}, sort_keys=False)


def check_tokenizer_source(recipe: Recipe, base_ck, model_cks) -> tuple[Any, Any]:
    """(the checkpoint whose tokenizer files the output copies, or None; the VocabularyPlan when the vocabulary is
    rebuilt, or None). The base's tokenizer unless `tokenizer.source` names a model; when the inputs' vocabularies
    differ, or `tokens` / `pad_to_multiple_of` are given, the vocabulary is rebuilt as mergekit does
    (forgetlab.merge.vocab)."""
    tok = recipe.tokenizer
    refs = {recipe.base: base_ck, **{m.model: c for m, c in zip(recipe.models, model_cks)}}
    if not tok:
        return base_ck, None
    if tok["source"] not in TOKENIZER_SOURCES and tok["source"] not in refs:
        raise ParameterError(f"tokenizer source {tok['source']!r} is not among the recipe's models "
                             f"({', '.join(refs)}); write base, union, or one of those paths as written under models.")
    lora = [r for r, c in refs.items() if getattr(c, "kind", "hf") == "lora"]
    differ = False if lora else _vocabularies_differ(refs)
    if not differ and not tok.get("tokens") and not tok.get("pad_to_multiple_of"):
        src = tok["source"]  # every permutation is the identity: the merge is the plain one
        return (base_ck if src in TOKENIZER_SOURCES else refs[src]), None
    if lora:
        raise ParameterError(f"tokenizer {tok} rebuilds the vocabulary, which forgetlab does not do with LoRA adapters "
                             f"among the models ({', '.join(lora)}); merge the adapters into full models first "
                             "(forgetlab merge with the adapter alone), or remove tokenizer tokens/pad_to_multiple_of.")
    mk_base, inputs = mergekit_inputs(recipe)
    return None, vb.build_plan(tok, mk_base, {r: refs[r] for r in inputs})


def _vocabularies_differ(refs: Mapping[str, Any]) -> bool:
    seen = None
    for ref, c in refs.items():
        try:
            v = (load_tokenizer(str(c.config_dir) if hasattr(c, "config_dir") else ref).get_vocab(),
                 getattr(c.config, "vocab_size", None))
        except Exception:
            continue
        if seen is None:
            seen = v
        elif v != seen:
            return True
    return False


def mergekit_inputs(recipe: Recipe) -> tuple[str | None, list[str]]:
    """mergekit's base_model of a recipe (None where mergekit has none: linear and karcher unless the base is
    listed after the first model, nuslerp and multislerp with use_base false) and its inputs in order."""
    names = [m.model for m in recipe.models] + [s.model for sl in recipe.slices or [] for s in sl.sources]
    policy = base_policy(recipe.method)
    if policy == "ignored":
        mk_base = recipe.base if recipe.base in names[1:] else None
    elif policy == "optional" and not recipe.params.get("use_base", True):
        mk_base = None
    else:
        mk_base = recipe.base
    order = ([mk_base] if mk_base else []) + names
    if not names:  # passthrough of one model
        order = [recipe.base]
    return mk_base, list(dict.fromkeys(order))


def align_sources(recipe: Recipe, sources: Sources, plan) -> Sources:
    """The recipe's sources with their token rows read on the plan's vocabulary (a base that is no input reads
    the first input's rows: it only donates the config)."""
    group: list = []
    first = plan.inputs[0]
    base = AlignedSource(sources.base, recipe.base, plan, group,
                         recipe.base if recipe.base in plan.inputs else first)
    models = [AlignedSource(s, m.model, plan, group) for m, s in zip(recipe.models, sources.models)]
    return Sources(sources.base_ck, base, models, sources.inputs)


def _run_slices(recipe, spec, params, sources, out, device, progress, overwrite, max_shard_bytes, tokenizer_from,
                t0, vocab=None) -> MergeResult:
    """A recipe with `slices` (forgetlab.merge.slicing): layers re-indexed, the output config's layer count set."""
    if spec.needs_global_pass(params) or spec.needs_pool:
        raise ParameterError(f"{spec.name} with these settings computes statistics over whole models, which slices "
                             "do not have; use scope: tensor or a per-tensor method.")
    by_ref = {recipe.base: sources.base, **{m.model: s for m, s in zip(recipe.models, sources.models)}}
    out_dtype = _DTYPES[recipe.dtype] if recipe.dtype else None
    names_of = filter_names(sources.base_ck.config) if recipe.varying else None
    base_src = sources.base
    model_type = _model_type(sources.base_ck)   # experts merged as the fused tensors (forgetlab.merge.experts)
    srcs = {id(s): s for s in [base_src, *by_ref.values()]}
    groups_of = {k: ex.expert_groups(model_type, list(s.entries().values())) for k, s in srcs.items()}
    wrapped = {k: (ex.FusedSource(s, groups_of[k]) if groups_of[k] else s) for k, s in srcs.items()}
    by_ref = {ref: wrapped[id(s)] for ref, s in by_ref.items()}
    plan, stream = sliced_stream(recipe, spec, by_ref, wrapped[id(base_src)], device, out_dtype,
                                 filter_names_of=names_of)
    out_groups = _sliced_groups(plan, [g for gs in groups_of.values() for g in gs.values()])
    if out_groups:
        plan = ex.output_plan(plan, out_groups, lambda dt: out_dtype if (out_dtype and dt.is_floating_point) else dt)
        stream = ex.split_stream(stream, out_groups)
    cfg_file = Path(sources.base_ck.config_dir) / "config.json"
    cfg_json = json.loads(cfg_file.read_text())
    keys = [k for k in ("num_hidden_layers", "n_layer", "num_layers") if k in cfg_json] or ["num_hidden_layers"]
    cfg_json[keys[0]] = output_layers(recipe)
    if vocab is not None:
        cfg_json["vocab_size"] = vocab.size
    if recipe.dtype:
        cfg_json["dtype"] = recipe.dtype
        if "torch_dtype" in cfg_json:
            cfg_json["torch_dtype"] = recipe.dtype
    recipe_text = _recipe_text(recipe, params)
    ck.write_hf_folder(out, stream, None, plan=plan, tokenizer_from=tokenizer_from, overwrite=overwrite,
                       extra_files={**({} if vocab is None else vocab.tokenizer_files()),
                                    "config.json": json.dumps(cfg_json, indent=2) + "\n", "recipe.yaml": recipe_text},
                       max_shard_bytes=max_shard_bytes, inputs=sources.inputs, kind="merge")
    report(progress, 1.0, f"merged into {out}")
    return MergeResult(out, spec.name, params, len(plan), sum(e.numel for e in plan), time.perf_counter() - t0, False,
                       notes=list(recipe.notes))


def _sliced_groups(plan, groups) -> dict:
    """The expert groups of a sliced merge's output: each fused tensor of output layer j is written as the
    members of an input group of the same name and shape, moved to layer j."""
    templates = {(with_layer(g.name, 0), g.shape): g for g in groups}
    out = {}
    for e in plan:
        g = templates.get((with_layer(e.name, 0), tuple(e.shape)))
        j = layer_from_name(e.name)
        if g is not None and isinstance(j, int):
            out[e.name] = ex.ExpertGroup(e.name, tuple(tuple(with_layer(m, j) for m in parts) for parts in g.members),
                                         g.rows, g.rest, g.dtype)
    return out


def _version() -> str:
    try:
        return version("forgetlab")
    except Exception:
        return "dev"
