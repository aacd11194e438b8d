# `make demo` and `make test` set up the virtual environment themselves (PyPI only, no weights).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dicosa-installed

.PHONY: setup demo test lint clean-demo

# A torch already in the environment (the CPU or CUDA build its owner chose) is never replaced:
# then dicosa and its extras install around it, constrained to that torch (and torchvision);
# otherwise requirements.txt brings its pinned pair.
$(STAMP): requirements.txt pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if $(PY) -m pip show -q torch 2>/dev/null; then \
	  $(PY) -m pip list --format=freeze | grep -iE '^torch(vision)?==' > $(VENV)/torch-kept.txt; \
	  $(PY) -m pip install -q -c $(VENV)/torch-kept.txt -e '.[dev]'; \
	else \
	  $(PY) -m pip install -q -r requirements.txt; \
	fi
	touch $(STAMP)

setup: $(STAMP)

# Each run starts afresh: the demo's outputs are regenerated, never resumed.
demo: $(STAMP) clean-demo
	$(PY) -m dicosa demo --out outputs/demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# First the Debian programs a few tests drive (Chromium and its driver, Tesseract, espeak-ng,
# DejaVu fonts): installed with apt-get where this user may (root, or passwordless sudo),
# else said, with the tests that will not run, before the tests and in their summary
# (tests/_system.py; DICOSA_SYSTEM_PACKAGES=never leaves the system alone).
# The tests marked "paths" compare two code paths, batch sizes or thread counts; they run a
# second time on one thread, because CPU kernels change their blocking with both. The first
# run names its 15 slowest tests, so that a slow suite says where its time went.
test: $(STAMP) lint
	$(PY) tests/_system.py install
	$(PY) -m pytest -q -rs --durations=15
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -rs -m paths

clean-demo:
	rm -rf outputs/demo
