"""docs/architecture.md names every module under specviz/, in its folder's section.

The rule (stated in the document): every ``.py`` file under ``specviz/`` except a package's
``__init__.py`` and a ``__main__.py`` is named by its file name (``name.py``, or ``name`` in backquotes)
in a section whose heading names its folder (``specviz/decoding/`` …); a module at the top of the
package may be named anywhere. Also runnable as a script: ``python tests/test_architecture_doc.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specviz"
DOC = ROOT / "docs" / "architecture.md"
NOT_LISTED = {"__init__.py", "__main__.py"}


def modules(package: Path = PACKAGE) -> list[Path]:
    """Every module the document must name, relative to the package."""
    return sorted(p.relative_to(package) for p in package.rglob("*.py") if p.name not in NOT_LISTED)


def sections(text: str) -> list[tuple[str, str]]:
    """The document's ``(heading, body)`` pairs, split at every Markdown heading."""
    parts = re.split(r"^(#{1,6} .*)$", text, flags=re.MULTILINE)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]


def named(name: str, text: str) -> bool:
    """Whether a backquoted span of ``text`` holds the module ``name`` as a word (``name`` or ``name.py``)."""
    return re.search(r"`[^`\n]*(?<![\w.])" + re.escape(name) + r"(?:\.py)?(?![\w])[^`\n]*`", text) is not None


def unnamed(doc: str, package: Path = PACKAGE) -> list[str]:
    """The modules ``doc`` does not name where it should, as paths under ``specviz/``."""
    parts = sections(doc)
    missing = []
    for rel in modules(package):
        name = rel.stem
        if len(rel.parts) == 1:
            where = doc
        else:
            folder = f"specviz/{rel.parts[0]}/"
            where = "\n".join(body for heading, body in parts if folder in heading)
        if not named(name, where):
            missing.append(f"specviz/{rel.as_posix()}")
    return missing


def test_architecture_names_every_module():
    missing = unnamed(DOC.read_text(encoding="utf-8"))
    assert not missing, (
        "docs/architecture.md does not name these modules in their folder's section "
        f"(add a row or a line for each): {missing}"
    )


def test_the_check_finds_a_module_left_out(tmp_path):
    pkg = tmp_path / "specviz"
    (pkg / "decoding").mkdir(parents=True)
    for f in ("__init__.py", "errors.py", "decoding/__init__.py", "decoding/round.py", "decoding/budget.py"):
        (pkg / f).write_text("")
    doc = "# map\n`errors.py`\n### `specviz/decoding/`\n| `round.py` | one round |\n### `specviz/ui/`\n`budget.py`\n"
    assert unnamed(doc, pkg) == ["specviz/decoding/budget.py"]
    assert unnamed(doc + "### `specviz/decoding/` again\n(`budget`)\n", pkg) == []
    # a name inside another word does not count
    assert not named("round", "`run_round` and `round_events.py`")
    assert named("round", "`round.py` (+ `round.c`)")


if __name__ == "__main__":
    left_out = unnamed(DOC.read_text(encoding="utf-8"))
    print("\n".join(left_out) or "every module is named")
    raise SystemExit(1 if left_out else 0)
