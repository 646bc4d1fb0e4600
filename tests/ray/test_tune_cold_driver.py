"""rayguard.tune.run() in a driver that has not imported torch does not import it on the
caller's thread (it took seconds: docs/tuning.md says run() returns in milliseconds); the
serializers are registered all the same, in the background."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("tune_cold_driver.py")


def test_run_registers_serializers_off_the_callers_thread(ray_local, tmp_path):
    address = ray_local.get_runtime_context().gcs_address
    proc = subprocess.run([sys.executable, str(SCRIPT), address, str(tmp_path)],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["torch_before"] is False
    assert out["calls"] == ["rayguard-register-serializers"]
    assert out["registered"] is True
    print(f"\nrun() returned in {out['run_s']:.3f} s (plain Tuner: {out['plain_tuner_s']:.3f} s)")
