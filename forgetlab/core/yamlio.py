"""Reading and editing the YAML files users hand to forgetlab (pools, recipes, mergekit configs).

- `safe_load` reads plain data only (PyYAML's safe loader: no `!!python` tags) and refuses, before any value is
  used, a document whose aliases expand to more than `MAX_NODES` values (a "billion laughs" alias bomb of a few
  hundred bytes would otherwise cost minutes and gigabytes in whatever walks it), and a mapping that gives one
  key twice (`{lam: 1, lam: 2}`: YAML parsers keep the last and drop the first without a word). A key that a
  merge key (`<<: *anchor`) brings in may be given again: that is how YAML overrides a merged value.
- `edit_yaml_file` changes a file the user owns through a round-trip parser (ruamel.yaml): comments, key
  order and keys forgetlab does not know are kept; the file is replaced atomically.
"""
from __future__ import annotations

import contextlib
import io
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import yaml
from ruamel.yaml import YAML

from forgetlab.core.errors import ForgetlabError, WorkspaceError

MAX_NODES = 100_000


class YamlError(ForgetlabError):
    """A YAML file cannot be read: malformed, or too large once its aliases are expanded."""


def expanded_size(node: yaml.Node) -> int:
    """Number of YAML nodes in the document with every alias expanded (each anchor counted once per use);
    memoised, so a bomb costs one visit per distinct node. Recursive aliases count as unbounded."""
    memo: dict[int, int] = {}
    active: set[int] = set()

    def size(n: yaml.Node) -> int:
        key = id(n)
        if key in memo:
            return memo[key]
        if key in active:
            return MAX_NODES + 1
        active.add(key)
        total = 1
        if isinstance(n, yaml.SequenceNode):
            for child in n.value:
                total += size(child)
                if total > MAX_NODES:
                    break
        elif isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                total += size(k) + size(v)
                if total > MAX_NODES:
                    break
        active.discard(key)
        memo[key] = total
        return total

    return size(node)


_MERGE_TAG = "tag:yaml.org,2002:merge"


def duplicate_key(node: yaml.Node, construct: Callable[[yaml.Node], Any]) -> tuple[Any, int, int] | None:
    """The first key given twice in one mapping of the document `node` (before merge keys are applied): (key,
    line of its first use, line of its second), lines counted from 1; None when there is none. `construct`
    turns a key's node into its value, so that `1` and `0x1`, or `a` and `"a"`, count as the same key."""
    seen_nodes: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen_nodes:
            continue
        seen_nodes.add(id(n))
        if isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            first: dict[Any, int] = {}
            for k, v in n.value:
                stack.extend((k, v))
                if k.tag == _MERGE_TAG or not isinstance(k, yaml.ScalarNode):
                    continue
                key = construct(k)
                try:
                    if key in first:
                        return key, first[key], k.start_mark.line + 1
                    first[key] = k.start_mark.line + 1
                except TypeError:   # an unhashable key: the loader refuses it itself
                    continue
    return None


def safe_load(text: str, source: str = "the YAML document") -> Any:
    """Parse `text` as plain YAML data; YamlError for malformed YAML, an alias expansion over MAX_NODES or a
    key given twice in one mapping."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if expanded_size(node) > MAX_NODES:
            raise YamlError(f"{source} uses YAML aliases (&anchor/*alias) that expand to more than {MAX_NODES:,} "
                            "values; forgetlab refuses it before reading any value. Write the values out plainly.")
        dup = duplicate_key(node, loader.construct_object)
        if dup is not None:
            key, first, second = dup
            where = f"line {first}" if first == second else f"lines {first} and {second}"
            raise YamlError(f"{source} gives the key {key!r} twice in one mapping ({where}); "
                            "YAML would keep only the last value and silently drop the first. Keep one of them.")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise YamlError(f"{source} is not valid YAML: {exc}") from None
    except RecursionError:
        raise YamlError(f"{source} is nested too deeply to read; flatten it.") from None
    finally:
        loader.dispose()


def load_file(path: str | Path, what: str = "YAML file") -> Any:
    """`safe_load` of a file, with the file named in every message."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise YamlError(f"The {what} {p} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                        f"save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8 {p.name} > new.yaml`).") from None
    except OSError as exc:
        raise YamlError(f"Cannot read the {what} {p} ({exc.strerror or exc}).") from None
    return safe_load(text, f"The {what} {p}")


def _round_trip():
    rt = YAML(typ="rt")
    rt.preserve_quotes = True
    rt.width = 4096
    return rt


def round_trip_load(text: str, source: str = "the YAML document"):
    """A ruamel.yaml round-trip document (CommentedMap …) of `text`, after `safe_load` has vetted it."""
    safe_load(text, source)
    return _round_trip().load(text)


def round_trip_dump(doc) -> str:
    """Text of a round-trip document (comments and order as loaded)."""
    buf = io.StringIO()
    _round_trip().dump(doc, buf)
    return buf.getvalue()


def write_atomic(path: str | Path, text: str) -> None:
    """Replace the file at `path` with `text` through a temporary file in the same folder (keeps its permission
    bits). A symbolic link is followed: the file it points to is replaced and the link stays a link, so every
    other user of a shared file sees the change. WorkspaceError when that folder cannot be written."""
    p = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
    mode = p.stat().st_mode & 0o777 if p.exists() else 0o644
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as exc:
        via = f" (the file {path} links to)" if p != Path(path) else ""
        raise WorkspaceError(f"Cannot write {p}{via}: {exc.strerror or exc}. Nothing was changed; make its folder "
                             "writable, or copy the file and use the copy.") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def edit_yaml_file(path: str | Path, change: Callable[[Any], None], what: str = "YAML file") -> None:
    """Apply `change` to the round-trip document of the file at `path` and write it back atomically; comments,
    key order and unknown keys survive."""
    p = Path(path)
    doc = round_trip_load(p.read_text(encoding="utf-8"), f"The {what} {p}")
    change(doc)
    write_atomic(p, round_trip_dump(doc))
