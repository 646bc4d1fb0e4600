"""A bad node is fenced off, on a simulated two-machine cluster.

The cluster starts with one worker node (2 CPUs: room for the whole 2-worker group) on
which every worker SIGKILLs itself as soon as it starts, as the OS kills a worker on a
broken machine. After ``HealthConfig(quarantine_after=2)`` attempts the node is quarantined
(``node_quarantined``), and the fixed-size run, which no longer fits, waits with a
``placement_wait`` message instead of failing. A second node is added: the run starts there,
finishes, and no worker ever runs on the quarantined node again. The quarantine is in the run
directory's file, which ``rayguard quarantine list`` reads.
"""

from __future__ import annotations

import json
import os

import pytest
from ray.train import FailureConfig, RunConfig, ScalingConfig

import rayguard
from rayguard.cli import main as rayguard_main
from rayguard.events import read as read_events
from rayguard.health import quarantine_file
from rayguard.testing.cluster import SimulatedCluster, wait_for


def _loop(config: dict) -> None:
    import signal
    import time

    ctx = rayguard.train.get_context()
    with open(os.path.join(config["out"], "starts.jsonl"), "a") as f:
        f.write(json.dumps({"attempt": ctx.attempt, "rank": ctx.rank, "node": ctx.node_id}) + "\n")
    if ctx.node_id == config["bad_node"]:
        os.kill(os.getpid(), signal.SIGKILL)  # a broken machine: the worker is killed there
    for step in range(3):
        time.sleep(0.05)
        rayguard.train.report({"loss": 1.0 / (step + 1)}, step=step)


def _events(run_dir: str) -> list[dict]:
    try:
        return read_events(run_dir)
    except (OSError, ValueError):
        return []


@pytest.mark.timeout(600)
def test_a_node_whose_workers_keep_dying_is_quarantined_and_the_run_moves(no_ray, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    run_dir = str(tmp_path / "fence")
    with SimulatedCluster(worker_nodes=1, cpus_per_node=2) as cluster:
        bad = cluster.nodes[0].node_id
        trainer = rayguard.RobustTrainer(
            _loop, train_loop_config={"out": str(out), "bad_node": bad},
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(storage_path=str(tmp_path), name="fence",
                                 failure_config=FailureConfig(max_failures=3)),
            guard_config=rayguard.GuardConfig(
                numa="off", preflight=False,
                health=rayguard.HealthConfig(quarantine_after=2)))
        thread = cluster.fit_in_background(trainer)
        waits = wait_for(lambda: [e for e in _events(run_dir) if e["kind"] == "placement_wait"],
                         timeout_s=300, what="the run waiting for an admitted node")
        cluster.add_worker_node()
        result = cluster.join(thread, timeout_s=300)

    events = read_events(result.path)
    fenced = [e for e in events if e["kind"] == "node_quarantined"]
    assert len(fenced) == 1, [e["detail"] for e in fenced]
    q = fenced[0]
    # two failed attempts: 0 and the next (1, or 2 when live recovery opened an attempt for
    # the first dead worker before the second was seen, then restarted the group)
    first, second = q["attempts"]
    assert q["node"] == bad and q["reason"] == "killed" and first == 0 and second in (1, 2)
    assert {f["attempt"] for f in q["failures"]} == {first, second} and q["quarantined_nodes"] == 1
    # one clear message while it waited: what is quarantined, why, how to lift, that it waits
    detail = waits[0]["detail"]
    assert bad[:12] in detail and "killed" in detail and "quarantine lift" in detail
    assert "Waiting for capacity" in detail and waits[0]["room"] == 0
    assert events[-1]["kind"] == "finished"

    starts = [json.loads(line) for line in (out / "starts.jsonl").read_text().splitlines()]
    last = max(s["attempt"] for s in starts)
    assert {s["node"] for s in starts if s["attempt"] <= second} == {bad}
    assert all(s["node"] != bad for s in starts if s["attempt"] > second), starts
    assert len([s for s in starts if s["attempt"] == last]) == 2 and last > second

    state = quarantine_file.read(quarantine_file.quarantine_path(result.path))
    assert list(state["nodes"]) == [bad] and state["nodes"][bad]["reason"] == "killed"
    capsys.readouterr()
    assert rayguard_main(["quarantine", "list", result.path]) == 0
    assert bad[:12] in capsys.readouterr().out
