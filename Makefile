# Quick start: `make demo` (install everything, open the inspector on the embedded model)
#              `make test` (install everything, run the whole test suite)
PYTHON ?= python3

# Which llama.cpp backend the llama-cpp-python wheel is built with: cpu (the default), vulkan, cuda or
# metal (tools/llama_cmake_args.py lists each one's flags and what it needs). Every backend gets its own
# wheel cache and, except cpu, its own venv (.venv-vulkan, ...), so a GPU build never replaces the CPU
# one: `make install LLAMA_BACKEND=vulkan` leaves .venv as it is. LLAMA_CMAKE_EXTRA adds CMake
# arguments (part of the cache key), e.g. LLAMA_CMAKE_EXTRA=-DCMAKE_CUDA_ARCHITECTURES=90 for one chip.
LLAMA_BACKEND     ?= cpu
LLAMA_CMAKE_EXTRA ?=
ifeq ($(LLAMA_BACKEND),cpu)
VENV ?= .venv
else
VENV ?= .venv-$(LLAMA_BACKEND)
endif
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# llama-cpp-python builds llama.cpp from source, for this CPU but without -march=native: some virtual
# machines advertise AMX tiles that the guest cannot use, and a native build then dies with "Illegal
# instruction" on quantized models. tools/llama_cmake_args.py turns on each x86 feature the CPU lists
# (AVX-512 included) except AMX. The wheel is built once per feature set and kept in WHEELHOUSE.
LLAMA_VERSION    := 0.3.36
LLAMA_CMAKE_ARGS := $(shell $(PYTHON) tools/llama_cmake_args.py --backend $(LLAMA_BACKEND) -- $(LLAMA_CMAKE_EXTRA))
LLAMA_TAG        := $(shell $(PYTHON) tools/llama_cmake_args.py --backend $(LLAMA_BACKEND) --tag -- $(LLAMA_CMAKE_EXTRA))
WHEELHOUSE       ?= $(HOME)/.cache/specviz/wheels/llama-cpp-python-$(LLAMA_VERSION)-$(LLAMA_TAG)
# llama.cpp's own speculative tools (llama-speculative-simple; llama-speculative, the draft-tree example), its
# server (llama-server) and specviz's replay driver of llama.cpp's draftless drafters, built from the same
# vendored llama.cpp with the same CPU flags (statically linked), once per machine, beside the wheel. They are
# always CPU builds: the differential tests compare with them on the CPU backend. The list is
# tools/llama_tools.py's TOOLS (a changed list is a new cache directory, built once).
LLAMA_TOOLS      := $(shell $(PYTHON) tools/llama_tools.py $(LLAMA_VERSION))
LLAMA_TOOL_NAMES := $(shell $(PYTHON) tools/llama_tools.py --tools)
LLAMA_TOOLS_ARGS := $(shell $(PYTHON) tools/llama_cmake_args.py)

# torch for `specviz train-eagle3` (the train extra): the CPU-only wheel, never the CUDA build that PyPI's
# default torch pulls in. This machine's pip resolves torch==2.13.0+cpu (pure-Python dependencies); elsewhere
# use TORCH_CPU="torch --index-url https://download.pytorch.org/whl/cpu".
TORCH_CPU        ?= torch==2.13.0+cpu

# The install, in an order that leaves pip nothing to complain about on a fresh venv:
# 1. torch alone: TORCH_CPU may carry its own --index-url, which must apply to nothing else;
# 2. the cached llama-cpp-python wheel and specviz in one resolve, so that pip installs the wheel's own
#    dependencies (numpy, diskcache, jinja2 ...) with it. Installing the wheel --no-deps first left them
#    missing until the next pip call, which then printed "ERROR: pip's dependency resolver does not
#    currently take into account all the packages that are installed";
# 3. the wheel again, --force-reinstall --no-deps: pip keeps an installed llama-cpp-python of the same
#    version (one built for other CPU flags, in a venv made before), and this puts in this machine's build.
#    Its dependencies are in place by now, and --no-deps installs check no others.
# setuptools' "Editable installation" notice (a general caution about folders named like the package,
# printed on every editable install) is filtered out of that one call by its message; pip's own errors and
# warnings still show.
# The capture shim is built by calling its main() directly: `python -m specviz.backends.capture` would
# run the module a second time (the package imports it first) and print runpy's RuntimeWarning.
LLAMA_WHEEL      = $(WHEELHOUSE)/llama_cpp_python-$(LLAMA_VERSION)-*.whl

