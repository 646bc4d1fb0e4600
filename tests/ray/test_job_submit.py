"""End to end, as a user does it: start a Ray head node with the job server, submit the example
job with ``ray job submit --working-dir . --runtime-env cluster-configs/job/runtime_env.yaml``,
wait for it, check it succeeded and that its logs show training progress, stop the head.

Other Ray clusters run on this machine, so the head gets its own temp dir and free ports,
and teardown ends only the processes of this head (``ray stop`` has no way to pick one
cluster: it would stop them all). They are found by the temp dir in their command line, plus
their descendants (job drivers run under a job supervisor), and checked gone afterwards.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: ray, python
PROGRESS = re.compile(r"step (\d+) loss ([0-9.]+(?:e-?\d+)?)")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def processes_of(temp_dir: str) -> list[psutil.Process]:
    """Processes of the head started with ``temp_dir``, and everything they started."""
    roots = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_dir in part for part in p.info["cmdline"] or ()):
                roots.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    found = {p.pid: p for p in roots}
    for p in roots:
        try:
            found.update({c.pid: c for c in p.children(recursive=True)})
        except psutil.NoSuchProcess:
            continue
    found.pop(os.getpid(), None)
    return list(found.values())


def stop_head(temp_dir: str, grace_s: float = 3.0) -> list[str]:
    """SIGTERM, then SIGKILL, the head's processes; returns what survived (should be [])."""
    for _ in range(3):  # raylets respawn nothing once the GCS is gone, but be thorough
        procs = processes_of(temp_dir)
        if not procs:
            return []
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=grace_s)
    return [" ".join(p.cmdline()[:3]) for p in processes_of(temp_dir) if p.is_running()]


@dataclass
class Head:
    temp_dir: str
    dashboard_url: str
    env: dict[str, str]


def head_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # never fall back on another cluster
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # `python` in the entrypoint
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray 2.60 turns token auth on for `ray start` when ~/.ray/auth_token exists (any local
    # ray.init() writes one), but the `ray job` CLI only sends it with RAY_AUTH_MODE=token.
    # Say the mode explicitly, for the head and the CLI alike; the head listens on 127.0.0.1.
    env["RAY_AUTH_MODE"] = "disabled"
    return env


@pytest.fixture
def ray_head() -> Iterator[Head]:
    # Short path: Ray's unix sockets live under it (107-byte limit).
    temp_dir = tempfile.mkdtemp(prefix="rgjob-", dir="/tmp")
    gcs, dash, client, agent, agent_grpc, env_agent, metrics = free_ports(7)
    env = head_env()
    cmd = [
        str(BIN / "ray"), "start", "--head", f"--port={gcs}", "--node-ip-address=127.0.0.1",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
        f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={env_agent}",
        f"--metrics-export-port={metrics}", "--num-cpus=4", "--num-gpus=0",
        f"--object-store-memory={256 * 1024**2}", f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    try:
        started = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        assert started.returncode == 0, f"ray start failed:\n{started.stdout}\n{started.stderr}"
        url = f"http://127.0.0.1:{dash}"
        wait_for_job_server(url)
        yield Head(temp_dir=temp_dir, dashboard_url=url, env=env)
    finally:
        survivors = stop_head(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not survivors, f"head processes survived teardown: {survivors}"


def wait_for_job_server(url: str, timeout_s: float = 120.0) -> None:
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            JobSubmissionClient(url).list_jobs()
            return
        except Exception as e:  # dashboard still starting
            last = e
            time.sleep(1.0)
    raise AssertionError(f"job server at {url} did not come up: {last}")


def test_ray_job_submit_runs_the_example_job(ray_head: Head) -> None:
    from ray.job_submission import JobStatus, JobSubmissionClient

    submission_id = f"rayguard-test-{uuid.uuid4().hex[:8]}"
    steps = 12
    cmd = [
        str(BIN / "ray"), "job", "submit", "--address", ray_head.dashboard_url,
        "--submission-id", submission_id, "--working-dir", ".",
        "--runtime-env", "cluster-configs/job/runtime_env.yaml",
        "--", "python", "examples/submit_job.py", "--num-workers", "2",
        "--steps", str(steps), "--storage-path", os.path.join(ray_head.temp_dir, "results"),
    ]
    done = subprocess.run(cmd, cwd=REPO, env=ray_head.env, capture_output=True, text=True,
                          timeout=360)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"ray job submit exited {done.returncode}:\n{out[-6000:]}"

    client = JobSubmissionClient(ray_head.dashboard_url)
    assert client.get_job_status(submission_id) == JobStatus.SUCCEEDED
    logs = client.get_job_logs(submission_id)
    assert "rayguard job finished" in logs, logs[-4000:]
    progress = {int(s): float(v) for s, v in PROGRESS.findall(logs)}
    assert set(progress) == set(range(steps)), f"progress lines: {sorted(progress)}\n{logs[-4000:]}"
    assert progress[steps - 1] < progress[0], f"loss did not fall: {progress}"
    # No checkpoint is taken by default, and the summary still shows the last loss (it said
    # "final loss nan" when it read Result.metrics, which only checkpointed reports fill).
    final = re.search(r"rayguard job finished: .*final loss ([0-9.]+)", logs)
    assert final and float(final.group(1)) == pytest.approx(progress[steps - 1], abs=1e-4), logs[-2000:]
    # The submit command streamed the same logs to the user.
    assert "rayguard job finished" in out
