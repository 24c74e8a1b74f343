"""forgetlab.core.registry.Registry: entries found in a package's modules, and a lookup from another thread while
the modules are being imported."""
from __future__ import annotations

import sys
import threading
import time

import pytest

from forgetlab.core.errors import ParameterError


def _package(tmp_path, name: str, slow: float = 0.0):
    """A package `name` whose modules `a` (taking `slow` seconds to import) and `b` declare entries in the registry
    of its `_reg` module (underscored: not discovered)."""
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_reg.py").write_text(f"from forgetlab.core.registry import Registry\nREG = Registry('thing', {name!r})\n")
    (pkg / "a.py").write_text(f"import time\nfrom {name}._reg import REG\ntime.sleep({slow})\nREG.add('a', 1)\n")
    (pkg / "b.py").write_text(f"from {name}._reg import REG\nREG.add('b', 2)\nREG.add('b_two', 3)\n")
    sys.path.insert(0, str(tmp_path))
    __import__(f"{name}._reg")
    return sys.modules[f"{name}._reg"].REG


@pytest.fixture
def cleanup():
    before = set(sys.modules), list(sys.path)
    yield
    for m in set(sys.modules) - before[0]:
        del sys.modules[m]
    sys.path[:] = before[1]


def test_entries_are_found_in_the_package_by_name_then_by_discovery(tmp_path, cleanup):
    reg = _package(tmp_path, "reg_pkg_find")
    assert reg.get("b") == 2 and "reg_pkg_find.a" not in sys.modules     # the module named like the entry alone
    assert reg["b_two"] == 3                                              # found in the module imported before
    assert reg.names() == ["a", "b", "b_two"] and len(reg) == 3 and "a" in reg
    with pytest.raises(ParameterError, match="Unknown thing 'c'; choose one of a, b, b_two"):
        reg.get("c")
    with pytest.raises(ParameterError, match="registered already"):
        reg.add("a", 5)


def test_a_lookup_while_another_thread_discovers_waits_for_every_entry(tmp_path, cleanup):
    reg = _package(tmp_path, "reg_pkg_slow", slow=0.5)
    seen = {}
    first = threading.Thread(target=lambda: seen.setdefault("first", reg.names()))
    first.start()
    time.sleep(0.1)                          # the first thread is importing the slow module
    seen["second"] = reg.names()
    first.join()
    assert seen["first"] == seen["second"] == ["a", "b", "b_two"]
