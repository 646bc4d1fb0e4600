"""Shared fixtures. Ray start-up costs seconds, so one local cluster serves every test that
needs a plain one; multi-node tests shut it down and start their own
(``ray.cluster_utils.Cluster``), and the next test that asks for ``ray_local`` starts it again.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

LOCAL_NUM_CPUS = 4  # logical: two training workers + room for tasks/actors beside them
OBJECT_STORE_BYTES = 512 * 1024**2


def start_local_ray(num_cpus: int = LOCAL_NUM_CPUS, **kwargs):
    import ray

    if ray.is_initialized():
        return ray
    ray.init(
        address="local",  # never attach to another cluster on this machine
        num_cpus=num_cpus,
        object_store_memory=OBJECT_STORE_BYTES,
        include_dashboard=False,
        log_to_driver=True,
        **kwargs,
    )
    return ray


@pytest.fixture
def ray_local():
    """A local single-node Ray cluster (shared; started on first use)."""
    ray = start_local_ray()
    yield ray


@pytest.fixture(scope="module")
def ray_local_module():
    """The same shared local cluster, for module-scoped fixtures."""
    ray = start_local_ray()
    yield ray


@pytest.fixture
def no_ray():
    """Tests that must start their own cluster call this first."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


RAY_TEST_TIMEOUT_S = 900
"""Per-test limit for tests that start Ray clusters (the global one, 300 s, is for the rest).
On a 2-core machine with another CPU-heavy job beside the suite, starting a worker group alone
was measured at 2.5 minutes, so a test with a kill and a restart can pass 300 s without any
hang; a real hang still fails, at 15 minutes."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/ray/" in item.nodeid.replace("\\", "/") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(RAY_TEST_TIMEOUT_S))
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker 'gpu')")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
