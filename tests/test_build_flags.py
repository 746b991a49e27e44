"""tools/llama_cmake_args.py: llama.cpp is built for the CPU's features, never with AMX or -march=native."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

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


def test_backends_add_their_flags_to_the_cpu_flags():
    cpu = tool.cmake_args(AVX512_HOST, "x86_64")
    assert tool.backend_args("cpu") == []
    vk = tool.backend_args("vulkan")
    assert vk[0] == "-DGGML_VULKAN=ON" and vk[1] == f"-DCMAKE_CXX_FLAGS=-I{tool.VULKAN_COMPAT}"
    assert (tool.VULKAN_COMPAT / "vulkan" / "vulkan.hpp").is_file()
    assert tool.backend_args("cuda") == ["-DGGML_CUDA=ON"]
    assert "-DGGML_METAL=ON" in tool.backend_args("metal")
    with pytest.raises(ValueError, match="unknown llama.cpp backend 'rocm'"):
        tool.backend_args("rocm")
    # the CPU wheel's cache key is what it was before backends existed
    assert tool.tag(cpu) == tool.tag(cpu, "cpu") and tool.tag(cpu).startswith("cpu-")


def test_every_backend_and_extra_argument_gets_its_own_cache_key():
    cpu = tool.cmake_args(AVX512_HOST, "x86_64")
    tags = {tool.tag(cpu + tool.backend_args(b), b) for b in tool.BACKENDS}
    assert len(tags) == len(tool.BACKENDS)
    cuda = cpu + tool.backend_args("cuda")
    assert tool.tag(cuda, "cuda") != tool.tag(cuda + ["-DCMAKE_CUDA_ARCHITECTURES=90"], "cuda")
    # the compatibility folder enters the key by its contents, not by where the checkout lives
    vk = cpu + tool.backend_args("vulkan")
    moved = [a.replace(str(tool.VULKAN_COMPAT), "/elsewhere/tools/vulkan_compat") for a in vk]
    assert tool.tag(vk, "vulkan") != tool.tag(moved, "vulkan")  # a path that is not the folder is hashed as is
    assert "vulkan_compat@" not in " ".join(vk)


def test_the_command_line_parses_backend_tag_and_extra_arguments():
    assert tool.parse(["--backend", "vulkan", "--tag"]) == ("vulkan", True, [], False)
    assert tool.parse(["--backend=cuda", "--portable", "--", "-DCMAKE_CUDA_ARCHITECTURES=90"]) == (
        "cuda",
        False,
        ["-DCMAKE_CUDA_ARCHITECTURES=90"],
        True,
    )
    assert tool.parse(["--"]) == ("cpu", False, [], False)
    with pytest.raises(ValueError, match="unknown llama.cpp backend"):
        tool.parse(["--backend", "opencl"])
    with pytest.raises(ValueError, match="unknown argument"):
        tool.parse(["--fast"])
    assert tool.main(["--backend", "nope"]) == 2


def test_portable_builds_take_x86_64_v3_whatever_this_machine_has(capsys):
    # a build carried to another machine (the GPU check's, made here) must not use this CPU's AVX-512
    assert tool.main(["--portable", "--backend", "cuda", "--", "-DCMAKE_CUDA_ARCHITECTURES=90"]) == 0
    opts = _options(capsys.readouterr().out.split())
    for on in ("GGML_SSE42", "GGML_AVX", "GGML_F16C", "GGML_FMA", "GGML_BMI2", "GGML_AVX2", "GGML_CUDA"):
        assert opts[on] == "ON", on
    for off in ("GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX_VNNI", "GGML_AMX_TILE", "GGML_NATIVE"):
        assert opts[off] == "OFF", off
    assert opts["CMAKE_CUDA_ARCHITECTURES"] == "90"
    assert tool.cmake_args(set(tool.PORTABLE_FLAGS), "x86_64") == tool.cmake_args(
        {"sse4_2", "avx", "f16c", "fma", "bmi2", "avx2"}, "x86_64"
    )
    # a cache key of its own: never mistaken for a build for an AVX-512 machine
    portable = tool.cmake_args(set(tool.PORTABLE_FLAGS), "x86_64")
    assert tool.tag(portable) != tool.tag(tool.cmake_args(AVX512_HOST, "x86_64"))
