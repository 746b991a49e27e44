"""The inspector's front-end as ONE ES module, assembled from its source modules (no Node, no build step).

The front-end is written as small ES modules under ``widgets/inspector/`` (shipped as
``specviz.static/inspector/``) so that each part can be read and unit-tested on its own
(``node --test widgets/tests/``). Both hosts need a single module (anywidget's ``_esm``, Panel's
``JSComponent._esm``), so :func:`assemble` concatenates the sources in dependency order, leaves out
the relative ``import`` lines and the ``export`` keywords of every module but the entry, and keeps the
entry's own exports (``render`` and ``default``) at the end. Nothing is renamed: every top-level name
must be unique across the source modules, which :func:`assemble` checks.

The sources stick to the subset this needs, and anything else is refused with :class:`BundleError`:
named relative imports (``import { a, b } from "./x.js";``, no ``as``), and exports written as
``export function`` / ``export const`` / ``export let`` / ``export class`` or ``export { a, b };``
(the entry may also ``export default``).

``python -m specviz.ui.bundle`` prints the assembled module.
"""

from __future__ import annotations

import importlib.resources
import posixpath
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources.abc import Traversable

#: The folder of ``specviz.static`` that holds the source modules, and the entry module in it.
SOURCE_DIR = "inspector"
ENTRY = "index.js"

_IDENT = r"[A-Za-z_$][\w$]*"
# `import { a, b } from "./x.js";` at the start of a line (the braces may span lines)
_IMPORT = re.compile(r'^import\s*\{([^}]*)\}\s*from\s*"([^"]+)"\s*;?[ \t]*\n?', re.M)
_ANY_IMPORT = re.compile(r"^import\b", re.M)
# `export function f` / `export const x` … : the keyword is dropped, the declaration kept
_EXPORT_DECL = re.compile(rf"^export\s+((?:async\s+)?function\*?\s+|class\s+|const\s+|let\s+)({_IDENT})", re.M)
# `export { a, b };`
_EXPORT_LIST = re.compile(r"^export\s*\{([^}]*)\}\s*;?[ \t]*\n?", re.M)
_EXPORT_DEFAULT = re.compile(r"^export\s+default\b", re.M)
_ANY_EXPORT = re.compile(r"^export\b", re.M)
# top-level declarations: written at the start of a line (nested code is indented)
_TOP_DECL = re.compile(rf"^(?:export\s+)?(?:(?:async\s+)?function\*?|class|const|let|var)\s+({_IDENT})", re.M)


class BundleError(Exception):
    """The front-end sources cannot be assembled into one module (the message says which file and why)."""


@dataclass(frozen=True)
class Module:
    """One source module: its path under :data:`SOURCE_DIR`, its text, its imports and exports."""

    path: str
    text: str
    imports: tuple[tuple[str, tuple[str, ...]], ...]  # (resolved path, names)
    exports: frozenset[str]
    declared: tuple[str, ...]


def source_root() -> Traversable:
    """The folder holding the source modules (``widgets/inspector`` in the source tree)."""
    return importlib.resources.files("specviz.static") / SOURCE_DIR


def source_files(root: Traversable | None = None) -> list[str]:
    """Every ``.js`` file under the source folder, as sorted paths relative to it."""
    root = root if root is not None else source_root()
    out: list[str] = []

    def walk(node: Traversable, prefix: str) -> None:
        for child in node.iterdir():
            if child.is_dir():
                walk(child, prefix + child.name + "/")
            elif child.name.endswith(".js"):
                out.append(prefix + child.name)

    walk(root, "")
    return sorted(out)


def _names(group: str, path: str, what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in group.split(",") if n.strip())
    for n in names:
        if not re.fullmatch(_IDENT, n):
            raise BundleError(f"{path}: {what} {{{group.strip()}}} must list plain names (no 'as' renames)")
    return names


