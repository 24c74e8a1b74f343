"""The zoo's `manifest.json`: what was built, with which settings and versions, how long it took, how it scored.

A manifest is created before the first model is trained and rewritten (atomically: temporary file, then
rename) after every finished step, so it always says which steps are done. A zoo is trusted only when its
manifest has this module's `FORMAT`, the running forgetlab version and the spec's fingerprint.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import forgetlab
from forgetlab.core.errors import WorkspaceError
from forgetlab.core.workspace import versions
from forgetlab.zoo.presets import ZooSpec
from forgetlab.zoo.tasks import LEXICON_SEED, TASK_SEEDS

MANIFEST = "manifest.json"
FORMAT = 2  # 2: pico with skill text in pretraining, LoRA adapters, easier math, measured claims


def new_manifest(spec: ZooSpec) -> dict[str, Any]:
    """A manifest for a build about to start: settings, fingerprint, versions, seeds, no step done."""
    return {
        "format": FORMAT,
        "forgetlab_version": forgetlab.__version__,
        "versions": versions(),
        "preset": spec.preset,
        "size": spec.size,
        "name": spec.name,
        "fingerprint": spec.fingerprint(),
        "settings": spec.to_dict(),
        "seeds": {
            "model": spec.seed,
            "tasks": {t: TASK_SEEDS[t] for t in spec.tasks},
            "lexicon": LEXICON_SEED,
            "wiki_split": spec.data.wiki_seed,
        },
        "created": time.time(),
        "steps": {},
        "scorecards": {},
        "complete": False,
        "build_seconds": 0.0,
    }


def read_manifest(root: Path) -> dict[str, Any] | None:
    """The manifest in `root`, or None when there is none or it is unreadable (then the zoo is rebuilt)."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def manifest_beside(pool_or_path) -> dict[str, Any] | None:
    """The manifest of the zoo a pool comes from (a `ModelPool` read from YAML, or the path of its pool.yaml or
    zoo folder); None for a pool that is not a zoo, or a manifest that cannot be read."""
    source = getattr(pool_or_path, "source", pool_or_path)
    if source is None:
        return None
    path = Path(source)
    return read_manifest(path if path.is_dir() else path.parent)


def write_manifest(root: Path, manifest: dict[str, Any]) -> Path:
    """Write `manifest` to `root/manifest.json` atomically (temporary file in `root`, then `os.replace`)."""
    path = Path(root) / MANIFEST
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", suffix=".tmp", dir=root)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2, default=str)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        raise WorkspaceError(f"Cannot write the zoo manifest {path} ({exc.strerror or exc}); "
                             "check that the workspace is writable.") from None
    return path


def stale_reason(manifest: dict[str, Any] | None, spec: ZooSpec) -> str | None:
    """Why a manifest cannot be trusted for `spec` (None when it can): format, version or settings differ."""
    if manifest is None:
        return "no readable manifest"
    if manifest.get("format") != FORMAT:
        return f"manifest format {manifest.get('format')!r} is not {FORMAT}"
    if manifest.get("forgetlab_version") != forgetlab.__version__:
        return (f"built by forgetlab {manifest.get('forgetlab_version')!r}, "
                f"this is forgetlab {forgetlab.__version__}")
    if manifest.get("fingerprint") != spec.fingerprint():
        return "built with different settings"
    return None


def done_steps(manifest: dict[str, Any]) -> set[str]:
    """Names of the steps the manifest records as finished."""
    return {name for name, rec in (manifest.get("steps") or {}).items() if rec.get("done")}
