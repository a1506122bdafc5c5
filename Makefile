# Two commands: `make demo` and `make test`. Both work on a fresh machine with python3 (3.11+) and make.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test

.PHONY: install demo test lint bench clean
.DEFAULT_GOAL := install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(TSTAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@ $(STAMP)

install: $(STAMP)  ## `make` alone: .venv with shufflekit installed (bin: .venv/bin/shufflekit)

# The demo starts from a throwaway ledger each time so it can be run again and again;
# a real pilot keeps its ledger (see `shufflekit budget --help`).
demo: $(STAMP)
	rm -f .shufflekit/make-demo.db .shufflekit/make-demo.db-wal .shufflekit/make-demo.db-shm
	$(BIN)/shufflekit demo --ledger sqlite:///.shufflekit/make-demo.db

# Tests run on TEST_WORKERS processes (pytest-xdist); `make test TEST_WORKERS=0` runs them in one.
TEST_WORKERS ?= 2

test: $(TSTAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

lint: $(TSTAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# `make bench QUICK=1` runs the benchmarks' quick subsets (results in benchmarks/results/)
bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py $(if $(QUICK),--quick)

clean:
	rm -rf $(VENV) .shufflekit .pytest_cache .mypy_cache .ruff_cache
