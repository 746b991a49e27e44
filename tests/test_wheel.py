"""The wheel: ``pip wheel`` of the project holds every C helper's source, and specviz installed from it into a
fresh venv, beside the cached llama-cpp-python wheel (``make install``'s WHEELHOUSE), finds every native
helper available: the row-scan kernel, the n-gram kernel and the layer-capture shim, each compiled there from
the installed copy's source."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
#: What pyproject.toml builds the wheel from: the package and the front-end's folder (``specviz.static``).
PACKAGE_DIRS = ("specviz", "widgets")
NATIVE_SUFFIXES = (".c", ".h")

#: Run in the venv: where specviz and llama_cpp were imported from, and why each native helper is not
#: available (None when it is).
CHECK = """
import json, sys
import llama_cpp, specviz
from specviz.backends import capture
from specviz.decoding import rowscan_kernel
from specviz.strategies import ngram_kernel
try:
    capture.shim_library()
    shim = None
except capture.CaptureUnavailableError as e:
    shim = str(e)
print(json.dumps({
    "prefix": sys.prefix, "specviz": specviz.__file__, "llama_cpp": llama_cpp.__file__,
    "rowscan_kernel": rowscan_kernel.unavailable_reason(), "ngram_kernel": ngram_kernel.unavailable_reason(),
    "capture_shim": shim,
}))
"""


def _native_sources() -> list[str]:
    """Every C source and header under specviz/, as paths inside the wheel."""
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "specviz").rglob("*") if p.suffix in NATIVE_SUFFIXES)


def _llama_wheel() -> Path:
    """The cached llama-cpp-python wheel ``make install`` built for this machine (``$WHEELHOUSE``, else the
    Makefile's folder for ``$LLAMA_BACKEND``, cpu by default); the test is skipped without one."""
    version = importlib.metadata.version("llama-cpp-python")
    house = os.environ.get("WHEELHOUSE")
    if not house:
        tag = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "llama_cmake_args.py"), "--backend",
             os.environ.get("LLAMA_BACKEND", "cpu"), "--tag"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()  # fmt: skip
        house = str(Path.home() / ".cache" / "specviz" / "wheels" / f"llama-cpp-python-{version}-{tag}")
    found = sorted(Path(house).glob(f"llama_cpp_python-{version}-*.whl"))
    if not found:
        pytest.skip(f"no cached llama-cpp-python {version} wheel in {house} (make install builds it)")
    return found[-1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """specviz's wheel, built without dependencies or build isolation from a copy of the project (a build
    in place leaves build/ behind, whose stale files would go into the next wheel)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for item in ROOT.iterdir():
        if item.is_file():
            shutil.copy2(item, src / item.name)
    for name in PACKAGE_DIRS:
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    out = tmp / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("specviz-*.whl")
    return built


def test_the_wheel_holds_every_c_source_and_header(wheel):
    sources = _native_sources()
    assert "specviz/strategies/ngram_kernel.c" in sources  # the tree's helpers are found (a wrong ROOT finds none)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert [s for s in sources if s not in names] == []


def test_specviz_installed_from_the_wheel_finds_every_native_helper(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet", str(wheel),
         str(_llama_wheel())],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # The runtime dependencies (numpy, and llama-cpp-python's own) come from this interpreter's site-packages,
    # listed after the venv's own: specviz and llama_cpp are the venv's (checked below); an editable install
    # there is not seen (the .pth files of a folder named in a .pth are not read).
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip())  # fmt: skip
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "zz_test_wheel_dependencies.pth").write_text("".join(f"{d}\n" for d in deps))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECVIZ_") and k != "PYTHONPATH"}
    env["SPECVIZ_NATIVE_CACHE"] = str(tmp_path / "native")  # compiled here, from the installed sources
    done = subprocess.run(
        [str(python), "-I", "-c", CHECK], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for module in ("specviz", "llama_cpp"):
        assert Path(got[module]).is_relative_to(venv), (module, got[module])
    assert {k: got[k] for k in ("rowscan_kernel", "ngram_kernel", "capture_shim")} == {
        "rowscan_kernel": None,
        "ngram_kernel": None,
        "capture_shim": None,
    }
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "native").glob("*.so")) == [
        "specviz_capture",
        "specviz_ngram",
        "specviz_rowscan",
    ]
