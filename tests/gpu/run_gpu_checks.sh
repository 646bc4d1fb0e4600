#!/usr/bin/env bash
# Every GPU check, in one run, on the GPU machine (its image has torch but no Ray):
#   bash ../shared/device/make-bundle.sh        # here, once: builds .devbundle/
#   device run: carry [".devbundle"], command:
#   source .devbundle/env.sh && bash tests/gpu/run_gpu_checks.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python3 -m pip install -q --target /tmp/site pytest pytest-timeout hypothesis 2>/dev/null || true
python3 -m pytest -q -s -m gpu tests/gpu -p no:cacheprovider --timeout 300
status=$?
python3 tests/benchmarks/bench_serialization.py --quick --gpu || true
# async checkpoint blocked time for a CUDA state vs the pinned device-to-host copy floor
python3 tests/benchmarks/bench_checkpoint_async.py --cuda --size-mib 1024 --reps 3 || true
exit $status
