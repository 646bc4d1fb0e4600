"""A second Ray cluster on the same machine (a colleague's ``ray start --head`` on a shared
workstation, another CI job) must not touch a RobustTrainer run.

Ray Train's ``PlacementGroupCleaner`` (a detached actor started by the controller) asks the
State API every second whether the controller is alive. With no ``RAY_ADDRESS`` it resolves
"the cluster" the way ``ray.init("auto")`` would: the last ``ray start --head`` recorded in
``<ray temp dir>/ray_current_cluster``. That is the foreign cluster, which has never heard of
the controller, so the cleaner removed the run's placement group and killed a healthy run.
rayguard pins the controller, the cleaner and the workers to the cluster the driver is on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.recorder import make_trainer

RAY_CLI = str(Path(sys.executable).with_name("ray"))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _loop(config):
    import os as _os
    import time as _time

    ctx = rayguard.train.get_context()
    with open(f"{config['out']}/rank{ctx.rank}-attempt{ctx.attempt}.json", "w") as f:
        json.dump({"ray_address": _os.environ.get("RAY_ADDRESS")}, f)
    step, after_foreign = 0, None
    while after_foreign is None or step < after_foreign + config["steps_after"]:
        _time.sleep(0.5)  # the cleaner looks once a second
        if after_foreign is None and _os.path.exists(config["foreign_up"]):
            after_foreign = step
        rayguard.train.report({"step": step})
        step += 1


class ForeignCluster:
    """A second cluster started with ``ray start --head`` (so recorded as this machine's
    current cluster) while the test's run is under way."""

    def __init__(self, temp_root: str) -> None:
        self.temp_root = temp_root
        self.current = Path(temp_root) / "ray" / "ray_current_cluster"
        self.proc: subprocess.Popen | None = None
        self.address: str | None = None

    def start_when(self, ready: Path, up: Path) -> threading.Thread:
        """Start once ``ready`` exists (the run is training); create ``up`` once it is."""
        def run() -> None:
            while not ready.exists():
                time.sleep(0.2)
            gcs, dashboard, client, agent = _free_ports(4)
            self.proc = subprocess.Popen(
                [RAY_CLI, "start", "--head", "--block", f"--port={gcs}", "--num-cpus=0",
                 "--include-dashboard=true", f"--dashboard-port={dashboard}",
                 f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
                 "--disable-usage-stats"],
                env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
            deadline = time.monotonic() + 300
            while not self.current.exists() and self.proc.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.5)
            if self.current.exists():
                self.address = self.current.read_text().strip()
            up.touch()  # also on a failed start: the run ends, the test says why

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        if self.proc is None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:  # `ray start --block` takes ~30 s to stop gracefully; its session goes at once
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture
def own_and_foreign(no_ray, monkeypatch):
    """This test's own ``ray.init(address="local")`` cluster and a foreign one to start
    later, both under a private Ray temp dir so that nothing outside the test sees either."""
    import ray

    temp_root = tempfile.mkdtemp(prefix="rg-", dir="/tmp")  # short: Ray's socket paths
    monkeypatch.setenv("RAY_TMPDIR", temp_root)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    foreign = ForeignCluster(temp_root)
    try:
        (own_dashboard,) = _free_ports(1)
        ray.init(address="local", num_cpus=4, include_dashboard=True,
                 dashboard_port=own_dashboard, object_store_memory=512 * 1024**2)
        yield ray.get_runtime_context().gcs_address, foreign
    finally:
        ray.shutdown()
        foreign.stop()
        shutil.rmtree(temp_root, ignore_errors=True)


def test_a_cluster_started_during_the_run_does_not_remove_its_placement_group(
        own_and_foreign, tmp_path):
    own_address, foreign = own_and_foreign
    out = tmp_path / "out"
    out.mkdir()
    starter = foreign.start_when(ready=out / "rank0-attempt0.json", up=tmp_path / "foreign_up")
    trainer = make_trainer(
        _loop, tmp_path, num_workers=2,
        config={"out": str(out), "foreign_up": str(tmp_path / "foreign_up"), "steps_after": 12},
        guard=rayguard.GuardConfig(health=rayguard.HealthConfig(max_restarts=0)))
    result = trainer.fit()  # unpinned, Ray's cleaner asked the foreign cluster and killed it
    starter.join(timeout=60)

    assert foreign.address is not None and foreign.address != own_address
    kinds = [e["kind"] for e in read_events(result.path)]
    assert "worker_died" not in kinds and kinds[-1] == "finished"
    files = sorted(out.glob("*.json"))
    assert [p.name for p in files] == ["rank0-attempt0.json", "rank1-attempt0.json"]
    assert all(json.loads(p.read_text())["ray_address"] == own_address for p in files)
    assert os.environ.get("RAY_ADDRESS") is None  # the driver's environment is restored
