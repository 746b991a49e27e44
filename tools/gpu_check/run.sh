#!/usr/bin/env bash
# The GPU check: on a Linux machine with one NVIDIA GPU (made for an H200), nvcc, CMake and Python 3.12
# with numpy but no package registry, from a copy of this working tree that carries build/gpu_check/
# (tools/gpu_check/prepare.sh makes it):
#   1. checks the machine and the carried files;
#   2. installs specviz's pure-Python dependencies from the carried wheels (no pip index);
#   3. writes a random llama-architecture test model of about 1.1B parameters in f16 (in the background);
#   4. builds the carried llama.cpp for that chip only (-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90):
#      its shared libraries for llama-cpp-python's binding and llama-speculative-simple; or, where
#      prebuild.sh carried a build of the same source for the same chip made beforehand, unpacks that;
#   5. checks llama.cpp sees the GPU, runs the device tests (tests/test_vulkan.py on this backend: every
#      strategy against plain greedy, layer capture of device tensors, snapshots and rewinds, on the tiny
#      fixtures) and `specviz verify` on the test model, every layer on the GPU;
#   6. runs the overhead benchmark and the native comparison (bench_native.py) on the test model, and the
#      overhead benchmark on a random model of the embedded Gemma 3 270M's shape (its 262k vocabulary),
#      once more there with a row read by as many threads as there are cores (up to 16), every layer on
#      the GPU.
# Every step says what it does and fails loudly (exit status = the step's number). Figures and logs go
# to $OUT when it is set (the GPU tool sends that folder back), else to $GPU_CHECK_WORK/out.
#
# usage: bash tools/gpu_check/run.sh
# settings (environment):
#   GPU_CHECK_BACKEND  cuda (default) or cpu: the same steps with a CPU build and a small model, to try
#                      the script on a machine without a GPU
#   GPU_CHECK_ARCH     CUDA architecture (default 90: H100/H200)
#   GPU_CHECK_JOBS     build jobs (default: the number of cores)
#   GPU_CHECK_PYTHON   the Python 3.12 to use (default: the first of python3.12, python3 that is 3.12
#                      and has numpy)
#   GPU_CHECK_PREBUILT 1 (default): use the carried build of prebuild.sh when it matches; 0: build here
#   GPU_CHECK_MODEL    shape of the test model as sized_models options (default: its 1.1B defaults)
#   GPU_CHECK_BENCH    "overhead,wide,native" (default) or a subset ("wide": the overhead benchmark again on
#                      a model of the embedded Gemma 3 270M's shape, its 262k vocabulary included; "sampled",
#                      not in the default: the same on that model with sampled decoding, after "wide");
#                      GPU_CHECK_REPEATS (default 1; GPU_CHECK_NATIVE_REPEATS: the native comparison's, default
#                      the same),
#                      GPU_CHECK_KINDS (default quote,code-rewrite,free), GPU_CHECK_MAX_TOKENS (default 128),
#                      GPU_CHECK_STRATEGIES (the native comparison's; default: the benchmark's own five),
#                      GPU_CHECK_WIDE_STRATEGIES and GPU_CHECK_WIDE_DRAFT (the "wide" benchmark's strategies
#                      and draft lengths; default none,prompt-lookup,ngram-simple,ngram-mod and 1,16; "all":
#                      every draftless strategy), GPU_CHECK_SCAN_THREADS (comma-separated thread counts a row
#                      is read by in the "wide" benchmark's second pass; default: the cores, at most 16)
#   GPU_CHECK_TESTS    1 (default): run the device tests; 0: leave them out. GPU_CHECK_TESTS_TIMEOUT: their
#                      limit in seconds (default 150)
#   GPU_CHECK_DEADLINE seconds from the start after which the benchmarks are cut short (default 570)
#   GPU_CHECK_WORK     scratch folder (default /tmp/specviz-gpu-check)
set -uo pipefail
t_start=$(date +%s)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
carried=$repo/build/gpu_check
backend=${GPU_CHECK_BACKEND:-cuda}
arch=${GPU_CHECK_ARCH:-90}
jobs=${GPU_CHECK_JOBS:-$(nproc)}
work=${GPU_CHECK_WORK:-/tmp/specviz-gpu-check}
out=${OUT:-$work/out}
deadline=${GPU_CHECK_DEADLINE:-570}
repeats=${GPU_CHECK_REPEATS:-1}
native_repeats=${GPU_CHECK_NATIVE_REPEATS:-$repeats}
kinds=${GPU_CHECK_KINDS:-quote,code-rewrite,free}
native_strategies=${GPU_CHECK_STRATEGIES:-}
max_tokens=${GPU_CHECK_MAX_TOKENS:-128}
benches=${GPU_CHECK_BENCH:-overhead,wide,native}
wide_strategies=${GPU_CHECK_WIDE_STRATEGIES:-none,prompt-lookup,ngram-simple,ngram-mod}
wide_draft=${GPU_CHECK_WIDE_DRAFT:-1,16}
scan_threads=${GPU_CHECK_SCAN_THREADS:-}
run_tests=${GPU_CHECK_TESTS:-1}
tests_timeout=${GPU_CHECK_TESTS_TIMEOUT:-150}
failed=""  # a check that failed but let the benchmarks run: the script still fails, at its end
# $out gets two files: the log (everything printed, the figures' tables included, written as it goes) and,
# at the end however it ends, details.tar.gz (each step's own output); the GPU tool sends back at most 8
# files from that folder, and a run cut off by its limit still leaves the log
det=$work/details
rm -rf "$det"
mkdir -p "$out" "$work" "$det"
trap 'tar -czf "$out/details.tar.gz" -C "$det" . 2>/dev/null || true' EXIT
log=$out/gpu_check.log
exec > >(tee -a "$log") 2>&1

