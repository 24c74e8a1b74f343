"""Writing outputs without ever destroying a user's files.

Every folder forgetlab writes (merges, saved fine-tunes, zoo steps) goes through `atomic_output_dir`:

- it is written into a hidden temporary folder `.<name>.tmp-<pid>-<random>` beside the target, marked as
  partial, and renamed into place only when complete; on any failure (an error, Ctrl-C, SIGTERM) the temporary
  folder is removed;
- a finished folder carries the marker file `.forgetlab-output.json`, which lists the files forgetlab wrote
  there with their sizes and hashes (forgetlab.core.filerecords); `overwrite=True` replaces only a folder with
  that marker, and only while it holds nothing else and nothing changed — never a folder forgetlab did not
  write, one to which the user has added files of their own (a NOTES.md, a folder of eval results, a model saved
  inside it) or in which they changed a file forgetlab wrote (a model re-saved after more training): those are
  named and nothing is changed; nor a file, a symbolic link (or what it points to), a folder holding one of the
  job's inputs, or the current working folder;
- one writer per target at a time (an exclusive lock `.<name>.lock` beside it, removed afterwards): a second
  job writing the same target is refused at once instead of silently replacing the first one's result; a
  user's own file that happens to carry the lock's name is used as it is and kept;
- temporaries left by a killed process (SIGKILL cannot be caught) are recognised by their marker and the dead
  process id in their name, and removed by the next write into the same folder; an old output that was being
  replaced when the process died is put back;
- a full disk gives "no space left" with what was kept, not a raw OSError.

`write_text_file` does the same for single files (`--out` tables, exported recipes): it refuses an existing
file unless asked, a folder, a parent folder that does not exist, or one of the job's inputs (the pool file,
the recipe, a probe file, a file inside a model folder), and writes through a temporary file.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

import forgetlab
from forgetlab.core.errors import ForgetlabError, OutputExistsError, ParameterError, WorkspaceError
from forgetlab.core import filerecords
from forgetlab.core.filerecords import HASH, file_records
from forgetlab.core.yamlio import safe_load, write_atomic

MARKER = ".forgetlab-output.json"
PARTIAL = ".forgetlab-partial"
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)-[^/]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_NAME_BYTES = 200
LOCK_TEXT = "forgetlab lock (removed when the job ends)\n"


class OutputRefusedError(OutputExistsError):
    """An output location that forgetlab must not replace (not its own output, an input, a link, …)."""


def absolute(path: str | Path) -> Path:
    """`path` made absolute without following symbolic links (so a link is seen as a link)."""
    return Path(os.path.abspath(os.path.expanduser(str(path))))


def check_name(name: str, what: str = "name") -> str:
    """A single path component that is safe as a file or folder name: no control characters, no separators,
    not '.', '..' or hidden, at most MAX_NAME_BYTES bytes (UTF-8). Returns it; raises ParameterError."""
    shown = repr(name) if len(str(name)) <= 60 else repr(str(name)[:60] + "…")
    if not isinstance(name, str) or not name.strip():
        raise ParameterError(f"The {what} is empty; give a short name such as 'my-merge'.")
    if _CONTROL.search(name):
        raise ParameterError(f"The {what} {shown} contains control characters (newline, tab, NUL, …); "
                             "use letters, digits, '.', '_' or '-'.")
    if "/" in name or "\\" in name or name in (".", "..") or name.startswith("."):
        raise ParameterError(f"The {what} {shown} must be a plain name, not a path or a hidden name; "
                             "use letters, digits, '.', '_' or '-'.")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise ParameterError(f"The {what} {shown} is {len(name.encode('utf-8'))} bytes long; "
                             f"use at most {MAX_NAME_BYTES}.")
    return name


def is_forgetlab_output(path: Path) -> bool:
    """True for a real folder (not a link) that carries forgetlab's output marker."""
    path = absolute(path)
    return path.is_dir() and not path.is_symlink() and (path / MARKER).is_file()


