"""The default recipe of a what-if fine-tune on a pool: how the pool's own fine-tunes were trained.

A zoo built by forgetlab records its fine-tunes' recipe in the manifest beside its pool file (`manifest.json`:
`settings.finetune` — steps, batch size, peak learning rate, warm-up —, a task's own learning rate in
`settings.finetune_lr`, and the LoRA adapters' own run in `settings.lora.train`). `finetune_defaults(pool, task)`
reads it, so that `forgetlab finetune POOL --compare` and the Fine-tune page start from the same numbers: the
ones the pool's fine-tunes were actually trained with. A pool without such a record (a user's own pool) gets
`FALLBACK` (docs/zoo.md, "What-if fine-tunes"): 100 steps of batch 8 at lr 1e-3, no warm-up, cosine decay.

This module reads JSON only (no `forgetlab.zoo` import: the zoo sits above the training layer).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

MANIFEST = "manifest.json"         # the zoo's manifest beside its pool file (forgetlab.zoo.manifest.MANIFEST)


@dataclass(frozen=True)
class FinetuneDefaults:
    """Steps, batch size, peak learning rate and warm-up steps of a fine-tune, and where they come from
    (`source`: the manifest's path, or "fallback")."""

    steps: int
    batch_size: int
    lr: float
    warmup: int
    source: str = "fallback"


FALLBACK = FinetuneDefaults(steps=100, batch_size=8, lr=1e-3, warmup=0)
"""The recipe of a pool that records none (a user's own pool): forgetlab's long-standing CLI defaults."""


def _manifest(pool) -> tuple[Optional[Path], Optional[dict]]:
    """The zoo manifest beside the pool file: (its path, its content), or (None, None) when there is no pool file,
    no manifest or none readable as a JSON object."""
    source = getattr(pool, "source", None)
    path = Path(source).parent / MANIFEST if source else None
    if path is None or not path.is_file():
        return None, None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    return (path, manifest) if isinstance(manifest, dict) else (None, None)


def _recorded(manifest: dict, task: Optional[str], lora: bool) -> Optional[dict[str, Any]]:
    """The run the manifest's settings record for `task`'s full fine-tune (or its LoRA adapter), or None."""
    settings = manifest.get("settings")
    if not isinstance(settings, dict):
        return None
    if lora:
        run = (settings.get("lora") or {}).get("train") if isinstance(settings.get("lora"), dict) else None
        return dict(run) if isinstance(run, dict) else None
    run = settings.get("finetune")
    if not isinstance(run, dict):
        return None
    run = dict(run)
    own = settings.get("finetune_lr")
    if task is not None and isinstance(own, dict) and task in own:   # a task with a learning rate of its own
        run["lr"] = own[task]
    return run


def finetune_defaults(pool=None, task: Optional[str] = None, *, lora: bool = False) -> FinetuneDefaults:
    """How the pool's own fine-tunes of `task` were trained (steps, batch size, lr, warm-up), read from the zoo
    manifest beside the pool file (`lora`: its LoRA adapters' run); `FALLBACK` for a pool without a readable
    record (no pool file, no manifest, or one without those numbers)."""
    path, manifest = _manifest(pool)
    run = _recorded(manifest, task, lora) if manifest is not None else None
    if run is None:
        return FALLBACK
    try:
        found = FinetuneDefaults(steps=int(run["steps"]), batch_size=int(run["batch_size"]), lr=float(run["lr"]),
                                 warmup=int(run.get("warmup") or 0), source=str(path))
    except (ValueError, KeyError, TypeError):
        return FALLBACK
    sane = (found.steps >= 1 and found.batch_size >= 1 and 0 < found.lr < math.inf
            and 0 <= found.warmup <= found.steps)
    return found if sane else FALLBACK


@dataclass(frozen=True)
class SequenceDefaults:
    """The task sequence a zoo measures its claims on (its manifest's `settings.claims.sequence`): the order, the
    compared methods, and each stage's steps and peak learning rate where they differ from the fine-tune recipe
    (None: the recipe's). The Sequence page and `forgetlab sequence` start from it on that zoo."""

    order: tuple[str, ...]
    methods: tuple[str, ...]
    steps: Optional[int] = None
    lr: Optional[float] = None


def sequence_defaults(pool=None) -> Optional[SequenceDefaults]:
    """The zoo's task sequence (`SequenceDefaults`) read from the manifest beside the pool file; None for a pool
    without one (a user's own pool, a zoo that measures no sequence claims)."""
    _, manifest = _manifest(pool)
    if manifest is None:
        return None
    try:
        seq = ((manifest.get("settings") or {}).get("claims") or {}).get("sequence")
        if not isinstance(seq, dict):
            return None
        steps, lr = seq.get("steps"), seq.get("lr")
        return SequenceDefaults(order=tuple(map(str, seq["order"])), methods=tuple(map(str, seq["methods"])),
                                steps=int(steps) if steps is not None else None,
                                lr=float(lr) if lr is not None else None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