n=0
step() { n=$((n + 1)); echo; echo "== step $n [$(( $(date +%s) - t_start )) s]: $*"; }
die() { echo "GPU CHECK FAILED at step $n: $*" >&2; exit "$n"; }
left() { echo $(( deadline - ($(date +%s) - t_start) )); }

# -- 1 -----------------------------------------------------------------------------------------------------
step "the machine and the carried files (backend $backend)"
case "$backend" in cuda|cpu) ;; *) die "GPU_CHECK_BACKEND=$backend: choose cuda or cpu" ;; esac
py=${GPU_CHECK_PYTHON:-}
if [ -z "$py" ]; then
  # the first Python 3.12 that has numpy: a machine's python3.12 can be the system's, without numpy, while
  # its python3 (a venv's, as on the lent H200s) has it
  for cand in python3.12 python3; do
    command -v "$cand" >/dev/null 2>&1 || continue
    if "$cand" -c 'import sys, numpy; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      py=$(command -v "$cand"); break
    fi
  done
  [ -n "$py" ] || die "no Python 3.12 with numpy found (python3.12 or python3); set GPU_CHECK_PYTHON"
fi
"$py" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' || die "$py is not Python 3.12"
"$py" -c 'import numpy; print("numpy", numpy.__version__)' || die "numpy is not importable by $py"
command -v cmake >/dev/null || die "cmake is not on PATH"
cmake --version | head -1
command -v c++ >/dev/null || command -v g++ >/dev/null || die "no C++ compiler (c++ or g++) on PATH"
command -v cc >/dev/null || command -v gcc >/dev/null || die "no C compiler (cc or gcc) on PATH"
if [ "$backend" = cuda ]; then
  command -v nvcc >/dev/null || [ ! -x /usr/local/cuda/bin/nvcc ] || export PATH=/usr/local/cuda/bin:$PATH
  if command -v nvcc >/dev/null; then
    nvcc --version | tail -2
  elif [ -f "$carried/prebuilt-cuda.tar.xz" ]; then
    echo "nvcc is not on PATH: only the carried build can be used"
  else
    die "nvcc is not on PATH (add the CUDA toolkit's bin/, e.g. /usr/local/cuda/bin)"
  fi
  command -v nvidia-smi >/dev/null || die "nvidia-smi is not on PATH: no NVIDIA driver?"
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || die "nvidia-smi failed"
fi
echo "cores: $(nproc), memory: $(free -g | awk '/Mem:/ {print $2 " GiB"}'), disk free in $work: $(df -h "$work" | awk 'NR==2 {print $4}')"
[ -f "$carried/MANIFEST" ] || die "$carried is missing: run tools/gpu_check/prepare.sh before copying the tree, and carry build/gpu_check"
(cd "$carried" && sha256sum --quiet -c MANIFEST) || die "a carried file does not match build/gpu_check/MANIFEST"
version=$(cat "$carried/VERSION")
echo "llama-cpp-python $version's llama.cpp; python $py"

