from __future__ import annotations

from rayguard.constants import KNOWN_ENV_VARS
from rayguard.doctor.rayguard_env import check_rayguard_env
from rayguard.doctor.threads import check_threads

from .helpers import codes, gpu_probe


def test_threads_bad_value():
    assert codes(check_threads(gpu_probe({"OMP_NUM_THREADS": "0"}))) == ["THREADS_BAD_VALUE"]
    assert codes(check_threads(gpu_probe({"MKL_NUM_THREADS": "auto"}))) == ["THREADS_BAD_VALUE"]
    assert check_threads(gpu_probe({"OMP_NUM_THREADS": "4,2"})) == []


def test_threads_times_local_workers_vs_cores():
    env = {"OMP_NUM_THREADS": "4", "LOCAL_WORLD_SIZE": "4"}  # 16 threads on 8 cores
    assert codes(check_threads(gpu_probe(env))) == ["THREADS_OVERSUBSCRIBED"]
    assert check_threads(gpu_probe({**env, "LOCAL_WORLD_SIZE": "2"})) == []
    found = check_threads(gpu_probe({"MKL_NUM_THREADS": "4"}), local_world_size=3)
    assert codes(found) == ["THREADS_OVERSUBSCRIBED"] and "MKL_NUM_THREADS=2" in found[0].fix


def test_unknown_rayguard_vars():
    found = check_rayguard_env(gpu_probe({"RAYGUARD_FAULT": "x", "RAYGUARD_NOPE_AT_ALL": "1"}))
    assert codes(found) == ["RAYGUARD_UNKNOWN_VAR"] * 2
    assert "RAYGUARD_FAULTS" in next(f.fix for f in found if f.subject == "RAYGUARD_FAULT")
    assert check_rayguard_env(gpu_probe(dict.fromkeys(KNOWN_ENV_VARS, "1"))) == []