def _parse(path: str, text: str, entry: bool) -> Module:
    imports = []
    for m in _IMPORT.finditer(text):
        spec = m.group(2)
        if not spec.startswith(("./", "../")):
            raise BundleError(
                f"{path}: import from {spec!r}: only relative imports of the inspector's own modules "
                "are allowed (the assembled module must load with no network)"
            )
        target = posixpath.normpath(posixpath.join(posixpath.dirname(path), spec))
        imports.append((target, _names(m.group(1), path, "import")))
    if len(_ANY_IMPORT.findall(text)) != len(imports):
        raise BundleError(f'{path}: every import must read `import {{ a, b }} from "./file.js";`')
    exports = {m.group(2) for m in _EXPORT_DECL.finditer(text)}
    for m in _EXPORT_LIST.finditer(text):
        exports.update(_names(m.group(1), path, "export"))
    n_forms = len(_EXPORT_DECL.findall(text)) + len(_EXPORT_LIST.findall(text))
    n_default = len(_EXPORT_DEFAULT.findall(text))
    if n_default and not entry:
        raise BundleError(f"{path}: only the entry module {ENTRY} may `export default`")
    if len(_ANY_EXPORT.findall(text)) != n_forms + n_default:
        raise BundleError(
            f"{path}: every export must be `export function|const|let|class name` or `export {{ a, b }};`"
        )
    declared = tuple(m.group(1) for m in _TOP_DECL.finditer(text))
    undeclared = sorted(n for n in exports if n not in declared)
    if undeclared:
        raise BundleError(f"{path}: exports {', '.join(undeclared)} without a top-level declaration")
    return Module(path, text, tuple(imports), frozenset(exports), declared)


def _body(mod: Module, entry: bool) -> str:
    """The module's text for the bundle: imports removed; export keywords removed unless it is the entry."""
    text = _IMPORT.sub("", mod.text)
    if not entry:
        text = _EXPORT_DECL.sub(lambda m: m.group(1) + m.group(2), text)
        text = _EXPORT_LIST.sub("", text)
    return text.strip("\n") + "\n"


def load_modules(root: Traversable | None = None) -> list[Module]:
    """The entry and every module it imports, directly or not, dependencies first.

    Raises :class:`BundleError` for a missing file, a name a module imports that the other does not
    export, an import cycle, or a top-level name declared by two modules.
    """
    root = root if root is not None else source_root()
    modules: dict[str, Module] = {}
    order: list[Module] = []
    visiting: list[str] = []

    def visit(path: str, importer: str | None) -> None:
        if path in modules:
            return
        if path in visiting:
            cycle = " → ".join(visiting[visiting.index(path) :] + [path])
            raise BundleError(f"import cycle: {cycle}")
        node = root.joinpath(*path.split("/"))
        if not node.is_file():
            raise BundleError(f"{importer}: imports {path}, which does not exist" if importer else f"no entry {path}")
        mod = _parse(path, node.read_text(encoding="utf-8"), entry=importer is None)
        visiting.append(path)
        for dep, _imported in mod.imports:
            visit(dep, path)
        visiting.pop()
        for dep, names in mod.imports:
            missing = [n for n in names if n not in modules[dep].exports]
            if missing:
                raise BundleError(f"{path}: imports {', '.join(missing)} from {dep}, which does not export it")
        modules[path] = mod
        order.append(mod)

    visit(ENTRY, None)
    owner: dict[str, str] = {}
    for mod in order:
        for name in mod.declared:
            if name in owner and owner[name] != mod.path:
                raise BundleError(
                    f"top-level name {name!r} is declared in both {owner[name]} and {mod.path}; "
                    "the assembled module shares one scope, so rename one of them"
                )
            owner[name] = mod.path
    return order


def assemble(root: Traversable | None = None) -> str:
    """The one ES module both hosts load: every source module in dependency order, the entry last."""
    order = load_modules(root)
    parts = [
        "// specviz inspector: ONE ES module assembled by specviz/ui/bundle.py from widgets/inspector/*.js.\n"
        "// Edit those files, not this text. Modules, in order: " + ", ".join(m.path for m in order) + "\n"
    ]
    for mod in order:
        parts.append(f"\n// ---- {SOURCE_DIR}/{mod.path} " + "-" * max(0, 90 - len(mod.path)) + "\n\n")
        parts.append(_body(mod, entry=mod.path == ENTRY))
    return "".join(parts)


@lru_cache(maxsize=1)
def inspector_module() -> str:
    """:func:`assemble` of the installed sources, assembled once per process."""
    return assemble()


if __name__ == "__main__":  # pragma: no cover - a convenience for looking at the result
    print(inspector_module(), end="")