# -- 2 -----------------------------------------------------------------------------------------------------
step "specviz's pure-Python dependencies from the carried wheels"
site=$work/site
rm -rf "$site" && mkdir -p "$site"
# a wheel is a zip archive laid out for site-packages: unpacking it is installing it (no pip, no index)
"$py" - "$carried/wheels" "$site" <<'PY' || die "unpacking the wheels failed"
import sys, zipfile, pathlib
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for whl in sorted(src.glob("*.whl")):
    zipfile.ZipFile(whl).extractall(dst)
    print("installed", whl.name)
PY
export PYTHONPATH=$repo:$site
"$py" -c 'import gguf, jinja2, diskcache, yaml; print("gguf", gguf.__name__, "ok")' || die "the unpacked wheels do not import"

# -- 3 -----------------------------------------------------------------------------------------------------
step "the test model (written in the background while llama.cpp builds)"
model=$work/random-llama.gguf
if [ "$backend" = cpu ]; then
  model_args=${GPU_CHECK_MODEL:---width 512 --layers 4 --heads 8 --kv-heads 2 --ff 1536}
else
  model_args=${GPU_CHECK_MODEL:-}
fi
# shellcheck disable=SC2086  # the model options are a word list
"$py" -m specviz.testing.sized_models "$model" $model_args >"$det/model.log" 2>&1 &
model_pid=$!
# Issue 26's target is set on the embedded Gemma 3 270M, which is too large to carry: a random llama of its
# shape stands in for it (width 640, 18 blocks, 4 heads and 1 key/value head, feed-forward 2048, and the
# 262,144-token vocabulary that makes every row read a megabyte; f16, about 0.4B parameters with its
# untied output layer). The CPU rehearsal writes a cut-down one (2 blocks) to keep its decode short.
wide_model=$work/random-262k.gguf
wide_pid=""
if [[ ",$benches," == *",wide,"* ]]; then
  wide_layers=18; [ "$backend" = cpu ] && wide_layers=2
  "$py" -m specviz.testing.sized_models "$wide_model" --width 640 --layers "$wide_layers" --heads 4 --kv-heads 1 \
    --ff 2048 --vocab 262144 >"$det/model-262k.log" 2>&1 &
  wide_pid=$!
fi

# -- 4 -----------------------------------------------------------------------------------------------------
if [ "$backend" = cuda ]; then step "llama.cpp for CUDA sm_$arch (built with $jobs jobs, or the build made beforehand)"
else step "llama.cpp for the CPU (built with $jobs jobs, or the build made beforehand)"; fi
sdist=$work/src/llama_cpp_python-$version
# the CPU flags of tools/llama_cmake_args.py (this machine's x86 features, never AMX or -march=native), as
# for the wheel, plus the backend's
if [ "$backend" = cuda ]; then
  cmake_args=$("$py" "$repo/tools/llama_cmake_args.py" --backend cuda -- "-DCMAKE_CUDA_ARCHITECTURES=$arch")
else
  cmake_args=$("$py" "$repo/tools/llama_cmake_args.py" --backend cpu)
