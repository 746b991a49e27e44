"""The front-end's source modules are assembled in Python into the one ES module both hosts load."""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from specviz.ui.bundle import ENTRY, BundleError, assemble, load_modules, source_files, source_root

ROOT = Path(__file__).resolve().parent.parent


def need_node() -> str:
    """The node binary, or skip with the reason (a failure when CI=true: node is part of CI)."""
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("node must be installed in CI (it checks the assembled front-end module)")
        pytest.skip("node is not installed: the assembled module's syntax is checked with `node --check`")
    return node


def test_every_source_module_is_in_the_assembled_module():
    order = [m.path for m in load_modules()]
    assert sorted(order) == source_files(), "a source module is not imported from the entry, directly or not"
    assert order[-1] == ENTRY
    js = assemble()
    for path in order:
        assert f"// ---- inspector/{path} " in js
    # dependencies first: every module comes after the modules it imports
    pos = {p: i for i, p in enumerate(order)}
    for m in load_modules():
        for dep, _names in m.imports:
            assert pos[dep] < pos[m.path], f"{m.path} is placed before {dep}"


def test_the_assembled_module_has_no_imports_and_only_the_entry_exports():
    js = assemble()
    assert not re.search(r"^import\b", js, re.M)
    assert re.findall(r"^export\b.*$", js, re.M) == ["export { render };", "export default { render };"]


def test_the_hosts_get_the_assembled_module():
    pytest.importorskip("anywidget")
    from specviz.ui.core import static_text
    from specviz.ui.inspector import Inspector

    assert static_text("inspector.js") == assemble()
    assert Inspector._esm == assemble()


def test_the_assembled_module_is_valid_and_exports_render(tmp_path):
    node = need_node()
    path = tmp_path / "inspector.mjs"
    path.write_text(assemble(), encoding="utf-8")
    check = subprocess.run([node, "--check", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    # importing it runs every module's top level (no DOM is touched until render is called)
    code = (
        "const m = await import(process.argv[1]);"
        "if (typeof m.render !== 'function' || m.default.render !== m.render) process.exit(3);"
    )
    run = subprocess.run([node, "--input-type=module", "-e", code, path.as_uri()], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_package_data_ships_every_source_module():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert conf["package-dir"]["specviz.static"] == "widgets"
    for path in source_files():
        folder, name = posixpath.split(f"inspector/{path}")
        package = "specviz.static." + folder.replace("/", ".")
        assert package in conf["packages"], f"{package} (widgets/{folder}) is missing from pyproject.toml's packages"
        globs = conf["package-data"].get(package, [])
        assert any(fnmatch.fnmatch(name, g) for g in globs), f"widgets/{folder}/{name}: not in {package}'s package-data"
    assert source_root().joinpath(ENTRY).is_file()


# -- what the assembler refuses ----------------------------------------------------------------------


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return root


ENTRY_OK = (
    'import { a } from "./a.js";\nfunction render() { return a(); }\nexport { render };\nexport default { render };\n'
)


def test_a_tiny_tree_is_assembled_in_dependency_order(tmp_path):
    root = write(
        tmp_path,
        {
            "index.js": ENTRY_OK,
            "a.js": 'import { B } from "./sub/b.js";\n\nexport function a() {\n  return B;\n}\n',
            "sub/b.js": "export const B = 2;\n",
        },
    )
    js = assemble(root)
    assert js.index("const B = 2;") < js.index("function a()") < js.index("function render()")
    assert "export const" not in js and "export function" not in js
    assert [m.path for m in load_modules(root)] == ["sub/b.js", "a.js", "index.js"]
    assert source_files(root) == ["a.js", "index.js", "sub/b.js"]


@pytest.mark.parametrize(
    "files, message",
    [
        ({"a.js": "export function a() {}\nexport const x = 1;\n", "b.js": ""}, None),  # control: fine
        (
            {"a.js": 'import { h } from "./b.js";\nexport function a() {}\n', "b.js": "export function g() {}\n"},
            "imports h from b.js, which does not export it",
        ),
        ({"a.js": 'import { a2 } from "./missing.js";\nexport function a() {}\n'}, "missing.js, which does not exist"),
        ({"a.js": 'import { thing } from "lodash";\nexport function a() {}\n'}, "only relative imports"),
        (
            {"a.js": 'import { b as c } from "./b.js";\nexport function a() {}\n', "b.js": "export function b() {}\n"},
            "no 'as' renames",
        ),
        (
            {"a.js": 'import * as b from "./b.js";\nexport function a() {}\n', "b.js": "export function b() {}\n"},
            "every import must read",
        ),
        ({"a.js": "export function a() {}\nexport default a;\n"}, "only the entry module"),
        ({"a.js": "export function a() {}\nexport * from './b.js';\n"}, "every export must be"),
        ({"a.js": "export function a() {}\nfunction render() {}\n"}, "'render' is declared in both"),
        (
            {
                "a.js": 'import { b } from "./b.js";\nexport function a() {}\n',
                "b.js": 'import { a } from "./a.js";\nexport function b() {}\n',
            },
            "import cycle",
        ),
    ],
)
def test_what_cannot_be_assembled_is_refused_with_the_reason(tmp_path, files, message):
    root = write(tmp_path, {"index.js": ENTRY_OK, **files})
    if message is None:
        assemble(root)
        return
    with pytest.raises(BundleError, match=re.escape(message)):
        assemble(root)
