"""Saving a model into a pool: its folder and its entry in the pool file appear together, or neither does.

`save_into_pool(pool, name, target, write, adapter=…)`:

1. writes a journal `.<folder>.pool-entry.json` beside `target`, naming the pool file, the entry and this process;
2. calls `write(then)`, which writes the folder atomically (`forgetlab.core.outputs.atomic_output_dir`) and calls
   `then(folder)` right after it lands, with Ctrl-C and SIGTERM held: `then` adds the entry to the pool and to its
   file. If that fails, the folder is taken back, so neither is left; a Ctrl-C that arrived meanwhile is
   delivered once both exist;
3. removes the journal.

SIGKILL cannot be held: a process killed between the folder landing and the pool file being written leaves a
complete folder that the pool file does not list, and the journal. `finish_interrupted_saves(pool, folder)` —
run before every save into that folder (`forgetlab.train.runs.check_save_as`) — finds journals of processes that
are gone and finishes their work: it adds the entry when the folder landed (the model is whole: it was renamed
into place only when complete), and just removes the journal when it did not, or when the entry is there.
The journal is what tells such a folder from one whose entry the user removed from the pool file on purpose,
which is left alone.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from forgetlab.core.errors import ForgetlabError
from forgetlab.core.outputs import (absolute, exclusive_lock, is_forgetlab_output, missing_dirs, process_alive,
                                    removed_if_failed)
from forgetlab.core.yamlio import write_atomic

JOURNAL_SUFFIX = ".pool-entry.json"


def journal_path(target: str | Path) -> Path:
    """The journal of a save into `target`: a hidden file beside it."""
    target = Path(target)
    return target.parent / f".{target.name}{JOURNAL_SUFFIX}"


def _pool_file(pool) -> str | None:
    source = getattr(pool, "source", None)
    return str(Path(source).resolve()) if source else None


def save_into_pool(pool, name: str, target: str | Path, write: Callable[[Callable[[Path], None]], Path], *,
                   adapter: bool = False, update_yaml: bool = True) -> Path:
    """Write a model folder at `target` with `write(then)` (which passes `then` to `atomic_output_dir`) and add
    it to `pool` as `name` — `{adapter: target}` with `adapter` — and to the pool's file when it has one and
    `update_yaml`; both or neither (module docstring). Returns what `write` returns."""
    target = absolute(target)
    journal = journal_path(target)
    pool_file = _pool_file(pool) if update_yaml else None

    landed: list[Path] = []

    def then(folder: Path) -> None:
        pool.add(name, {"adapter": str(folder)} if adapter else str(folder),
                 scan_nonfinite=False)           # a full scan would hold Ctrl-C for as long as it reads
        try:
            if pool_file is not None:
                pool.add_to_yaml(name)
        except BaseException:
            pool.remove(name)
            raise
        landed.append(folder)

    with removed_if_failed(missing_dirs(target.parent)):   # a failed save leaves no folder made for it
        if pool_file is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(journal, json.dumps({"pid": os.getpid(), "pool": pool_file, "name": name,
                                              "folder": target.name, "adapter": adapter}) + "\n")
        try:
            return write(then)
        except KeyboardInterrupt as exc:       # held while the folder landed, delivered after: say what was kept
            if landed and not str(exc):
                where = f" and to {pool_file}" if pool_file else ""
                raise type(exc)(f"{name} had been saved into {landed[0]} and added to the pool{where} before the "
                                "signal was handled") from None
            raise
        finally:
            with contextlib.suppress(OSError):
                journal.unlink()


def finish_interrupted_saves(pool, folder: str | Path) -> list[str]:
    """Finish the saves into `folder` for `pool` whose process was killed (journals of processes that are gone):
    add to the pool and its file each entry whose model folder landed and that the pool does not list yet, and
    remove their journals. Returns the names added."""
    folder = Path(folder)
    pool_file = _pool_file(pool)
    added: list[str] = []
    if pool_file is None or not folder.is_dir():
        return added
    for journal in sorted(folder.glob(f".*{JOURNAL_SUFFIX}")):
        try:
            data = json.loads(journal.read_text(encoding="utf-8"))
            pid, name, target = int(data["pid"]), str(data["name"]), folder / str(data["folder"])
            mine = data.get("pool") == pool_file
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not mine or process_alive(pid):
            continue
        if is_forgetlab_output(target) and name not in pool.entries:
            spec: Any = {"adapter": str(target)} if data.get("adapter") else str(target)
            pool.add(name, spec)
            try:
                pool.add_to_yaml(name)
            except BaseException:
                pool.remove(name)
                raise
            added.append(name)
        with contextlib.suppress(OSError):
            journal.unlink()
        _drop_stale_lock(target)
    return added


def _drop_stale_lock(target: Path) -> None:
    """Remove the writer lock a killed save left beside `target` (forgetlab.core.outputs: it is forgetlab's, and no
    process holds it); a lock someone holds, or a user's file of that name, stays."""
    lock = target.parent / f".{target.name}.lock"
    if lock.is_file() and not lock.is_symlink():
        with contextlib.suppress(ForgetlabError, OSError):
            with exclusive_lock(lock, ForgetlabError("busy"), ForgetlabError("cannot"), remove=True):
                pass
