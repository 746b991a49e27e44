#!/usr/bin/env bash
# Prepare what the GPU check carries to a machine without a package registry (run it HERE, where PyPI is
# reachable): build/gpu_check/ (ignored by git) then holds
#   llama.cpp-src.tar.gz  the llama.cpp that llama-cpp-python VERSION vendors, trimmed to what a CUDA (or
#                         CPU) build of its libraries and llama-speculative-simple needs, plus the
#                         llama_cpp Python package (ctypes binding) of the same sdist
#   wheels/               specviz's pure-Python run-time dependencies for CPython 3.12 on manylinux x86_64
#                         (llama-cpp-python's own, gguf for writing the test model, pytest and hypothesis
#                         for the device tests); numpy is not carried (the machine has it)
#   MANIFEST              sizes and SHA-256 of every file, checked by run.sh
# and the whole folder stays under the 64 MiB a copy of the working tree may carry. Then
# tools/gpu_check/prebuild.sh adds a build of that source made here (the GPU machine's minutes are few).
#
# usage: tools/gpu_check/prepare.sh [PYTHON] [VERSION]     (defaults: .venv/bin/python, 0.3.36)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${1:-$repo/.venv/bin/python}
version=${2:-0.3.36}
out=$repo/build/gpu_check
limit=$((60 * 1024 * 1024))  # leaves room under 64 MiB for the tracked files

step() { echo "== prepare: $*" >&2; }
die() { echo "prepare FAILED: $*" >&2; exit 1; }

[ -x "$py" ] || die "no Python at $py (run \`make install\` first or pass one)"
work=$(mktemp -d "${TMPDIR:-/tmp}/specviz-gpu-prepare.XXXXXX")
trap 'rm -rf "$work"' EXIT
rm -rf "$out.tmp"
mkdir -p "$out.tmp/wheels"

step "llama-cpp-python $version sdist"
"$py" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work/sdist" \
  || die "pip could not download the llama-cpp-python $version sdist"
tar -xzf "$work/sdist/llama_cpp_python-$version.tar.gz" -C "$work" || die "could not unpack the sdist"
src=$work/llama_cpp_python-$version

step "trimming the vendored llama.cpp"
# Kept: what `cmake -DGGML_CUDA=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_TESTS=OFF`
# reads (top-level CMake files, cmake/, include/, src/, common/, vendor/, examples/, pocs/, ggml/ with
# its CPU and CUDA backends only) and the licences. Dropped: the test vocabularies (models/, 76 MB),
# docs/, tools/ (server, CLI, mtmd), tests/, benches/, the other ggml backends, the Python converters.
l=llama_cpp_python-$version/vendor/llama.cpp
keep=(
  "$l/CMakeLists.txt" "$l/LICENSE" "$l/licenses" "$l/cmake" "$l/include" "$l/src" "$l/common" "$l/vendor"
  "$l/examples" "$l/pocs" "$l/ggml/CMakeLists.txt" "$l/ggml/cmake" "$l/ggml/include" "$l/ggml/.gitignore"
  "llama_cpp_python-$version/llama_cpp" "llama_cpp_python-$version/LICENSE.md"
)
mkdir -p "$work/trim"
(cd "$work" && tar -cf - "${keep[@]}" 2>/dev/null) | tar -xf - -C "$work/trim" \
  || die "copying the kept parts failed"
mkdir -p "$work/trim/$l/ggml/src"
(cd "$work/$l/ggml/src" && find . -maxdepth 1 -type f -print0 | tar --null -cf - -T - ggml-cpu ggml-cuda) \
  | tar -xf - -C "$work/trim/$l/ggml/src" || die "copying ggml's sources failed"
rm -rf "$work/trim/llama_cpp_python-$version/llama_cpp/lib" "$work/trim/llama_cpp_python-$version/llama_cpp/server"
# the same bytes from the same sdist (names sorted, no times or owners, gzip without a time stamp):
# tools/gpu_check/prebuild.sh keys its cached build by this file's SHA-256, and run.sh checks it
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - -C "$work/trim" "llama_cpp_python-$version" \
  | gzip -n -6 >"$out.tmp/llama.cpp-src.tar.gz" || die "tar failed"
echo "$version" >"$out.tmp/VERSION"

step "wheels for CPython 3.12 (manylinux x86_64)"
# --no-deps with the closed list: numpy is on the machine; gguf's requests and tqdm are imported only by
# parts specviz does not use (download helpers, progress bars); pytest and hypothesis (with their own
# dependencies) run the device tests, tests/test_vulkan.py, on the GPU
"$py" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version 3.12 \
  --abi cp312 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any \
  -d "$out.tmp/wheels" \
  "diskcache>=5.6.1" "jinja2>=2.11.3" "MarkupSafe>=2.0" "typing-extensions>=4.5" "gguf==0.19.0" \
  "PyYAML>=5.1" "tqdm>=4.27" \
  "pytest>=8" "pluggy>=1.5" "iniconfig>=1" "packaging>=20" "pygments>=2.7" "hypothesis>=6.100" \
  "sortedcontainers>=2.1" \
  || die "pip download of the wheels failed"

(cd "$out.tmp" && find . -type f ! -name MANIFEST -print0 | sort -z | xargs -0 sha256sum >MANIFEST)
size=$(du -sb "$out.tmp" | cut -f1)
[ "$size" -lt "$limit" ] || die "build/gpu_check is $size bytes, over the $limit allowed"
rm -rf "$out"
mv "$out.tmp" "$out"
step "done: $out ($((size / 1024)) KiB)"
ls -l "$out" "$out/wheels" >&2
