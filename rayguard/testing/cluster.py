"""Rehearse node loss and node return on one machine.

A :class:`SimulatedCluster` is a ``ray.cluster_utils.Cluster`` whose head node has no CPU
(the driver, Ray Train's controller and rayguard's coordinator live there and never die)
and whose worker nodes have one CPU each, so that one training worker = one node. Remove a
worker node mid-run and Ray kills the worker on it, exactly as when a machine disappears::

    with SimulatedCluster(worker_nodes=3) as cluster:
        thread = cluster.fit_in_background(trainer)
        wait_for(lambda: steps_done() >= 5)
        cluster.remove_worker_node()            # the run continues with 2 workers
        ...
        cluster.add_worker_node()               # and grows back to 3
        result = cluster.join(thread)

It starts its own Ray instance: call it where no other ``ray.init`` is active, and let the
run finish before leaving the ``with`` block (a ``fit()`` still running when Ray shuts down
would start or join another Ray instance).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from rayguard.exceptions import RayGuardError


def wait_for(predicate: Callable[[], Any], timeout_s: float = 120.0, poll_s: float = 0.2,
             what: str = "condition") -> Any:
    """Poll until ``predicate()`` is truthy and return its value; raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RayGuardError(f"wait_for: {what} not reached within {timeout_s:.0f} s")
        time.sleep(poll_s)


class SimulatedCluster:
    """A CPU-less head node plus ``worker_nodes`` nodes of ``cpus_per_node`` CPUs each."""

    def __init__(self, worker_nodes: int = 3, cpus_per_node: int = 1,
                 object_store_bytes: int = 128 * 1024**2) -> None:
        self.worker_nodes = worker_nodes
        self.cpus_per_node = cpus_per_node
        self.object_store_bytes = object_store_bytes
        self.cluster: Any = None
        self.nodes: list[Any] = []
        self._result: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []
        self._saved_address: str | None = None

    def __enter__(self) -> SimulatedCluster:
        import ray
        from ray.cluster_utils import Cluster

        if ray.is_initialized():
            ray.shutdown()
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "object_store_memory": self.object_store_bytes, "include_dashboard": False})
        for _ in range(self.worker_nodes):
            self.add_worker_node()
        ray.init(address=self.cluster.address)
        # A bare ray.init() in this process (e.g. a late one from a background fit) must
        # reach this cluster, never another Ray instance on the machine.
        self._saved_address = os.environ.get("RAY_ADDRESS")
        os.environ["RAY_ADDRESS"] = self.cluster.address
        return self

    def __exit__(self, *exc: object) -> None:
        import ray

        alive = False
        for thread in self._threads:
            thread.join(timeout=0 if exc[0] is not None else 60)
            alive = alive or thread.is_alive()
        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
        self.cluster = None
        if alive:  # keep RAY_ADDRESS on the dead cluster: a late ray.init() fails, attaches nowhere
            if exc[0] is None:
                raise RayGuardError("SimulatedCluster: fit() still running at exit; end the run "
                                    "(e.g. a stop file the training loop checks) before leaving")
            return
        if self._saved_address is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = self._saved_address

    def add_worker_node(self) -> Any:
        """Add a worker node (call from the main thread: Ray installs signal handlers)."""
        node = self.cluster.add_node(num_cpus=self.cpus_per_node,
                                     object_store_memory=self.object_store_bytes)
        self.nodes.append(node)
        return node

    def remove_worker_node(self, index: int = -1) -> str:
        """Kill a worker node and everything on it; returns its node id."""
        node = self.nodes.pop(index)
        node_id = node.node_id
        self.cluster.remove_node(node)
        return node_id

    def fit_in_background(self, trainer: Any) -> threading.Thread:
        """Run ``trainer.fit()`` in a thread, so the main thread can add and remove nodes."""
        def run() -> None:
            try:
                self._result["result"] = trainer.fit()
            except BaseException as e:  # handed to join()
                self._result["error"] = e

        thread = threading.Thread(target=run, name="rayguard-rehearsal-fit", daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def join(self, thread: threading.Thread, timeout_s: float = 300.0) -> Any:
        """Wait for :meth:`fit_in_background`'s run; return its result or raise its error."""
        thread.join(timeout_s)
        if thread.is_alive():
            raise RayGuardError(f"SimulatedCluster.join: fit() still running after {timeout_s:.0f} s")
        if "error" in self._result:
            raise self._result["error"]
        return self._result.get("result")
