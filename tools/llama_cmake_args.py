"""Print the CMake arguments for building llama.cpp (llama-cpp-python) for this machine and a backend.

``-march=native`` is not used: some virtual machines advertise AMX tiles that the guest cannot run, and
a native build then dies with "Illegal instruction" on quantised models. Instead every x86 feature that
ggml can use and that ``/proc/cpuinfo`` lists is switched on explicitly — except AMX. AVX-512 matters
here: speculative verification is batch work, and batches are compute-bound on a CPU.

``--backend NAME`` (``cpu``, the default, ``vulkan``, ``cuda`` or ``metal``) adds the flags of one
llama.cpp GPU backend to the CPU flags (the CPU backend is always built too: ggml falls back to it for
whatever a GPU backend does not run):

- ``vulkan``: ``-DGGML_VULKAN=ON``, plus ``tools/vulkan_compat`` first on the C++ include path, which
  lets the vendored llama.cpp compile against Vulkan headers older than 1.3.261 (Debian 12's; see the
  header's comment). Needs ``glslc`` and the Vulkan headers and loader (Debian: ``glslc libvulkan-dev``).
- ``cuda``: ``-DGGML_CUDA=ON``. Needs ``nvcc``. ggml builds for several GPU generations unless
  ``CMAKE_CUDA_ARCHITECTURES`` is given: pass e.g. ``LLAMA_CMAKE_EXTRA=-DCMAKE_CUDA_ARCHITECTURES=90``
  (an H100/H200) to ``make install`` to build for one chip only (much faster).
- ``metal``: ``-DGGML_METAL=ON -DGGML_METAL_EMBED_LIBRARY=ON`` (Apple silicon; the shader library is
  compiled into the dylib so the wheel needs no ``.metal`` file beside it).

Extra arguments after the options (``-- -DNAME=VALUE ...``) are appended as they are.

``--portable`` takes the CPU features of x86-64-v3 (AVX2, FMA, F16C, BMI2: every x86 server of the last
ten years) instead of this machine's, for a build that is carried to and run on another machine (the GPU
check's build made here, ``tools/gpu_check/prebuild.sh``); everything else is as without it.

``--tag`` prints a short name for the argument set instead (the Makefile keys its wheel cache by it,
so a wheel is never reused on a CPU or with a backend it was not built for). The tag names the
backend and hashes the arguments; a path inside this repository (the Vulkan compatibility folder)
enters the hash by its files' contents, not its location, so every checkout shares one cache.
"""

from __future__ import annotations

import hashlib
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VULKAN_COMPAT = HERE / "vulkan_compat"
BACKENDS = ("cpu", "vulkan", "cuda", "metal")

# ggml option -> the /proc/cpuinfo flags it needs (all of them)
FEATURES = [
    ("GGML_SSE42", ("sse4_2",)),
    ("GGML_AVX", ("avx",)),
    ("GGML_F16C", ("f16c",)),
    ("GGML_FMA", ("fma",)),
    ("GGML_BMI2", ("bmi2",)),
    ("GGML_AVX2", ("avx2",)),
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    ("GGML_AVX512_VBMI", ("avx512f", "avx512vbmi")),
    ("GGML_AVX512_VNNI", ("avx512f", "avx512_vnni")),
    ("GGML_AVX512_BF16", ("avx512f", "avx512_bf16")),
]


#: the /proc/cpuinfo flags of x86-64-v3 that ggml has an option for (``--portable``)
PORTABLE_FLAGS = frozenset(("sse4_2", "avx", "f16c", "fma", "bmi2", "avx2"))


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU flags of the first processor listed, or an empty set when unknown."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cmake_args(flags: set[str], machine: str) -> list[str]:
    """CMake arguments: no native tuning; each x86 feature on when the CPU has it, off otherwise."""
    args = ["-DGGML_NATIVE=OFF"]
    if machine.lower() not in ("x86_64", "amd64") or not flags:
        return args  # ggml's portable defaults
    for option, needs in FEATURES:
        args.append(f"-D{option}={'ON' if all(n in flags for n in needs) else 'OFF'}")
    args += ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    return args


def backend_args(backend: str) -> list[str]:
    """The arguments that switch on ``backend`` on top of the CPU flags (none for ``cpu``)."""
    if backend == "cpu":
        return []
    if backend == "vulkan":
        return ["-DGGML_VULKAN=ON", f"-DCMAKE_CXX_FLAGS=-I{VULKAN_COMPAT}"]
    if backend == "cuda":
        return ["-DGGML_CUDA=ON"]
    if backend == "metal":
        return ["-DGGML_METAL=ON", "-DGGML_METAL_EMBED_LIBRARY=ON"]
    raise ValueError(f"unknown llama.cpp backend {backend!r}: choose one of {', '.join(BACKENDS)}")


def _folder_hash(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:10]


def tag(args: list[str], backend: str = "cpu") -> str:
    """The short name of an argument set, keying the caches of what is built with it."""
    compat = str(VULKAN_COMPAT)
    keyed = [a.replace(compat, f"vulkan_compat@{_folder_hash(VULKAN_COMPAT)}") if compat in a else a for a in args]
    return f"{backend}-" + hashlib.sha256(" ".join(keyed).encode()).hexdigest()[:10]


def parse(argv: list[str]) -> tuple[str, bool, list[str], bool]:
    """``(backend, want_tag, extra_args, portable)`` from the command line."""
    backend, want_tag, extra, portable = "cpu", False, [], False
    rest = list(argv)
    if "--" in rest:
        i = rest.index("--")
        rest, extra = rest[:i], [a for a in rest[i + 1 :] if a]
    it = iter(rest)
    for a in it:
        if a == "--tag":
            want_tag = True
        elif a == "--portable":
            portable = True
        elif a == "--backend":
            backend = next(it, "")
        elif a.startswith("--backend="):
            backend = a.split("=", 1)[1]
        else:
            raise ValueError(
                f"unknown argument {a!r} (usage: llama_cmake_args.py [--backend NAME] [--portable] [--tag] [-- ARGS])"
            )
    if backend not in BACKENDS:
        raise ValueError(f"unknown llama.cpp backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    return backend, want_tag, extra, portable


def main(argv: list[str]) -> int:
    """Print the arguments (or their tag with ``--tag``)."""
    try:
        backend, want_tag, extra, portable = parse(argv)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    flags = set(PORTABLE_FLAGS) if portable else cpu_flags()
    machine = "x86_64" if portable else platform.machine()
    args = cmake_args(flags, machine) + backend_args(backend) + extra
    print(tag(args, backend) if want_tag else " ".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
