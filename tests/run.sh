#!/usr/bin/env bash
# The suite as `make test` runs it: PYTHON -m pytest RAY_ARGS... (the Ray tests, one at a time,
# in the foreground, as before), and beside them the unit tests (tests/unit, pure and
# single-process) at the lowest CPU priority (nice 19). The Ray tests leave about a third of
# a 2-core machine idle (steps that wait, watchdog bounds, actors starting); the unit tests
# run in those gaps instead of after, and never take a core a Ray test wants. Their output
# follows the Ray tests'; the exit status is non-zero if either failed.
#
#   bash tests/run.sh .venv/bin/python tests --ignore=tests/unit --durations=25
#
# RAYGUARD_UNIT_AFTER=1: the unit tests after the Ray tests instead (the old order).
set -uo pipefail
python=$1
shift
unit=("$python" -m pytest tests/unit -n auto --durations=10)

if [ "${RAYGUARD_UNIT_AFTER:-0}" = "1" ]; then
  "$python" -m pytest "$@"
  ray_rc=$?
  "${unit[@]}"
  unit_rc=$?
else
  unit_log=$(mktemp "${TMPDIR:-/tmp}/rayguard-unit-XXXXXX")
  nice -n 19 "${unit[@]}" >"$unit_log" 2>&1 &
  unit_pid=$!
  # Ctrl-C or a CI cancel ends both runs
  trap 'kill -- "$unit_pid" 2>/dev/null; pkill -P "$unit_pid" 2>/dev/null; exit 130' INT TERM
  echo "== the unit tests run beside the Ray tests (nice 19); their output follows =="
  "$python" -m pytest "$@"
  ray_rc=$?
  wait "$unit_pid"
  unit_rc=$?
  trap - INT TERM
  echo "== unit tests (tests/unit), run beside the Ray tests =="
  cat "$unit_log"
  rm -f "$unit_log"
fi
if [ "$ray_rc" -ne 0 ] || [ "$unit_rc" -ne 0 ]; then
  echo "== failed: Ray tests exit $ray_rc, unit tests exit $unit_rc ==" >&2
  exit 1
fi
