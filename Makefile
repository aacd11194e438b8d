# `make demo` and `make test` set up the virtual environment themselves (PyPI only, no weights).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dicosa-installed

.PHONY: setup demo test lint clean-demo

$(STAMP): requirements.txt pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt pytest ruff
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

# Each run starts afresh: the demo's outputs are regenerated, never resumed.
demo: $(STAMP) clean-demo
	$(PY) -m dicosa demo --out outputs/demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The tests marked "paths" compare two code paths, batch sizes or thread counts; they run a
# second time on one thread, because CPU kernels change their blocking with both.
test: $(STAMP) lint
	$(PY) -m pytest -q -rs
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -rs -m paths

clean-demo:
	rm -rf outputs/demo