fi || die "tools/llama_cmake_args.py failed"
# a machine kept warm between two runs keeps $work: the build of the same source with the same arguments
# is reused (the stamp is written only after a build succeeded)
src_sha=$(sha256sum "$carried/llama.cpp-src.tar.gz" | cut -d' ' -f1)
stamp_want="$src_sha $backend $cmake_args"
stamp=$work/build/.specviz-gpu-check-stamp
# a build made beforehand (tools/gpu_check/prebuild.sh, on a machine without the GPU) of this very source,
# for this backend and chip, is unpacked instead of building (GPU_CHECK_PREBUILT=0: build all the same)
prebuilt=$carried/prebuilt-$backend.tar.xz
prebuilt_info=$carried/prebuilt-$backend.info
use_prebuilt=0
if [ "${GPU_CHECK_PREBUILT:-1}" = 1 ] && [ -f "$prebuilt" ] && [ -f "$prebuilt_info" ]; then
  if ! grep -qx "source_sha256 $src_sha" "$prebuilt_info"; then
    echo "the carried build was made from another source: building from source"
  elif [ "$backend" = cuda ] && ! grep -qx "arch $arch" "$prebuilt_info"; then
    echo "the carried build is for another chip ($(grep '^arch ' "$prebuilt_info")), not sm_$arch: building from source"
  else
    use_prebuilt=1
  fi
fi
if [ "$use_prebuilt" = 1 ]; then
  rm -rf "$work/src" "$work/build" && mkdir -p "$work/src" "$work/build"
  # the binding's Python package comes from the carried source either way
  tar -xzf "$carried/llama.cpp-src.tar.gz" -C "$work/src" "llama_cpp_python-$version/llama_cpp" \
    || die "unpacking the llama_cpp package failed"
  tar -xJf "$prebuilt" -C "$work/build" || die "unpacking the carried build failed"
  echo "the build made beforehand (no build here):"
  sed 's/^/  /' "$prebuilt_info"
elif [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_want" ]; then
  echo "reusing the build of an earlier run on this machine ($work/build)"
else
  [ "$backend" = cpu ] || command -v nvcc >/dev/null || die "nvcc is not on PATH: no CUDA build is possible here"
  echo "cmake arguments: $cmake_args"
  rm -rf "$work/src" "$work/build" && mkdir -p "$work/src"
  tar -xzf "$carried/llama.cpp-src.tar.gz" -C "$work/src" || die "unpacking the llama.cpp source failed"
  t_build=$(date +%s)
  # shellcheck disable=SC2086  # cmake_args is a list of -D options
  cmake -S "$sdist/vendor/llama.cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_CURL=OFF \
    -DGGML_CCACHE=OFF $cmake_args >"$det/configure.log" 2>&1 \
    || { tail -n 40 "$det/configure.log"; die "cmake configure failed (details: configure.log)"; }
  cmake --build "$work/build" --config Release -j "$jobs" --target llama llama-speculative-simple \
    >"$det/build.log" 2>&1 || { grep -m 20 -B 2 -A 8 -E "error|Error" "$det/build.log" | head -80; die "the build failed (details: build.log)"; }
  echo "built in $(( $(date +%s) - t_build )) s"
  echo "$stamp_want" >"$stamp"
fi
tool=$(find "$work/build" -type f -name llama-speculative-simple -perm -u+x | head -1)
[ -n "$tool" ] || die "llama-speculative-simple was not produced"
# llama-cpp-python's binding loads lib{llama,ggml,ggml-base,ggml-cpu,ggml-cuda}.so from llama_cpp/lib (the tool
# also loads libllama-common: LD_LIBRARY_PATH finds it there too)
rm -rf "$site/llama_cpp" && cp -r "$sdist/llama_cpp" "$site/llama_cpp" && mkdir -p "$site/llama_cpp/lib"
find "$work/build" -name "lib*.so*" -exec cp -a {} "$site/llama_cpp/lib/" \;
ls "$site/llama_cpp/lib"
export LD_LIBRARY_PATH=$site/llama_cpp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# the libraries the build loads from the machine (CUDA's runtime and cuBLAS, the driver's libcuda): where the
# dynamic loader does not find one (a build made elsewhere, a toolkit outside the loader's paths), look in
# the CUDA toolkit, the driver's folder and the Python's NVIDIA wheels (PyTorch's cuBLAS, say)
missing_libs() { for f in "$site"/llama_cpp/lib/lib*.so "$tool"; do ldd "$f" 2>/dev/null; done | awk '/not found/ {print $1}' | sort -u; }
missing=$(missing_libs)
if [ -n "$missing" ]; then
  purelib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  for lib in $missing; do
    found=$(find "$purelib/nvidia" /usr/local/cuda /usr/local/cuda-* /usr/local/nvidia /usr/lib/x86_64-linux-gnu \
      /usr/lib64 /opt -maxdepth 6 -name "$lib" 2>/dev/null | head -1)
    if [ -n "$found" ]; then
      echo "  $lib: $found"
      export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$found")
    fi
  done
  missing=$(missing_libs)
  [ -z "$missing" ] || die "libraries the build needs are nowhere on this machine: $(echo $missing)"
fi
mkdir -p "$work/tools" && cp "$tool" "$work/tools/" && export SPECVIZ_LLAMA_TOOLS=$work/tools
export SPECVIZ_NATIVE_CACHE=$work/native

# -- 5 -----------------------------------------------------------------------------------------------------
step "llama.cpp's devices, the capture shim, the device tests and specviz verify on the test model"
"$py" -m specviz.backends.build_capture || die "the layer-capture shim did not build"
"$py" - "$backend" <<'PY' || die "llama.cpp does not see the expected device"
import sys
from specviz.backends.devices import devices
ds = devices()
for d in ds:
    print(f"  {d.name}: {d.description} ({d.backend}, {d.kind}, {d.memory_total / 2**30:.1f} GiB)")
if sys.argv[1] == "cuda" and not any(d.backend == "CUDA" for d in ds):
    sys.exit("no CUDA device in llama.cpp's registry")
PY
if [ "$run_tests" = 1 ]; then
  # the Vulkan build's tests, on this build's device: the tiny fixtures with every layer offloaded
  # (the CPU rehearsal runs them on the CPU backend: nothing is offloaded there)
  dev_backend=CUDA; [ "$backend" = cpu ] && dev_backend=CPU
  (cd "$repo" && SPECVIZ_DEVICE_BACKEND=$dev_backend SPECVIZ_REQUIRE_DEVICE=1 timeout "$tests_timeout" \
    "$py" -m pytest -q -ra -p no:cacheprovider tests/test_vulkan.py) >"$det/device_tests.txt" 2>&1
  rc=$?
  tail -n 25 "$det/device_tests.txt"
  if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 124 ] && echo "(cut short at $tests_timeout s)"
    echo "DEVICE TESTS FAILED (status $rc; details: device_tests.txt); the benchmarks run all the same"
    failed="the device tests (status $rc, device_tests.txt)"
  fi
