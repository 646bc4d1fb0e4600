# Two commands on a fresh machine (no venv, no torch):
#   make quickstart   # sets up .venv, then trains a small model on a local Ray cluster (CPU)
#   make test         # sets up .venv, then runs the test suite
# CI also runs `make test-oldest-ray`: unit tests plus the `compat` end-to-end set on the
# oldest supported Ray, in its own venv (docs/compatibility.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup quickstart test test-oldest-ray test-newest-torch lint bench
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

# One pytest run on RAY_TEST_PROCS worker processes (pytest-xdist), one whole file at a time,
# each worker with its own local Ray cluster: while a test waits on a bound or a process
# start, the other worker uses the cores. The files whose tests start clusters of their own
# are one unit, run first by one worker; the unit tests are another, run by the other worker
# before it starts Ray (a unit test that forks can hang in a process running Ray's threads);
# the shared cluster's files follow, the slowest first; a test marked `alone` runs beside the
# unit tests only (tests/conftest.py, docs/testing.md). RAY_TEST_PROCS=0: all in this process.
# --durations: the slowest tests are printed at the end (the suite's time is watched).
RAY_TEST_PROCS ?= 2
test: setup
	$(BIN)/python -m pytest tests -n $(RAY_TEST_PROCS) --dist loadfile --no-loadscope-reorder \
		--durations=25

# The oldest Ray rayguard supports (pyproject's ray range starts here).
OLDEST_RAY ?= 2.59.0
OLD_VENV := .venv-ray$(OLDEST_RAY)
OLD_BIN := $(OLD_VENV)/bin
$(OLD_BIN)/.rayguard-setup: pyproject.toml requirements/constraints.txt
	@echo "== creating $(OLD_VENV): Ray $(OLDEST_RAY), same constraints =="
	$(PY) -m venv $(OLD_VENV)
	$(OLD_BIN)/python -m pip install -q --upgrade pip
	$(OLD_BIN)/python -m pip install -q -r requirements/constraints.txt
	$(OLD_BIN)/python -m pip install -q -c requirements/constraints.txt "ray[train,tune,default]==$(OLDEST_RAY)"
	$(OLD_BIN)/python -m pip install -q -c requirements/constraints.txt -e ".[test]" "ray==$(OLDEST_RAY)"
	touch $@

test-oldest-ray: $(OLD_BIN)/.rayguard-setup
	$(OLD_BIN)/python -c "import ray; assert ray.__version__ == '$(OLDEST_RAY)', ray.__version__"
	$(OLD_BIN)/python -m pytest tests/unit -n auto
	$(OLD_BIN)/python -m pytest tests/ray -m compat

# The newest torch tried (docs/compatibility.md#torch-versions): unit tests plus the `compat`
# end-to-end set in a venv of its own, torch==$(NEWEST_TORCH) in place of the pinned 2.13.
# By hand only, NOT called from .ci/run: CI's suite is already over its time. Downloads
# torch (hundreds of MB for the CPU build, GBs where the registry serves the CUDA one).
NEWEST_TORCH ?= 2.15.0
NEW_TORCH_VENV := .venv-torch$(NEWEST_TORCH)
NEW_TORCH_BIN := $(NEW_TORCH_VENV)/bin
$(NEW_TORCH_BIN)/.rayguard-setup: pyproject.toml
	@echo "== creating $(NEW_TORCH_VENV): torch $(NEWEST_TORCH), Ray as pyproject allows =="
	$(PY) -m venv $(NEW_TORCH_VENV)
	$(NEW_TORCH_BIN)/python -m pip install -q --upgrade pip
	$(NEW_TORCH_BIN)/python -m pip install -q "torch==$(NEWEST_TORCH)"
	$(NEW_TORCH_BIN)/python -m pip install -q -e ".[test]" "torch==$(NEWEST_TORCH)"
	touch $@

test-newest-torch: $(NEW_TORCH_BIN)/.rayguard-setup
	$(NEW_TORCH_BIN)/python -c "import torch; v = torch.__version__.split('+')[0]; assert v == '$(NEWEST_TORCH)', v"
	$(NEW_TORCH_BIN)/python -m pytest tests/unit -n auto
	$(NEW_TORCH_BIN)/python -m pytest tests/ray -m compat

lint: setup
	$(BIN)/ruff check rayguard tests examples
	$(BIN)/mypy

bench: setup
	for f in tests/benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done
