#!/usr/bin/env bash
# Build the GPU check's llama.cpp HERE, ahead of the GPU machine, and carry the result (run it after
# tools/gpu_check/prepare.sh). The build needs no GPU: nvcc compiles for the chip named (sm_90: an
# H100/H200) without one. The GPU machine then unpacks it in seconds instead of spending 4-8 of its
# minutes building (run.sh still builds from the carried source when no build is carried, or when the
# carried one was made from another source or for another chip).
#
# Writes build/gpu_check/prebuilt-BACKEND.tar.xz (llama.cpp's shared libraries and llama-speculative-simple)
# and prebuilt-BACKEND.info (what it was built from and with), and rewrites MANIFEST. The build is cached
# in ~/.cache/specviz/gpu_check, keyed by the source's SHA-256 and the CMake arguments, so running
# prepare.sh and this again costs seconds.
#
# What the build is made with, and why:
#   - the CPU features of x86-64-v3 (tools/llama_cmake_args.py --portable), not this machine's: the
#     result runs on another machine's CPU;
#   - for CUDA, cuBLAS's headers and libraries from NVIDIA's wheel on PyPI (nvidia-cublas, the release
#     of the toolkit nvcc belongs to) when the toolkit here has none;
#   - for CUDA, where the toolkit has no libcuda.so stub (the driver's library, absent on a machine
#     without a GPU), a stub named libcuda.so.1 made here that defines the driver functions ggml-cuda
#     calls, to link against. Nothing of it is carried: on the GPU machine the driver's own libcuda.so.1
#     is loaded, and executables are linked with --allow-shlib-undefined because the driver functions
#     are resolved there, at load time.
#
# usage: tools/gpu_check/prebuild.sh [PYTHON]     (default .venv/bin/python)
# settings (environment): GPU_CHECK_BACKEND cuda (default) or cpu (to rehearse run.sh's use of a carried
#   build), GPU_CHECK_ARCH (default 90), GPU_CHECK_JOBS (default: the number of cores),
#   CUDA_HOME (default: the folder above nvcc's bin/)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${1:-$repo/.venv/bin/python}
backend=${GPU_CHECK_BACKEND:-cuda}
arch=${GPU_CHECK_ARCH:-90}
jobs=${GPU_CHECK_JOBS:-$(nproc)}
carried=$repo/build/gpu_check
cache=${SPECVIZ_CACHE:-$HOME/.cache/specviz}/gpu_check
limit=$((60 * 1024 * 1024))  # the same bound as prepare.sh: room under 64 MiB for the tracked files

step() { echo "== prebuild: $*" >&2; }
die() { echo "prebuild FAILED: $*" >&2; exit 1; }

case "$backend" in cuda|cpu) ;; *) die "GPU_CHECK_BACKEND=$backend: choose cuda or cpu" ;; esac
[ -x "$py" ] || die "no Python at $py (run \`make install\` first or pass one)"
[ -f "$carried/llama.cpp-src.tar.gz" ] || die "$carried/llama.cpp-src.tar.gz is missing: run tools/gpu_check/prepare.sh first"
command -v cmake >/dev/null || die "cmake is not on PATH"
src_sha=$(sha256sum "$carried/llama.cpp-src.tar.gz" | cut -d' ' -f1)
version=$(cat "$carried/VERSION")
mkdir -p "$cache"

extra=()    # arguments that change how it links here, not what it computes
cuda_note=""
if [ "$backend" = cuda ]; then
  command -v nvcc >/dev/null || die "nvcc is not on PATH (the CUDA toolkit's bin/)"
  # the toolkit's folder: CUDA_HOME, else the one nvcc lives in (a wrapper script on PATH, as
  # /usr/local/bin/nvcc here, does not live in it: then /usr/local/cuda)
  cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
  [ -f "$cuda_home/include/cuda_runtime.h" ] || cuda_home=/usr/local/cuda
  [ -x "$cuda_home/bin/nvcc" ] && [ -f "$cuda_home/include/cuda_runtime.h" ] \
    || die "cannot find the CUDA toolkit's folder (bin/nvcc, include/cuda_runtime.h): set CUDA_HOME"
  release=$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1.\2/p')
  [ -n "$release" ] || die "cannot read the CUDA release from nvcc --version"
  major=${release%%.*}
  cuda_note="nvcc $release ($cuda_home)"
  extra+=("-DCMAKE_CUDA_COMPILER=$cuda_home/bin/nvcc")
  if [ ! -f "$cuda_home/include/cublas_v2.h" ]; then
    # cuBLAS of the same release from NVIDIA's wheel (CUDA 12's is named nvidia-cublas-cu12)
    pkg=nvidia-cublas; [ "$major" -lt 13 ] && pkg=nvidia-cublas-cu$major
    cublas=$cache/cublas-$release
    if [ ! -f "$cublas/.done" ]; then
      step "cuBLAS for CUDA $release from PyPI ($pkg==$release.*)"
      rm -rf "$cublas" && mkdir -p "$cublas/wheel"
      "$py" -m pip download --quiet --no-deps --only-binary=:all: -d "$cublas/wheel" "$pkg==$release.*" \
        || die "pip could not download $pkg==$release.*"
      "$py" - "$cublas" <<'PY' || die "unpacking cuBLAS failed"
