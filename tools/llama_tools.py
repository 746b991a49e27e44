"""Where llama.cpp's native tools are cached, built by ``tools/build_llama_tools.sh``.

The tools (``llama-speculative-simple``, ``llama-speculative`` (the draft-tree example), ``llama-server``
and specviz's replay driver ``specviz-draft-replay``) are built once per machine from the llama.cpp source
that the installed llama-cpp-python version vendors, with the wheel's CPU flags, into
``~/.cache/specviz/llama-tools/llama-cpp-python-VERSION-TAG-src-SRC`` beside the wheel: ``TAG`` is the CPU
tag of ``tools/llama_cmake_args.py`` and ``SRC`` a hash of what decides the build — the replay driver's
source (``tools/native``), the build script and the list of tools — so a changed driver, build or tool
list is rebuilt once. ``SPECVIZ_LLAMA_TOOLS`` overrides the directory.

``python tools/llama_tools.py VERSION`` prints the directory and ``python tools/llama_tools.py --tools`` the
tools built (the Makefile's rule uses both: the list is here alone); the tests and
``benchmarks/bench_native.py`` call :func:`tool_path`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NATIVE_SRC = HERE / "native"
BUILD_SCRIPT = HERE / "build_llama_tools.sh"
TOOLS = ("llama-speculative-simple", "specviz-draft-replay", "llama-server", "llama-speculative")


def _cmake_args_module():
    spec = importlib.util.spec_from_file_location("llama_cmake_args", HERE / "llama_cmake_args.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def source_hash() -> str:
    """A short hash of what the build depends on: the replay driver's source files, the build script and
    the tools built (a cache from before a tool joined the list gets a new key, so it is rebuilt once)."""
    h = hashlib.sha256()
    for p in sorted(NATIVE_SRC.iterdir()):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    h.update(b"\0build\0" + BUILD_SCRIPT.read_bytes())
    h.update(b"\0tools\0" + " ".join(TOOLS).encode())
    return h.hexdigest()[:8]


def installed_version() -> str:
    """The installed llama-cpp-python version."""
    from importlib.metadata import version

    return version("llama_cpp_python")


def tools_dir(version: str | None = None) -> Path:
    """The cache directory of the tools for ``version`` (default: the installed llama-cpp-python)."""
    override = os.environ.get("SPECVIZ_LLAMA_TOOLS")
    if override:
        return Path(override)
    mod = _cmake_args_module()
    tag = mod.tag(mod.cmake_args(mod.cpu_flags(), platform.machine()))  # the wheel's CPU tag
    version = version or installed_version()
    return Path.home() / ".cache" / "specviz" / "llama-tools" / f"llama-cpp-python-{version}-{tag}-src-{source_hash()}"


def tool_path(name: str, version: str | None = None) -> Path | None:
    """The path of tool ``name`` when it has been built, else ``None``."""
    p = tools_dir(version) / name
    return p if p.is_file() and os.access(p, os.X_OK) else None


def main(argv: list[str]) -> int:
    """Print the cache directory for the version given as the only argument, or with ``--tools`` the tools
    built there."""
    if len(argv) != 1:
        print("usage: llama_tools.py VERSION | --tools", file=sys.stderr)
        return 2
    print(" ".join(TOOLS) if argv[0] == "--tools" else tools_dir(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
