"""One generic registry for named things of one kind — merge methods, analyses, memory estimators.

A `Registry[T]` maps names to entries. Entries are declared in the modules of a package (a decorator or a
`REGISTRY.add(...)` line beside the code they describe), and the registry finds them itself, the way the CLI
finds `forgetlab/commands/`: on the first lookup of a name it does not hold, it imports the package's modules
(the module named like the entry first, then every other one). So no module has to be imported only "to
register something", and asking for one entry imports one module where the names follow the convention.

    METHODS: Registry[MethodSpec] = Registry("merge method", "forgetlab.merge.methods")
    METHODS.add("ties", spec)          # in forgetlab/merge/methods/ties.py
    METHODS.get("ties")                # imports forgetlab.merge.methods.ties on first use
"""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import threading
from typing import Callable, Generic, Iterator, Optional, Sequence, TypeVar

from forgetlab.core.errors import ParameterError

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind (`what`, for messages) by name, discovered in the modules of `packages`.

    `module_of(name)` may map a name to the module that declares it (default: the name with '-' read as '_',
    tried in each package), so that `get` imports that module alone before falling back to every module."""

    def __init__(self, what: str, packages: str | Sequence[str] = (), *,
                 module_of: Optional[Callable[[str], str]] = None):
        self.what = what
        self.packages = (packages,) if isinstance(packages, str) else tuple(packages)
        self.module_of = module_of or (lambda name: name.replace("-", "_").split(".")[0])
        self._entries: dict[str, T] = {}
        self._discovered = False
        self._discovering = False
        self._lock = threading.RLock()
        self._discovery = threading.RLock()     # held while the packages' modules are imported (not by `add`)

    # ---------------------------------------------------------------------------------------------- declaring

    def add(self, name: str, entry: T) -> T:
        """Declare `entry` under `name` (once; a second, different entry under the same name is refused)."""
        with self._lock:
            old = self._entries.get(name)
            if old is not None and old is not entry:
                raise ParameterError(f"A {self.what} named {name!r} is registered already.")
            self._entries[name] = entry
        return entry

    def replace(self, name: str, entry: T) -> T:
        """Put `entry` in place of the one declared under `name` (e.g. a method with its CPU kernel added)."""
        with self._lock:
            if name not in self._entries:
                raise ParameterError(f"No {self.what} named {name!r} is registered to replace.")
            self._entries[name] = entry
        return entry

    # ---------------------------------------------------------------------------------------------- finding

    def discover(self) -> None:
        """Import every module of the packages (once), so that every entry is declared. Another thread asking
        meanwhile waits for the whole discovery (it would see some entries only); a module imported by the
        discovery that looks an entry up in this thread gets what is declared so far."""
        if self._discovered:
            return
        with self._discovery:
            if self._discovered or self._discovering:
                return
            self._discovering = True
            try:
                for package in self.packages:
                    for module in _modules(package):
                        importlib.import_module(module)
                self._discovered = True
            finally:
                self._discovering = False

    def _import_named(self, name: str) -> None:
        stem = self.module_of(name)
        for package in self.packages:
            module = f"{package}.{stem}"
            if importlib.util.find_spec(module) is not None:
                importlib.import_module(module)
                return

    def find(self, name: str) -> Optional[T]:
        """The entry called `name`, or None (its module, then every module of the packages, imported first)."""
        if name not in self._entries and self.packages:
            try:
                self._import_named(name)
            except ModuleNotFoundError:
                pass
            if name not in self._entries:
                self.discover()
        return self._entries.get(name)

    def get(self, name: str) -> T:
        """The entry called `name`, or a ParameterError naming every registered one."""
        entry = self.find(name)
        if entry is None:
            raise ParameterError(f"Unknown {self.what} {name!r}; choose one of {', '.join(self.names())}.")
        return entry

    def __getitem__(self, name: str) -> T:
        """`registry[name]`: the same as `get(name)` (a ParameterError naming every registered entry if unknown)."""
        return self.get(name)

    def names(self) -> list[str]:
        """Every registered name, sorted (after discovery)."""
        self.discover()
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) of every registered entry, sorted by name (after discovery)."""
        self.discover()
        return sorted(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.find(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


def _modules(package: str) -> list[str]:
    """The modules and subpackages of `package` whose names do not start with '_' (subpackages' modules too)."""
    pkg = importlib.import_module(package)
    out = []
    for info in sorted(pkgutil.iter_modules(getattr(pkg, "__path__", [])), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        out.append(f"{package}.{info.name}")
        if info.ispkg:
            out.extend(_modules(f"{package}.{info.name}"))
    return out