def _contains(folder: Path, other: Path) -> bool:
    return folder == other or folder in other.parents


def check_replaceable(out: str | Path, inputs: Iterable[str | Path] = ()) -> None:
    """Raise OutputRefusedError unless `out` is an output folder forgetlab wrote that holds none of `inputs`
    and is not (and does not contain) the current working folder."""
    out = absolute(out)
    if out.is_symlink():
        raise OutputRefusedError(f"{out} is a symbolic link; forgetlab never replaces a link or what it points "
                                 "to. Choose another output folder.")
    if not out.is_dir():
        raise OutputRefusedError(f"{out} exists and is not a folder; forgetlab replaces only output folders it "
                                 "wrote itself. Choose another output folder.")
    if not (out / MARKER).is_file():
        raise OutputRefusedError(f"{out} exists and was not written by forgetlab (it has no {MARKER}); "
                                 "--overwrite replaces only forgetlab's own outputs, so nothing was changed. "
                                 "Choose another output folder, or move that folder away yourself.")
    real = out.resolve()
    for ref in inputs:
        p = Path(str(ref)).expanduser()
        if not p.exists():
            continue
        if _contains(real, p.resolve()):
            raise OutputRefusedError(f"{out} holds {p}, an input of this job; replacing it would delete the "
                                     "input. Choose another output folder.")
    if _contains(real, Path.cwd().resolve()):
        raise OutputRefusedError(f"{out} is (or contains) the current working folder; choose another output "
                                 "folder.")
    problem = user_files_message(out)
    if problem:
        raise OutputRefusedError(f"{problem} --overwrite replaces only forgetlab's own, unchanged files, so nothing "
                                 "was changed. Move those out of the folder (or choose another output folder), then "
                                 "run again.")


def _shown(files: list[str]) -> str:
    return ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")


def user_files_message(out: str | Path) -> str:
    """What in forgetlab's output folder `out` is the user's (`foreign_files`: files forgetlab did not write there;
    `changed_files`: files it wrote that were changed since), as a sentence naming them; "" when there is none."""
    out = absolute(out)
    parts = []
    foreign = foreign_files(out)
    if foreign:
        parts.append(f"files forgetlab did not write there: {_shown(foreign)}")
    changed = changed_files(out)
    if changed:
        parts.append(f"files changed since forgetlab wrote them: {_shown(changed)}")
    return f"{out} holds {'; and '.join(parts)}." if parts else ""


# What forgetlab wrote into its outputs before the marker listed the files (forgetlab ≤ 0.1.0, before 4 Dec
# 2026): an output whose marker has no list is judged by these names, so that a user's file is still found.
_LEGACY_OUTPUT_FILES = re.compile(
    r"^(config\.json|generation_config\.json|(model|adapter_model|pytorch_model)[-.\w]*\.(safetensors|bin|json)"
    r"|adapter_config\.json|tokenizer(_config)?\.json|special_tokens_map\.json|chat_template\.(jinja|json)"
    r"|added_tokens\.json|vocab\.(json|txt)|merges\.txt|tokenizer\.model|recipe\.(yaml|json)"
    r"|scorecards?\.json|finetune\.json|results\.(csv|json)|[-\w]+\.csv|[-\w]+\.json|README\.md)$")


def written_files(folder: Path) -> list[str]:
    """The files below `folder` as sorted relative POSIX paths (links count as files, never followed)."""
    found = []
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        found.extend((rel / f).as_posix() for f in files)
        found.extend((rel / d).as_posix() for d in dirs if (Path(root) / d).is_symlink())
    return sorted(found)


