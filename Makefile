# Each target creates .venv on first use. torch is pinned in the same pip command so that
# pip takes the local CPU wheel instead of pulling a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH := torch==2.13.0
EXTRAS := dev,text,bench,train,serve,faiss,notebooks,langchain,llamaindex,haystack,interop,ray,docs,onnx,peers
STAMP := $(VENV)/.installed-$(EXTRAS)
MIN_VENV := .venv-min

.PHONY: demo test test-fast test-min lint format bench docs clean

# the real sets (scifact/, musique/) the benchmarks and some tests read; any folder: make bench GEOGRAPH_DATA=DIR
GEOGRAPH_DATA ?= $(abspath ../shared/data)
export GEOGRAPH_DATA

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# constraints.txt: the versions tested together (pyproject.toml's extras are ranges)
	$(PY) -m pip install -c constraints.txt '$(TORCH)' -e '.[$(EXTRAS)]'
	# the live parity references; GraphRicciCurvature 0.6.1's metadata pins scipy<=1.13.1,
	# which it does not need: install it without its dependency pins
	$(PY) -m pip install --no-deps 'GraphRicciCurvature==0.6.1' 'python-louvain==0.16' 'networkit==11.3' 'tabulate>=0.9'
	touch $@

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m geograph demo

# pytest exits 5 when it collected no test: that is a failure, not a pass.
# ruff (lint and format), codespell, mypy (strict on the packages of [tool.mypy]) and import-linter's layers;
# `make test` runs it first
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	# every file of the tree, tracked or not (a new file is checked before its first commit); ignored ones are not
	$(VENV)/bin/codespell $$(git ls-files --cached --others --exclude-standard 2>/dev/null || find . -path ./.venv -prune -o -type f -print)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# pytest-xdist: a worker per core (at most 4), each with one OpenMP thread, a file's tests on one
# worker (its module fixtures, such as a server, start once); see docs/guide/testing.md
XDIST := -n auto --dist loadfile --no-loadscope-reorder

test: lint
	HF_HUB_OFFLINE=1 $(PY) -m pytest $(XDIST); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# the edit-test loop: everything but the tests marked slow or integration
test-fast: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q $(XDIST) -m "not slow and not integration"

# the core at the lowest versions pyproject.toml allows (written as == pins into $(MIN_VENV)), with the
# test tools, then the fast tests: those that need an extra skip
test-min:
	test -x $(MIN_VENV)/bin/python || $(PYTHON) -m venv $(MIN_VENV)
	$(PYTHON) .ci/constraints.py min $(MIN_VENV)/constraints-min.txt
	$(MIN_VENV)/bin/python -m pip install -c $(MIN_VENV)/constraints-min.txt '$(TORCH)' -e '.[dev]'
	HF_HUB_OFFLINE=1 $(MIN_VENV)/bin/python -m pytest -q -m "not slow and not integration"; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m geograph bench run --config configs/bench/default.yaml

# the documentation site, warnings (unresolved cross-references included) as errors
docs: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m sphinx -b html -W --keep-going -n docs docs/_build/html

clean:
	rm -rf $(VENV) $(MIN_VENV) build dist *.egg-info docs/_build
