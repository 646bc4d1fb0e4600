# Two commands on a fresh machine (no venv, no torch):
#   make quickstart   # sets up .venv, then trains a small model on a local Ray cluster (CPU)
#   make test         # sets up .venv, then runs the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup quickstart test lint bench
# First run: creates .venv and installs torch (CPU build), Ray and the test tools; pip's
# progress is shown. Later runs skip this step (the stamp file is newer than its inputs).
$(BIN)/.rayguard-setup: pyproject.toml requirements/constraints.txt
	@echo "== rayguard set-up (first run only): creating $(VENV) =="
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	@echo "== installing torch (CPU build, requirements/constraints.txt) =="
	$(BIN)/python -m pip install -r requirements/constraints.txt
	@echo "== installing rayguard with Ray and the test tools =="
	$(BIN)/python -m pip install -c requirements/constraints.txt -e ".[test]"
	@echo "== set-up done =="
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