import pathlib, shutil, sys, zipfile
root = pathlib.Path(sys.argv[1])
for sub in ("include", "lib"):
    (root / sub).mkdir(exist_ok=True)
for whl in (root / "wheel").glob("*.whl"):
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            base = name.rsplit("/", 1)[-1]
            if "/include/" in name and base.endswith(".h"):
                sub = "include"
            elif "/lib/" in name and base.startswith(("libcublas.so", "libcublasLt.so")):
                sub = "lib"
            else:
                continue
            with z.open(name) as src, open(root / sub / base, "wb") as dst:
                shutil.copyfileobj(src, dst)
PY
      rm -rf "$cublas/wheel"
      for so in "$cublas"/lib/libcublas*.so.*; do ln -sf "$(basename "$so")" "${so%%.so.*}.so"; done
      touch "$cublas/.done"
    fi
    [ -f "$cublas/include/cublas_v2.h" ] && [ -e "$cublas/lib/libcublas.so" ] && [ -e "$cublas/lib/libcublasLt.so" ] \
      || die "the cuBLAS wheel did not hold cublas_v2.h, libcublas and libcublasLt"
    cuda_note="$cuda_note, cuBLAS from $pkg==$release.*"
    extra+=("-DCUDA_cublas_LIBRARY=$cublas/lib/libcublas.so" "-DCUDA_cublasLt_LIBRARY=$cublas/lib/libcublasLt.so"
            "-DCMAKE_CUDA_FLAGS=-I$cublas/include" "-DCMAKE_CXX_FLAGS=-I$cublas/include")
  fi
  stub=""
  if [ ! -e "$cuda_home/lib64/stubs/libcuda.so" ] && [ ! -e "$cuda_home/targets/x86_64-linux/lib/stubs/libcuda.so" ]; then
    stub=$cache/libcuda-stub
    mkdir -p "$stub"
    extra+=("-DCUDA_cuda_driver_LIBRARY=$stub/libcuda.so" "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined")
    cuda_note="$cuda_note, linked against a stub libcuda.so.1 made here (the driver's is loaded on the GPU machine)"
  fi
  cmake_args=$("$py" "$repo/tools/llama_cmake_args.py" --portable --backend cuda -- "-DCMAKE_CUDA_ARCHITECTURES=$arch")
else
  cmake_args=$("$py" "$repo/tools/llama_cmake_args.py" --portable --backend cpu)
