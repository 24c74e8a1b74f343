"""What forgetlab wrote into an output folder, file by file, and which of those files have changed since.

The marker of a finished output (`forgetlab.core.outputs.MARKER`) records every file forgetlab wrote there: its
size, its hash (HASH, XXH3-128) and its stat signature (mtime, ctime, inode). `changed_files` compares a folder
with that record before anything replaces or removes it:

- a file whose size, mtime, ctime and inode are all as recorded has not been written since — the kernel sets a
  file's ctime on every change of its contents or metadata and no program can set it back — so it is not read
  again: checking a 100 GB merge costs a few stat calls;
- any other file (rewritten, touched, copied or restored from a backup) is hashed and compared with its record:
  same bytes, same file; a different size is a change at once.

Hashing costs no extra read for the shards forgetlab streams itself: `HashingWriter` hashes the bytes as they are
written and `note_digest` hands the digest on. Files written by other code (a transformers save, a tokenizer, a
PEFT adapter) are hashed once after writing, several at a time.

Markers written before hashes were recorded (names only, or no list at all) are judged by time: forgetlab wrote
the marker after every file of the folder, so a file whose ctime is later than the marker's was changed (or
added) after forgetlab finished. A folder copied as a whole (cp -a) gets new ctimes in copy order and may then
look changed: it is refused, never replaced — the safe side.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Mapping

import xxhash

# XXH3-128 (the xxhash package): ~20 GB/s on one core where SHA-256 gives ~0.7, so that recording a 100 GB merge
# costs seconds; a change made by a user (not an adversary forging a collision) is missed with probability 2**-128
HASH = "xxh3_128"
CHUNK = 1 << 22
_MAX_KNOWN = 100_000

# digests of files hashed in this process, by (device, inode, size, mtime): what a streaming writer noted while
# writing, and what a check hashed (so that the check repeated just before a replacement reads nothing again)
_known: dict[tuple[int, int, int, int], str] = {}


def new_hash():
    """A hash object (update, hexdigest) of the algorithm outputs are recorded with (HASH)."""
    return xxhash.xxh3_128()


def _text_digest(text: str) -> str:
    return xxhash.xxh3_128(text.encode("utf-8", "surrogateescape")).hexdigest()


class HashingWriter:
    """Writes bytes to a binary file and hashes them (HASH) as it goes: the shard writer's hash costs no read."""

    def __init__(self, fh):
        self.fh = fh
        self._hash = new_hash()

    def write(self, data) -> None:
        """Write `data` (bytes or a memoryview) and add it to the hash."""
        self.fh.write(data)
        self._hash.update(data)

    def close(self) -> None:
        """Close the file."""
        self.fh.close()

    def hexdigest(self) -> str:
        """The digest of everything written."""
        return self._hash.hexdigest()


def _key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _remember(st: os.stat_result, digest: str) -> None:
    if len(_known) >= _MAX_KNOWN:
        _known.clear()
    _known[_key(st)] = digest


def note_digest(path: str | Path, digest: str) -> None:
    """Record that the file at `path`, as it is now, has the hex digest `digest` (computed by its writer while
    writing it), so that recording the output does not read it again."""
    _remember(os.stat(path), digest)


def file_digest(path: str | Path, st: os.stat_result | None = None) -> str:
    """The hex digest (HASH) of the file at `path`: the one noted for it as it is now, else read and hashed."""
    st = st or os.stat(path)
    known = _known.get(_key(st))
    if known is not None:
        return known
    h = new_hash()
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    digest = h.hexdigest()
    _remember(st, digest)
    return digest


def _signature(st: os.stat_result) -> list[int]:
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _parallel(fn: Callable, items: list) -> list:
    workers = min(len(items), max(1, min(8, os.cpu_count() or 1)))
    if workers <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


def file_records(folder: str | Path, files: Iterable[str]) -> dict[str, dict]:
    """The record of each file `files` (relative POSIX paths) in `folder`: {"size", HASH, "stat": [mtime_ns,
    ctime_ns, inode]}. Links are recorded by their target text, never followed."""
    folder = Path(folder)

    def one(rel: str) -> tuple[str, dict]:
        p = folder / rel
        st = os.lstat(p)
        if p.is_symlink():
            digest = _text_digest(os.readlink(p))
        else:
            digest = file_digest(p, st)
        return rel, {"size": st.st_size, HASH: digest, "stat": _signature(st)}

    return dict(_parallel(one, sorted(files)))


def unchanged(path: Path, record: Mapping) -> bool:
    """Whether the file at `path` still holds what `record` (from `file_records`) says: the same stat signature
    (not written since), else the same size and hash."""
    st = os.lstat(path)
    if st.st_size != record.get("size"):
        return False
    if list(record.get("stat") or []) == _signature(st):
        return True
    if path.is_symlink():
        return _text_digest(os.readlink(path)) == record.get(HASH)
    return record.get(HASH) is not None and file_digest(path, st) == record.get(HASH)


def changed_files(folder: str | Path, marker: Mapping, marker_path: str | Path, ours: Callable[[str], bool],
                  files: Iterable[str]) -> list[str]:
    """Of `files` (relative paths in `folder`), those that `ours` says forgetlab wrote and that have changed since:
    judged by their record in `marker` where it has one (`unchanged`), else by time — a ctime later than the
    marker's (`marker["unrecorded_since"]` when forgetlab rewrote an old marker, else the marker file's own ctime).
    A file that cannot be read counts as changed. Files to hash are hashed several at a time."""
    folder = Path(folder)
    records = marker.get("records") if isinstance(marker.get("records"), Mapping) else {}
    since = marker.get("unrecorded_since")
    if not isinstance(since, int):
        since = os.stat(marker_path).st_ctime_ns
    todo = [rel for rel in files if ours(rel)]

    def is_changed(rel: str) -> bool:
        p = folder / rel
        record = records.get(rel)
        try:
            if isinstance(record, Mapping):
                return not unchanged(p, record)
            return os.lstat(p).st_ctime_ns > since
        except FileNotFoundError:          # removed meanwhile: nothing of the user's to lose there
            return False
        except OSError:                    # unreadable: cannot tell, so it counts as changed (the safe side)
            return True

    flags = _parallel(is_changed, todo)
    return sorted(rel for rel, flag in zip(todo, flags) if flag)
