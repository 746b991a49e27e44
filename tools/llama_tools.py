"""Where llama.cpp's native tools are cached, built by ``tools/build_llama_tools.sh``.

The tools (``llama-speculative-simple`` and specviz's replay driver ``specviz-draft-replay``) are built
once per machine from the llama.cpp source that the installed llama-cpp-python version vendors, with the
wheel's CPU flags, into ``~/.cache/specviz/llama-tools/llama-cpp-python-VERSION-TAG-SRC`` beside the wheel:
``TAG`` is the CPU tag of ``tools/llama_cmake_args.py`` and ``SRC`` a hash of the replay driver's source
(``tools/native``), so a changed driver is rebuilt. ``SPECVIZ_LLAMA_TOOLS`` overrides the directory.

``python tools/llama_tools.py VERSION`` prints the directory (the Makefile's rule uses it); the tests and
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
TOOLS = ("llama-speculative-simple", "specviz-draft-replay")


def _cmake_args_module():
    spec = importlib.util.spec_from_file_location("llama_cmake_args", HERE / "llama_cmake_args.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def source_hash() -> str:
    """A short hash of the replay driver's source files."""
    h = hashlib.sha256()
    for p in sorted(NATIVE_SRC.iterdir()):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
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
    """Print the cache directory for the version given as the only argument."""
    if len(argv) != 1:
        print("usage: llama_tools.py VERSION", file=sys.stderr)
        return 2
    print(tools_dir(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