fi
wait "$model_pid" || { cat "$det/model.log"; die "writing the test model failed (details: model.log)"; }
cat "$det/model.log"
ngl=99
# plain greedy against speculative greedy on the test model, every layer on the device: identical, or a
# near-tie that a replay of the speculative run's own batches explains (numerics); mismatch fails
for strat in prompt-lookup ngram-mod; do
  "$py" -m specviz.cli verify --model "$model" -ngl "$ngl" --strategy "$strat" --draft-max 8 --max-tokens 48 \
    --prompt "The quick brown fox jumps over the lazy dog. The quick brown fox" -c 512 -b 64 -ub 64 \
    >"$det/verify-$strat.txt" 2>&1
  rc=$?
  echo "  $strat: $(tail -n 1 "$det/verify-$strat.txt")"
  if [ "$rc" -ne 0 ]; then
    failed="${failed:+$failed; }specviz verify --strategy $strat (status $rc, verify-$strat.txt)"
  fi
done

# -- 6 -----------------------------------------------------------------------------------------------------
threads=$(nproc)
# bench NAME BUDGET FIRST LAST COMMAND...: COMMAND cut short after BUDGET seconds, its output and errors kept
# as NAME.txt and NAME.err, its table printed (from the line that starts with FIRST to the one before the
# line that starts with LAST: the JSON after it stays in the details); a failure ends the check
bench() {
  local name=$1 budget=$2 first=$3 last=$4 rc
  shift 4
  [ "$budget" -gt 30 ] || die "no time left for $name (GPU_CHECK_DEADLINE=$deadline)"
  timeout "$budget" "$@" >"$det/$name.txt" 2>"$det/$name.err"
  rc=$?
  sed -n "/^$first/,/^$last/p" "$det/$name.txt" | sed '$d'
  [ "$rc" -eq 0 ] || { tail -n 20 "$det/$name.err"; [ "$rc" -eq 124 ] && echo "(cut short at $budget s)"; die "$name failed (status $rc)"; }
}
on_device=(--n-gpu-layers "$ngl" --threads "$threads" --repeats "$repeats")
if [[ ",$benches," == *",overhead,"* ]]; then
  step "the overhead benchmark (greedy), every layer on the device"
  bench overhead $(( $(left) / 3 )) specviz '\[' "$py" "$repo/benchmarks/bench_overhead.py" --model "$model" \
    "${on_device[@]}" --draft-max 1,4,16 --json
