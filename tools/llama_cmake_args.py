"""Print the CMake arguments for building llama.cpp (llama-cpp-python) for this machine's CPU.

``-march=native`` is not used: some virtual machines advertise AMX tiles that the guest cannot run, and
a native build then dies with "Illegal instruction" on quantised models. Instead every x86 feature that
ggml can use and that ``/proc/cpuinfo`` lists is switched on explicitly — except AMX. AVX-512 matters
here: speculative verification is batch work, and batches are compute-bound on a CPU.

``--tag`` prints a short name for the argument set instead (the Makefile keys its wheel cache by it,
so a wheel is never reused on a CPU it was not built for).
"""

from __future__ import annotations

import hashlib
import platform
import sys

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


def tag(args: list[str]) -> str:
    """The short name of an argument set, keying the caches of what is built with it."""
    return "cpu-" + hashlib.sha256(" ".join(args).encode()).hexdigest()[:10]


def main(argv: list[str]) -> int:
    """Print the arguments (or their tag with ``--tag``)."""
    args = cmake_args(cpu_flags(), platform.machine())
    print(tag(args) if "--tag" in argv else " ".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