fi
key=$(printf '%s\n' "$src_sha" "$backend" "$cmake_args" "${extra[@]}" "$cuda_note" | sha256sum | cut -c1-16)
archive=$cache/prebuilt-$backend-$key.tar.xz
info=$cache/prebuilt-$backend-$key.info
if [ -f "$archive" ] && [ -f "$info" ]; then
  step "reusing the build cached in $archive"
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/specviz-gpu-prebuild.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  tar -xzf "$carried/llama.cpp-src.tar.gz" -C "$work" || die "unpacking the source failed"
  step "building llama.cpp $version for $backend${cuda_note:+ ($cuda_note)} with $jobs jobs (CUDA for one chip on 2 cores: about 20 minutes)"
  t0=$(date +%s)
  # shellcheck disable=SC2086  # cmake_args is a list of -D options
  cmake -S "$work/llama_cpp_python-$version/vendor/llama.cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_CURL=OFF -DGGML_CCACHE=OFF $cmake_args "${extra[@]}" >"$work/configure.log" 2>&1 \
    || { tail -n 40 "$work/configure.log" >&2; die "cmake configure failed"; }
  build() {
    cmake --build "$work/build" --config Release -j "$jobs" --target llama llama-speculative-simple >>"$work/build.log" 2>&1 \
      || { grep -m 20 -B 2 -A 8 -E "error|Error" "$work/build.log" | head -80 >&2; die "the build failed"; }
  }
  stub_of() {  # a libcuda.so.1 that defines the given driver functions (they are never called: never carried)
    : >"$stub/stub.c"
    for f in "$@"; do echo "int $f(void) { return 999; }" >>"$stub/stub.c"; done
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub/libcuda.so" "$stub/stub.c" || die "the libcuda link stub did not build"
  }
  if [ -n "${stub:-}" ]; then
    # First an empty stub: the link then names the driver functions ggml-cuda calls (undefined, as a
    # shared library may leave them). A stub defining none of them would be dropped by --as-needed
    # (Debian's default), and ggml-cuda would not load libcuda.so.1 at all on the GPU machine; so the
    # stub is made again with exactly those functions, and the library linked again against it.
    stub_of
    build
    cuda_lib=$(find "$work/build" -name "libggml-cuda.so.*" -type f | head -1)
    [ -n "$cuda_lib" ] || die "the build produced no libggml-cuda.so"
    # shellcheck disable=SC2046  # one word per function name
    stub_of $(nm -D --undefined-only "$cuda_lib" | awk '$2 ~ /^cu[A-Z]/ {print $2}')
  fi
  build
  if [ -n "${stub:-}" ]; then
    readelf -d "$cuda_lib" | grep -q 'NEEDED.*\[libcuda\.so\.1\]' || die "libggml-cuda.so does not name libcuda.so.1"
  fi
  seconds=$(( $(date +%s) - t0 ))
  mkdir -p "$work/pack"
  # the libraries and the tool (which also loads libllama-common)
  find "$work/build" -name "lib*.so*" -exec cp -a {} "$work/pack/" \;
  find "$work/build" -type f -name llama-speculative-simple -perm -u+x -exec cp -a {} "$work/pack/" \;
  [ -x "$work/pack/llama-speculative-simple" ] && [ -e "$work/pack/libllama.so" ] || die "the build produced no libllama.so or llama-speculative-simple"
  [ "$backend" = cpu ] || [ -e "$work/pack/libggml-cuda.so" ] || die "the build produced no libggml-cuda.so"
  # every file the build wrote records where it was built (RUNPATH): harmless, run.sh sets LD_LIBRARY_PATH
  tar -cJf "$archive.tmp" -C "$work/pack" . || die "packing the build failed"
  {
    echo "source_sha256 $src_sha"
    echo "llama_cpp_python $version"
    echo "backend $backend"
    [ "$backend" = cuda ] && echo "arch $arch"
    echo "cmake_args $cmake_args"
    echo "built_with ${cuda_note:-$(c++ --version | head -1)}; $(cmake --version | head -1); $seconds s with $jobs jobs on $(nproc) cores"
    echo "files $(cd "$work/pack" && ls | tr '\n' ' ')"
  } >"$info.tmp"
  mv "$archive.tmp" "$archive" && mv "$info.tmp" "$info"
fi

cp "$archive" "$carried/prebuilt-$backend.tar.xz"
cp "$info" "$carried/prebuilt-$backend.info"
(cd "$carried" && find . -type f ! -name MANIFEST -print0 | sort -z | xargs -0 sha256sum >MANIFEST)
size=$(du -sb "$carried" | cut -f1)
if [ "$size" -ge "$limit" ]; then
  rm -f "$carried/prebuilt-$backend.tar.xz" "$carried/prebuilt-$backend.info"
  (cd "$carried" && find . -type f ! -name MANIFEST -print0 | sort -z | xargs -0 sha256sum >MANIFEST)
  die "build/gpu_check would be $size bytes, over the $limit allowed: the build was left out (run.sh builds from source)"
fi
step "done: $carried/prebuilt-$backend.tar.xz ($(( $(stat -c %s "$archive") / 1024 )) KiB; build/gpu_check $((size / 1024)) KiB)"
cat "$carried/prebuilt-$backend.info" >&2
