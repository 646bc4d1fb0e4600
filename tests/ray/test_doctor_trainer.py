"""RobustTrainer runs the doctor's per-worker subset at start-up (GuardConfig(preflight=True)):
a bad variable stops the run at once with the finding's message on the driver; a correctly
configured Ray Train worker passes (every RobustTrainer test runs the preflight: it is on by
default, e.g. tests/ray/test_trainer_foundation.py; the unit tests check Ray Train's worker
variables, see tests/unit/doctor/helpers.py)."""

from __future__ import annotations

import pytest

from rayguard.testing.recorder import make_trainer

pytestmark = pytest.mark.slow


def _never_reached(config):
    raise AssertionError("the training function must not start after a preflight error")


def test_bad_variable_stops_the_run_with_the_finding(ray_local, tmp_path):
    trainer = make_trainer(_never_reached, tmp_path, num_workers=1, name="bad",
                           worker_runtime_env={"env_vars": {"NCCL_SOCKET_NTHREADS": "99"}})
    with pytest.raises(Exception, match="NCCL_SOCKET_THREADS_RANGE") as info:
        trainer.fit()
    assert "NCCL_SOCKET_NTHREADS='99' must be an integer in 1..16" in str(info.value)
