"""The package's code shape: no function in ``specviz/`` longer than :data:`MAX_LINES` lines, its docstring aside.

A long function is several steps that want names; the limit keeps each step a function of its own. Run as a
script to print every function over the limit (``python tests/test_code_shape.py``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "specviz"

#: The most lines a function may span, from its ``def`` (decorators included) to its last line, less its docstring.
MAX_LINES = 100


def function_lengths(path: Path) -> list[tuple[str, int, int]]:
    """Every function (and method) of the module at ``path`` as (qualified name, first line, length in lines
    without its docstring)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                length = (child.end_lineno or child.lineno) - first + 1
                doc = child.body[0] if child.body else None
                if (
                    isinstance(doc, ast.Expr)
                    and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)
                ):
                    length -= (doc.end_lineno or doc.lineno) - doc.lineno + 1
                out.append((name, child.lineno, length))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def too_long() -> list[str]:
    """Every function over :data:`MAX_LINES` lines, as ``path:line name (N lines)``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for name, line, length in function_lengths(path):
            if length > MAX_LINES:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line} {name} ({length} lines)")
    return found


def test_no_function_is_over_the_limit() -> None:
    found = too_long()
    assert not found, f"functions over {MAX_LINES} lines (docstring aside):\n" + "\n".join(found)


def test_the_measure_counts_lines_without_the_docstring(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(3))
    src = f'@staticmethod\ndef f():\n    """One.\n\n    Two.\n    """\n{body}\n\n\n'
    src += "class C:\n    def g(self):\n        return 1\n"
    (tmp_path / "m.py").write_text(src)
    # f: its decorator, its def and three lines of body; g: its def and one line
    assert function_lengths(tmp_path / "m.py") == [("f", 2, 5), ("C.g", 13, 2)]


if __name__ == "__main__":
    lines = too_long()
    print("\n".join(lines) or f"no function over {MAX_LINES} lines")
    sys.exit(1 if lines else 0)