.PHONY: install demo test test-quick test-vulkan bench bench-native llama-tools screenshots mutation clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile tools/llama_cmake_args.py $(wildcard tools/vulkan_compat/vulkan/*)
	@case "$(LLAMA_BACKEND)" in cpu|vulkan|cuda|metal) ;; \
	  *) echo "LLAMA_BACKEND=$(LLAMA_BACKEND): choose cpu, vulkan, cuda or metal" >&2; exit 2;; esac
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	ls $(WHEELHOUSE)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1 || \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip wheel --quiet --no-deps --no-cache-dir \
	    --no-binary llama-cpp-python llama-cpp-python==$(LLAMA_VERSION) -w $(WHEELHOUSE)
	$(PY) -m pip install --quiet $(TORCH_CPU)
	PYTHONWARNINGS="ignore:Editable installation:UserWarning" $(PY) -m pip install --quiet $(LLAMA_WHEEL) -e '.[all]'
	$(PY) -m pip install --quiet --force-reinstall --no-deps $(LLAMA_WHEEL)
	$(PY) -m specviz.backends.build_capture
	$(PY) -c "from specviz.decoding import rowscan_kernel as k; print(k.unavailable_reason() or k.build())"
	$(PY) -c "from specviz.strategies import ngram_kernel as k; print(k.unavailable_reason() or k.build())"
	$(PY) -c "import specviz.models as m; print('embedded model:', m.default_model_path())"
	touch $(STAMP)

# the inspector on the embedded model, with a good and a bad derived draft ready for the draft strategy
demo: install
	$(PY) examples/serve_inspector.py

# the differential tests (tests/test_differential.py, tests/test_server_differential.py,
# tests/test_speculative_tree_differential.py) compare specviz with these tools
llama-tools: $(STAMP)
	$(foreach t,$(LLAMA_TOOL_NAMES),test -x $(LLAMA_TOOLS)/$(t) && )true || \
	  tools/build_llama_tools.sh $(PY) $(LLAMA_VERSION) $(LLAMA_TOOLS) "$(LLAMA_TOOLS_ARGS)" $(LLAMA_TOOL_NAMES)

# lint and types first (seconds), then the front-end's node tests, then the whole Python suite
test: install llama-tools
	$(VENV)/bin/ruff check specviz tests benchmarks examples tools
	$(VENV)/bin/ruff format --check specviz tests benchmarks examples tools
	$(VENV)/bin/mypy
	node --test widgets/tests/
	$(PY) -m pytest -ra

# the core suite in about a minute: no llama.cpp tools, browser or embedded model, and no test that takes half a
# second or more (the markers are declared in pyproject.toml; they only select, so make test still runs every test)
test-quick: install
	$(PY) -m pytest -q -m "not embedded and not browser and not tools and not slow"

# the Vulkan build's tests (tests/test_vulkan.py) on Mesa's software Vulkan device (lavapipe), in .venv-vulkan;
# needs Debian's glslc libvulkan-dev mesa-vulkan-drivers (.ci/run installs them). lavapipe is a CPU-type
# device, which ggml's Vulkan backend skips unless it is named: GGML_VK_VISIBLE_DEVICES=0.
test-vulkan:
	$(MAKE) install LLAMA_BACKEND=vulkan
	GGML_VK_VISIBLE_DEVICES=$${GGML_VK_VISIBLE_DEVICES:-0} SPECVIZ_REQUIRE_DEVICE=1 \
	  .venv-vulkan/bin/python -m pytest -ra -p no:cacheprovider tests/test_vulkan.py

bench: install
	$(PY) benchmarks/bench_prompt_lookup.py
	$(VENV)/bin/specviz bench

# specviz against llama.cpp's llama-speculative-simple on the embedded model (run it on a quiet machine)
bench-native: install llama-tools
	$(PY) benchmarks/bench_native.py

# docs/screenshots/, regenerated on purpose. The browser tests that take the pictures write them to
# build/screenshots/ (git-ignored; `make test` leaves the tracked tree as it was); this target runs them
# (CI=true: a missing chromium fails instead of skipping), copies the ten pictures over, and takes the
# sweep report's picture from a fresh local sweep. SCREENSHOTS_OUT=DIR writes them elsewhere.
SCREENSHOT_TESTS := tests/test_browser_panel.py tests/test_browser_workbench.py \
                    tests/test_browser_jupyterlab.py tests/test_browser_jupyterlab_workbench.py \
                    tests/test_browser_tree.py
SCREENSHOT_FILES := panel_inspector.png panel_live_tiny_model.png panel_replay.png panel_workbench.png \
                    panel_workbench_tiny_model.png jupyterlab_inspector.png jupyterlab_quickstart.png \
                    jupyterlab_workbench.png jupyterlab_workbench_tiny_model.png draft_tree.png
SHOTS            := build/screenshots
SCREENSHOTS_OUT  ?= docs/screenshots

screenshots: install
	rm -rf $(SHOTS)
	CI=true $(PY) -m pytest -q -p no:cacheprovider $(SCREENSHOT_TESTS)
	mkdir -p $(SCREENSHOTS_OUT)
	cd $(SHOTS) && cp $(SCREENSHOT_FILES) $(abspath $(SCREENSHOTS_OUT))/
	$(VENV)/bin/specviz sweep workloads -o $(SHOTS)/sweep.parquet --strategy prompt-lookup,ngram-simple \
	  --knob draft_max=8,16
	$(VENV)/bin/specviz report $(SHOTS)/sweep.parquet -o $(SHOTS)/sweep.html
	$(PY) examples/sweep_report_screenshot.py $(SHOTS)/sweep.html -o $(SCREENSHOTS_OUT)/sweep_report.png

clean:
	rm -rf $(VENV) build *.egg-info

# mutation testing of the strategies, the acceptor, sampling, the budget, the policies and telemetry
# (configured in pyproject.toml; takes an hour or more on 2 cores). `mutmut results` lists the survivors.
mutation: install llama-tools
	$(VENV)/bin/pip install --quiet mutmut==3.8.1
	$(VENV)/bin/mutmut run --max-children 2
	$(VENV)/bin/mutmut results

