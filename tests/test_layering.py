"""The package's import graph: no import cycles and no imports of private names, in the layers checked here.

Every ``import`` in a module counts, at the top or inside a function or an ``if TYPE_CHECKING:`` block: a
cycle hidden behind a function-local import is still a cycle. Run as a script to print the cycles and
private imports of the whole package (``python tests/test_layering.py``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "specviz"

#: The layers whose modules must be in no import cycle and import no private name (nor give one away): all of them.
CHECKED = ("specviz",)


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """The import graph (module -> the package modules it imports) and every private name imported
    from another module, as (importer, source module, name)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    private: list[tuple[str, str, str]] = []
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                graph[mod] |= {a.name for a in node.names if a.name in mods and a.name != mod}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source not in mods:
                    continue
                for a in node.names:
                    target = f"{source}.{a.name}" if f"{source}.{a.name}" in mods else source
                    if target != mod:
                        graph[mod].add(target)
                    if a.name.startswith("_") and not a.name.startswith("__") and target == source:
                        private.append((mod, source, a.name))
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def checked(mod: str) -> bool:
    return any(mod == layer or mod.startswith(layer + ".") for layer in CHECKED)


def test_the_checker_finds_a_cycle_behind_a_function_local_import(tmp_path):
    # the checker itself: a cycle through an import inside a function, and a private name imported
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    pkg = tmp_path / "specviz"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("from .two import _helper\n")
    (pkg / "two.py").write_text("def _helper():\n    from . import one\n")
    mods = {"specviz": pkg / "__init__.py", "specviz.one": pkg / "one.py", "specviz.two": pkg / "two.py"}
    graph, private = imports(mods)
    assert cycles(graph) == [["specviz.one", "specviz.two"]]
    assert private == [("specviz.one", "specviz.two", "_helper")]


def test_no_import_cycle_touches_the_checked_layers():
    graph, _ = imports(modules())
    bad = [c for c in cycles(graph) if any(checked(m) for m in c)]
    assert not bad, f"import cycles: {bad}"


def test_no_private_name_crosses_a_module_boundary_in_the_checked_layers():
    _, private = imports(modules())
    bad = [p for p in private if checked(p[0]) or checked(p[1])]
    assert not bad, f"private names imported from another module: {bad}"


if __name__ == "__main__":
    g, priv = imports(modules())
    for c in cycles(g):
        print("cycle:", " <-> ".join(c))
    for importer, source, name in priv:
        print(f"private import: {importer} imports {name} from {source}")
    sys.exit(0)
