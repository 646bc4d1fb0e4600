# Two commands on a fresh machine (no venv, no torch):
#   make quickstart   # sets up .venv, then trains a small model on a local Ray cluster (CPU)
#   make test         # sets up .venv, then runs the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup quickstart test lint bench
$(BIN)/.rayguard-setup: pyproject.toml requirements/constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements/constraints.txt
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -e ".[test]"
	touch $@

setup: $(BIN)/.rayguard-setup

quickstart: setup
	$(BIN)/python examples/quickstart.py

test: setup
	$(BIN)/python -m pytest tests

lint: setup
	$(BIN)/ruff check rayguard tests examples
	$(BIN)/mypy

bench: setup
	for f in tests/benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done
