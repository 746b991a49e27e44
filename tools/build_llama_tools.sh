#!/usr/bin/env bash
# Build llama.cpp's own speculative tools (llama-speculative-simple, and llama-speculative: the draft-tree
# example, llama.cpp's only tree drafter), its HTTP server (llama-server) and specviz's replay driver of
# llama.cpp's draftless drafters (tools/native/draft-replay.cpp) from exactly the llama.cpp source that the
# llama-cpp-python sdist vendors, with the wheel's CPU flags, statically linked against llama and ggml, and
# install them into DEST (the cache directory beside the wheel). The differential tests
# (tests/test_differential.py, tests/test_server_differential.py, tests/test_speculative_tree_differential.py),
# benchmarks/bench_native.py, benchmarks/bench_server_advice.py and `specviz advise --check-server` run them.
# One addition to upstream: llama-speculative-simple and llama-speculative are linked with
# tools/native/flush-log-at-exit.cpp, which writes llama.cpp's log queue out at exit (upstream can lose the
# counters specviz reads).
#
# usage: tools/build_llama_tools.sh PYTHON VERSION DEST "CMAKE_ARGS" [TARGET ...]
#   PYTHON      a Python with pip (the sdist is fetched with `pip download`, pip's cache is reused)
#   VERSION     the llama-cpp-python version whose vendor/llama.cpp is built
#   DEST        directory that receives the binaries (created; written only when the build succeeded)
#   CMAKE_ARGS  the CPU feature flags of the wheel (tools/llama_cmake_args.py)
#   TARGET      cmake targets to build and install (the Makefile passes `tools/llama_tools.py --tools`)
#               (default: llama-speculative-simple specviz-draft-replay llama-server llama-speculative)
set -euo pipefail

if [ "$#" -lt 4 ]; then
  echo "usage: $0 PYTHON VERSION DEST \"CMAKE_ARGS\" [TARGET ...]" >&2
  exit 2
fi
py=$1 version=$2 dest=$3 cmake_args=$4
shift 4
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(llama-speculative-simple specviz-draft-replay llama-server llama-speculative)
here=$(cd "$(dirname "$0")" && pwd)
jobs=${LLAMA_TOOLS_JOBS:-2}

if ! command -v cmake >/dev/null 2>&1; then
  # no system cmake: take it from PyPI, as the wheel's build does
  "$py" -m pip install --quiet cmake
  PATH="$(dirname "$py"):$PATH"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/specviz-llama-tools.XXXXXX")
trap 'rm -rf "$work"' EXIT

start=$(date +%s)
"$py" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work/sdist"
tar -xzf "$work"/sdist/llama_cpp_python-"$version".tar.gz -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
# the replay driver is built as one more example of that source tree (the unpacked copy only)
cp -r "$here/native" "$src/examples/specviz-draft-replay"
echo 'add_subdirectory(specviz-draft-replay)' >>"$src/examples/CMakeLists.txt"

# Only what the tools need: the common library, the examples and the server (no tests, HTTPS or web UI).
# The server's web UI is neither built (npm) nor fetched: with LLAMA_USE_PREBUILT_UI at its default (ON) the
# configure step would download it from a model hub. specviz talks to the server's JSON API only.
# shellcheck disable=SC2086  # CMAKE_ARGS is a list of -D options
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF \
  $cmake_args >"$work/configure.log" 2>&1 || { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" --config Release --target "${targets[@]}" -j "$jobs" >"$work/build.log" 2>&1 \
  || { tail -n 60 "$work/build.log" >&2; exit 1; }

mkdir -p "$dest.tmp"
for t in "${targets[@]}"; do
  cp "$work/build/bin/$t" "$dest.tmp/"
done
echo "$cmake_args" >"$dest.tmp/cmake_args.txt"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "built ${targets[*]} from llama-cpp-python $version in $(( $(date +%s) - start )) s -> $dest"