fi
if [[ ",$benches," == *",wide,"* ]]; then
  step "the overhead benchmark on the embedded model's shape (a 262k vocabulary), every layer on the device"
  wait "$wide_pid" || { cat "$det/model-262k.log"; die "writing the 262k-vocabulary model failed (details: model-262k.log)"; }
  cat "$det/model-262k.log"
  wide_sel=(--draft-max "$wide_draft")
  [ "$wide_strategies" = all ] || wide_sel+=(--strategies "$wide_strategies")
  bench overhead-262k $(( $(left) / 2 )) specviz '\[' "$py" "$repo/benchmarks/bench_overhead.py" --model "$wide_model" \
    "${on_device[@]}" "${wide_sel[@]}" --json
  # the rows arrive from the device in host memory: the same rounds with a row read by other numbers of
  # threads than the kernel's default cap (8; by default as many as there are cores, up to 16), to see
  # whether more or fewer threads read one faster
  [ -n "$scan_threads" ] || scan_threads=$(( threads < 16 ? threads : 16 ))
  IFS=, read -r -a scan_list <<<"$scan_threads"
  for k in "${scan_list[@]}"; do
    step "the same on the 262k vocabulary, a row read by $k threads (SPECVIZ_SCAN_THREADS)"
    SPECVIZ_SCAN_THREADS=$k bench "overhead-262k-rows-$k" $(( $(left) / (${#scan_list[@]} + 1) )) specviz '\[' "$py" \
      "$repo/benchmarks/bench_overhead.py" --model "$wide_model" "${on_device[@]}" "${wide_sel[@]}" --json
  done
fi
if [[ ",$benches," == *",sampled,"* ]]; then
  # sampled decoding (issue 26 asks for its figures, with no target): the same selection on the model of
  # the embedded model's shape, temperature 0.8 with top-k 40
  step "the overhead benchmark, sampled (temperature 0.8, top-k 40), on the 262k vocabulary"
  [ -z "$wide_pid" ] || wait "$wide_pid" || die "writing the 262k-vocabulary model failed (details: model-262k.log)"
  [ -f "$wide_model" ] || die "the sampled benchmark runs on the 262k-vocabulary model: add wide to GPU_CHECK_BENCH"
  bench overhead-262k-sampled $(( $(left) / 2 )) specviz '\[' "$py" "$repo/benchmarks/bench_overhead.py" \
    --model "$wide_model" "${on_device[@]}" "${wide_sel[@]}" \
    --temperature 0.8 --top-k 40 --json
fi
if [[ ",$benches," == *",native,"* ]]; then
  step "specviz against llama-speculative-simple, every layer on the device"
  bench native $(( $(left) - 10 )) 'specviz vs' '{' "$py" "$repo/benchmarks/bench_native.py" --model "$model" \
    --n-gpu-layers "$ngl" --threads "$threads" --repeats "$native_repeats" --kinds "$kinds" --max-tokens "$max_tokens" --prompts 0 \
    ${native_strategies:+--strategies "$native_strategies"} --json
fi
echo
if [ -n "$failed" ]; then
  n=5
  die "$failed"
fi
echo "GPU CHECK PASSED in $(( $(date +%s) - t_start )) s; figures in $out"