def _read_marker(out: Path) -> dict:
    try:
        marker = json.loads((out / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def _ownership(marker: dict):
    """A test of a relative path: is it one of the files that `marker` says forgetlab wrote (for an old marker
    without a list: named like forgetlab's files, not in a sub-folder)?"""
    listed = marker.get("files")
    ours = {MARKER}
    if isinstance(listed, list):
        ours.update(str(f) for f in listed)
        return ours.__contains__

    def is_ours(rel: str) -> bool:
        return rel in ours or ("/" not in rel and bool(_LEGACY_OUTPUT_FILES.match(rel)))
    return is_ours


def changed_files(out: str | Path) -> list[str]:
    """The files forgetlab wrote into its output folder `out` that were changed since (re-saved, edited, replaced):
    by their recorded size and hash, or — for a marker written before those were recorded — by a change time
    later than the marker's (forgetlab.core.filerecords). A file that was removed is not listed."""
    out = absolute(out)
    marker = _read_marker(out)
    is_ours = _ownership(marker)
    return filerecords.changed_files(out, marker, out / MARKER, lambda rel: rel != MARKER and is_ours(rel), written_files(out))


def foreign_files(out: Path) -> list[str]:
    """The files in forgetlab's output folder `out` that forgetlab did not write there (the user's own):
    everything not listed in its marker (for an old marker without a list: not named like forgetlab's files,
    or in a sub-folder). Empty folders the user made count too."""
    is_ours = _ownership(_read_marker(out))
    foreign = [f for f in written_files(out) if not is_ours(f)]
    for root, dirs, files in os.walk(out):
        if not dirs and not files and Path(root) != out:
            foreign.append(Path(root).relative_to(out).as_posix() + "/")
    return sorted(foreign)


def record_file(folder: str | Path, rel: str) -> None:
    """Add `rel` to the files that forgetlab's output `folder` lists as its own, with its size and hash (for a
    file forgetlab writes into a finished output, such as a merge's scorecards.json), so that a later overwrite
    may replace it. Does nothing for a folder without forgetlab's marker or with an old marker without a list.
    An old marker keeps the time it was first written (`unrecorded_since`), by which its other files are
    judged (forgetlab.core.filerecords)."""
    folder = absolute(folder)
    marker = folder / MARKER
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
        first_written = os.stat(marker).st_ctime_ns
    except (OSError, ValueError):
        return
    if not (isinstance(data, dict) and isinstance(data.get("files"), list)):
        return
    records = data.get("records") if isinstance(data.get("records"), dict) else {}
    if any(f not in records for f in data["files"]) and not isinstance(data.get("unrecorded_since"), int):
        data["unrecorded_since"] = first_written
    data["files"] = sorted({*data["files"], rel})
    data["records"] = {**records, **file_records(folder, [rel])}
    write_atomic(marker, json.dumps(data) + "\n")


def check_output_dir(out: str | Path, overwrite: bool = False, inputs: Iterable[str | Path] = ()) -> Path:
    """Check before any work is done that `out` may be written: refused if it exists, unless `overwrite` and
    `check_replaceable` allows it. Returns the absolute path."""
    out = absolute(out)
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise OutputExistsError(f"{out} exists already. Choose another output folder or ask to overwrite "
                                    "it (--overwrite on the command line).")
        check_replaceable(out, inputs)
    return out


def process_alive(pid: int) -> bool:
    """Whether a process with id `pid` is running (this one included)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(folder: str | Path) -> list[Path]:
    """Remove forgetlab's own temporaries in `folder` whose process is gone; put back an output whose
    replacement was interrupted. Returns what was removed or restored."""
    folder = absolute(folder)
    done: list[Path] = []
    if not folder.is_dir():
        return done
    for entry in folder.iterdir():
        m = _TEMP.match(entry.name)
        if not m or entry.is_symlink() or not entry.is_dir() or process_alive(int(m["pid"])):
            continue
        target = folder / m["name"]
        # an empty one: killed between creating the folder and marking it partial
        if m["kind"] == "tmp" and ((entry / PARTIAL).is_file() or not any(entry.iterdir())):
            shutil.rmtree(entry, ignore_errors=True)
            done.append(entry)
        elif m["kind"] == "old" and (entry / MARKER).is_file():
            if not target.exists() and not target.is_symlink():
                entry.rename(target)
            else:
                shutil.rmtree(entry, ignore_errors=True)
            done.append(entry)
    return done


@contextlib.contextmanager
def exclusive_lock(lock: Path, busy: Exception, cannot: Exception, remove: bool = False) -> Iterator[None]:
    """Hold an exclusive, non-blocking flock on the file `lock` (created if needed): raise `busy` at once when
    another process holds it, `cannot` when the file cannot be created; `remove` deletes the file afterwards.

    The lock file forgetlab creates holds LOCK_TEXT; a file of that name with other contents is the user's: it
    is locked as it is (never written) and never removed. A link or a folder of that name is refused."""
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        raise WorkspaceError(f"{lock} is in the way of forgetlab's lock file (it is a "
                             f"{'symbolic link' if lock.is_symlink() else 'folder'}); nothing was changed. Move it "
                             "away, then run again.")
    try:
        fh = open(lock, "a+")
    except OSError:
        raise cannot from None
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise busy from None
        try:
            fh.seek(0)
            ours = fh.read(len(LOCK_TEXT) + 1) in ("", LOCK_TEXT)
            if ours and os.fstat(fh.fileno()).st_size == 0:
                with contextlib.suppress(OSError):
                    fh.write(LOCK_TEXT)
                    fh.flush()
        except (OSError, UnicodeDecodeError):
            ours = False
        try:
            yield
        finally:
            if remove and ours:
                with contextlib.suppress(OSError):
                    lock.unlink()
    finally:
        with contextlib.suppress(OSError):  # on a full disk the buffered LOCK_TEXT cannot be flushed: no matter
            fh.close()


def _writer_lock(out: Path):
    """One writer per output: `.<name>.lock` beside it, removed afterwards."""
    return exclusive_lock(
        out.parent / f".{out.name}.lock",
        OutputExistsError(f"Another forgetlab job is writing {out} right now; nothing was changed. Wait for it "
                          "to finish or choose another output folder."),
        WorkspaceError(f"Cannot write into {out.parent}; choose a writable folder."),
        remove=True)


def is_disk_full(exc: BaseException) -> bool:
    """True when `exc` (or what caused it) is an out-of-space error, from Python or from a native writer."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(exc)
        if "No space left" in text or "StorageFull" in text or "os error 28" in text or "Disk quota" in text:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def disk_full_error(out: Path, existed: bool) -> WorkspaceError:
    """The message for a write that ran out of space."""
    try:
        free = shutil.disk_usage(out.parent).free
        room = f" ({free / 2**20:.0f} MiB free there now)"
    except OSError:
        room = ""
    kept = " The existing output is untouched." if existed else ""
    return WorkspaceError(f"No space left on the device holding {out.parent}{room} while writing {out.name}; "
                          f"nothing was written (the partial output was removed).{kept} Free some space or "
                          "choose a folder on another disk.")


@contextlib.contextmanager
def signals_held(signums: Iterable[int] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM for the block: one that arrives meanwhile is delivered, as usual, when the block
    ends — for a few steps that must happen together (a folder landing and its entry in a pool file). Only the
    main thread receives signals; elsewhere the block just runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {}
    for signum in signums:
        handler = signal.getsignal(signum)
        if handler is not None:          # None: set outside Python, which Python cannot put back
            previous[signum] = handler
            signal.signal(signum, lambda n, frame: arrived.append(n))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)


@contextlib.contextmanager
def atomic_output_dir(out_dir: str | Path, overwrite: bool = False, *,
                      inputs: Iterable[str | Path] = (), kind: str = "output",
                      then: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """Yield a temporary folder beside `out_dir`; rename it to `out_dir` on success, delete it on failure.

    An existing `out_dir` is refused unless `overwrite`, and even then replaced only when forgetlab wrote it
    and it holds none of `inputs` (see the module docstring); the old one goes only once the new is complete.
    `kind` is recorded in the output's marker file. `then(out_dir)` runs right after the folder lands, with
    Ctrl-C and SIGTERM held (`signals_held`): what must exist together with the folder (its entry in a pool
    file). If `then` fails, the folder is taken back (an old one put back), so neither is left.
    """
    inputs = list(inputs)
    out = check_output_dir(out_dir, overwrite, inputs)
    with removed_if_failed(missing_dirs(out.parent)):
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WorkspaceError(f"Cannot write into {out.parent} ({exc.strerror or exc}); choose a writable "
                                 "folder.") from None
        with _atomic_output_dir(out, overwrite, inputs, kind, then) as tmp:
            yield tmp


def missing_dirs(folder: str | Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, innermost first (what `mkdir -p` would create)."""
    folder = absolute(folder)
    return [p for p in (folder, *folder.parents) if not (p.exists() or p.is_symlink())]


@contextlib.contextmanager
def removed_if_failed(made: Iterable[Path]) -> Iterator[None]:
    """Remove again the (empty) folders `made` (innermost first) when the block fails, so that a refused or
    failed write leaves no trace of the folders created for it."""
    made = list(made)
    try:
        yield
    except BaseException:
        for p in made:
            with contextlib.suppress(OSError):
                p.rmdir()
        raise


@contextlib.contextmanager
def _atomic_output_dir(out: Path, overwrite: bool, inputs: list, kind: str,
                       then: Callable[[Path], None] | None = None) -> Iterator[Path]:
    with _writer_lock(out):
        clean_stale(out.parent)
        existed = out.exists() or out.is_symlink()
        if existed:  # another job may have finished it while we waited for nothing: check again under the lock
            check_output_dir(out, overwrite, inputs)
        tmp = None
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
            (tmp / PARTIAL).write_text("")
        except OSError as exc:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            if is_disk_full(exc):
                raise disk_full_error(out, existed) from None
            raise WorkspaceError(f"Cannot write into {out.parent} ({exc.strerror or exc}); choose a writable "
                                 "folder.") from None
        try:
            yield tmp
            files = [f for f in written_files(tmp) if f not in (MARKER, PARTIAL)]
            (tmp / MARKER).write_text(json.dumps({"written_by": "forgetlab", "kind": kind,
                                                  "version": forgetlab.__version__, "time": time.time(),
                                                  "files": files, "hash": HASH,
                                                  "records": file_records(tmp, files)}) + "\n")
            (tmp / PARTIAL).unlink()
            tmp.chmod(0o755)  # mkdtemp makes it private; a saved model should be readable like any folder
            replacing = out.exists() or out.is_symlink()
            if replacing:
                check_replaceable(out, inputs)
            with signals_held() if then is not None else contextlib.nullcontext():
                old = None
                if replacing:
                    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent))
                    os.rmdir(old)
                    out.rename(old)
                tmp.rename(out)
                if then is not None:
                    try:
                        then(out)
                    except BaseException:
                        out.rename(tmp)             # taken back: removed below, the old one put back
                        if old is not None:
                            old.rename(out)
                        raise
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, Exception) and is_disk_full(exc):
                raise disk_full_error(out, existed) from None
            raise


def named_inputs(values: Iterable[object]) -> list[Path]:
    """The files and folders a command reads, from its argument values: every value naming an existing path,
    and for a small YAML/JSON file among them (a pool, a recipe, a mergekit config) every path named inside it
    (relative to that file: model folders, adapters, probe files)."""
    found: list[Path] = []

    def walk(node, root: Path) -> None:
        if isinstance(node, dict):
            for v in node.values():
                walk(v, root)
        elif isinstance(node, list):
            for v in node:
                walk(v, root)
        elif isinstance(node, str) and node.strip() and len(node) < 4096:
            cand = (root / Path(node).expanduser())
            with contextlib.suppress(OSError, ValueError):
                if cand.exists():
                    found.append(cand)

    for value in values:
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(v, (str, Path)) or not str(v).strip():
                continue
            p = Path(str(v)).expanduser()
            try:
                if not p.exists():
                    continue
                found.append(p)
                if p.is_file() and p.stat().st_size <= 1 << 20 and p.suffix.lower() in (".yaml", ".yml", ".json"):
                    walk(safe_load(p.read_text(encoding="utf-8"), str(p)), p.parent)
            except (OSError, ValueError, ForgetlabError):
                continue
    return found


def check_output_file(path: str | Path, overwrite: bool = False, inputs: Iterable[str | Path] = ()) -> Path:
    """Check that a single output file may be written: not a folder, its folder exists, an existing file is
    replaced only with `overwrite`, and never one of the job's `inputs` (the file itself, or an existing file
    inside an input folder such as a model's config.json). Returns the absolute path."""
    p = absolute(path)
    if p.is_dir():
        raise OutputRefusedError(f"{p} is a folder; give a file name for the output (e.g. {p / 'out.csv'}).")
    if not p.parent.is_dir():
        raise WorkspaceError(f"The folder {p.parent} does not exist; create it first or choose another output "
                             "file. Nothing was written.")
    if p.is_symlink():
        raise OutputRefusedError(f"{p} is a symbolic link; forgetlab does not write through links. Choose "
                                 "another output file.")
    if p.exists():
        real = p.resolve()
        for ref in inputs:
            q = Path(str(ref)).expanduser()
            with contextlib.suppress(OSError):
                if q.exists() and _contains(q.resolve(), real):
                    what = "is" if q.resolve() == real else f"lies in {q}, which is"
                    raise OutputRefusedError(f"{p} {what} an input of this command; writing the output there "
                                             "would destroy it, so nothing was done. Choose another output file.")
    if p.exists() and not overwrite:
        raise OutputExistsError(f"{p} exists already; choose another file or pass --overwrite.")
    return p


def check_output_folder(path: str | Path, inputs: Iterable[str | Path] = ()) -> Path:
    """Check that an output folder may be written into: not a file nor a link, its parent folder exists, and
    neither one of the job's `inputs` nor inside one (the files it will hold are checked by name with
    `check_output_file`). Returns the absolute path."""
    p = absolute(path)
    if p.is_symlink():
        raise OutputRefusedError(f"{p} is a symbolic link; forgetlab does not write through links. Choose another "
                                 "output folder.")
    if p.exists() and not p.is_dir():
        raise OutputRefusedError(f"{p} is a file; --out names a folder here (e.g. {p.parent / 'results'}).")
    if not p.parent.is_dir():
        raise WorkspaceError(f"The folder {p.parent} does not exist; create it first or choose another output "
                             "folder. Nothing was written.")
    for ref in inputs:
        q = Path(str(ref)).expanduser()
        with contextlib.suppress(OSError):
            if q.exists() and (q.resolve() == p.resolve() or _contains(q.resolve(), p.resolve())):
                raise OutputRefusedError(f"{p} is or lies in {q}, an input of this command; choose another output "
                                         "folder. Nothing was written.")
    return p


def write_bytes_file(path: str | Path, data: bytes, overwrite: bool = False) -> Path:
    """Write `data` to `path` through a temporary file renamed into place (see `check_output_file`)."""
    p = check_output_file(path, overwrite)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as exc:
        raise WorkspaceError(f"Cannot write into {p.parent} ({exc.strerror or exc}); choose a writable "
                             "folder.") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        if p.exists() and not overwrite:  # appeared meanwhile
            raise OutputExistsError(f"{p} appeared while writing; nothing was overwritten.")
        os.replace(tmp, p)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, Exception) and is_disk_full(exc):
            raise WorkspaceError(f"No space left on the device holding {p.parent} while writing {p.name}; "
                                 "nothing was written. Free some space or choose another folder.") from None
        raise
    return p


def write_text_file(path: str | Path, text: str, overwrite: bool = False) -> Path:
    """Write `text` (UTF-8) to `path` atomically (see `write_bytes_file`)."""
    return write_bytes_file(path, text.encode("utf-8"), overwrite)
