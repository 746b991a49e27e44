"""tools/llama_cmake_args.py: llama.cpp is built for the CPU's features, never with AMX or -march=native."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "llama_cmake_args.py"
spec = importlib.util.spec_from_file_location("llama_cmake_args", TOOL)
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

AVX512_HOST = set(
    "sse4_2 avx f16c fma bmi2 avx2 avx_vnni avx512f avx512cd avx512vl avx512dq avx512bw avx512vbmi "
    "avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16".split()
)


def _options(args):
    return dict(a[2:].split("=", 1) for a in args)


def test_every_listed_feature_is_on_and_amx_is_off():
    opts = _options(tool.cmake_args(AVX512_HOST, "x86_64"))
    assert opts["GGML_NATIVE"] == "OFF"
    for name in ("GGML_AVX2", "GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX_VNNI", "GGML_FMA"):
        assert opts[name] == "ON", name
    assert opts["GGML_AMX_TILE"] == opts["GGML_AMX_INT8"] == opts["GGML_AMX_BF16"] == "OFF"


def test_missing_features_are_switched_off():
    avx2_only = {"sse4_2", "avx", "f16c", "fma", "bmi2", "avx2"}
    opts = _options(tool.cmake_args(avx2_only, "x86_64"))
    assert opts["GGML_AVX2"] == "ON"
    assert opts["GGML_AVX512"] == opts["GGML_AVX512_VNNI"] == opts["GGML_AVX_VNNI"] == "OFF"
    # AVX-512 needs all five base extensions
    opts = _options(tool.cmake_args(avx2_only | {"avx512f", "avx512bw"}, "x86_64"))
    assert opts["GGML_AVX512"] == "OFF"


def test_other_machines_get_the_portable_defaults():
    assert tool.cmake_args(AVX512_HOST, "aarch64") == ["-DGGML_NATIVE=OFF"]
    assert tool.cmake_args(set(), "x86_64") == ["-DGGML_NATIVE=OFF"]


def test_cpu_flags_reads_the_first_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert tool.cpu_flags(str(info)) == {"fpu", "avx2", "fma"}
    assert tool.cpu_flags(str(tmp_path / "missing")) == set()
