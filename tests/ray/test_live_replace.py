"""Live recovery (``GuardConfig(recovery="live")``) on a real local cluster: a killed or
crashed worker is replaced alone, the others keep their processes and rejoin it, and the
weights end bitwise equal to a run without faults (2 CPU workers, DDP on gloo)."""

from __future__ import annotations

import os

import pytest

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.exact_loop import fit_exact, same_weights
from rayguard.testing.recorder import make_trainer

STEPS = 10  # the steps of the session's fault-free run (tests/conftest.py, exact_clean)


def _fit(tmp_path, name, faults=None, recovery="live", memory_tier=False, num_workers=2,
         **run_kwargs):
    return fit_exact(tmp_path, name, steps=STEPS, faults=faults, recovery=recovery,
                     memory_tier=memory_tier, num_workers=num_workers, **run_kwargs)


@pytest.fixture(scope="module")
def clean(ray_local_module, exact_clean):
    """The fault-free run's weights (one run for this file, test_rollback_live.py and
    test_recovery_exact.py)."""
    return exact_clean


@pytest.fixture
def planted_spares_file():
    """A plain file planted where the node's spares folder goes (another user of the node
    can do that in the shared /tmp): the spare is off, the run is not."""
    from rayguard._ray.spare_dir import base_dir

    planted = base_dir()
    assert not os.path.lexists(planted) or os.path.isdir(planted)
    moved = planted + ".moved-by-test" if os.path.lexists(planted) else None
    if moved:
        os.rename(planted, moved)
    with open(planted, "w"):
        pass
    try:
        yield planted
    finally:
        os.unlink(planted)
        if moved:
            os.rename(moved, planted)


@pytest.mark.compat  # Ray's replica-group replacement is an internal: the oldest Ray too
def test_killed_hung_and_raising_workers_are_replaced_alone(clean, planted_spares_file,
                                                            tmp_path):
    """Four faults in one run, one per attempt, with the memory tier on and a plain file
    planted where the node's spares folder goes: rank 1 killed at step 3, rank 0 killed at
    step 7, rank 1 asleep in step 8 with the GIL released (its watchdog ends it after the
    stall bound; rank 0, waiting in the all-reduce, rejoins), then an exception on rank 1 at
    step 9. Each is replaced alone while the other keeps its process, every rank loads the
    last commit (from the node's memory copy), and the weights end as without the faults.
    (These were two fits: the kills and hang, and the exception with the planted file.)"""
    weights, events, entered = _fit(
        tmp_path, "kills",
        faults="kill:rank=1,step=3;kill:rank=0,step=7,attempt=1;hang:rank=1,step=8,attempt=2;"
               "raise:rank=1,step=9,attempt=3",
        memory_tier=True, settle_memory=True,  # each copy registered before the next fault
        health=rayguard.HealthConfig(stall_timeout_s=3, startup_timeout_s=120, max_restarts=4))
    assert same_weights(weights, clean)
    kinds = [e["kind"] for e in events]
    assert kinds.count("worker_died") == 4 and kinds[-1] == "finished", kinds
    restarts = [e for e in events if e["kind"] == "restart"]
    assert [(e["path"], e["ranks"], e["cause"]) for e in restarts][:3] == [
        ("live", [1], "kill"), ("live", [0], "kill"), ("live", [1], "hang")], restarts
    assert [(e["path"], e["ranks"]) for e in restarts][3:] == [("live", [1])], restarts
    assert [e["rank"] for e in events if e["kind"] == "stall_detected"] == [1]
    died = [e for e in events if e["kind"] == "worker_died"]
    assert [e["rank"] for e in died] == [1, 0, 1, 1]
    assert died[3]["error_type"].endswith("InjectedFault"), died[3]
    started = [e for e in events if e["kind"] == "attempt_started"]
    assert [(e["attempt"], e.get("path")) for e in started][1:] == [
        (1, "live"), (2, "live"), (3, "live"), (4, "live")]
    by_rank = {r: [e for e in entered if e["rank"] == r] for r in (0, 1)}
    assert [[e["attempt"] for e in by_rank[r]] for r in (0, 1)] == [[0, 1, 2, 3, 4]] * 2, entered
    pids = {r: [e["pid"] for e in by_rank[r]] for r in (0, 1)}
    # rank 1 replaced at attempts 1, 3 and 4, kept at 2; rank 0 replaced at 2, kept otherwise
    assert pids[1][0] != pids[1][1] == pids[1][2] != pids[1][3] != pids[1][4], pids
    assert pids[0][0] == pids[0][1] != pids[0][2] == pids[0][3] == pids[0][4], pids
    for attempt, step, ckpt in ((1, 2, "checkpoint_000000002_a0"),
                                (2, 6, "checkpoint_000000006_a1"),
                                (3, 7, "checkpoint_000000007_a2"),
                                (4, 8, "checkpoint_000000008_a3")):
        for r in (0, 1):
            e = by_rank[r][attempt]
            assert e["loaded_step"] == step and e["ray_checkpoint"] == ckpt, (r, e)
    loaded = [e for e in events if e["kind"] == "restored" and "tier" in e]
    assert [(e["attempt"], e["tier"]) for e in loaded] == [
        (a, "memory") for a in (1, 2, 3, 4)], loaded
    rejoined = [e for e in events if e["kind"] == "rejoined" and e["attempt"] == 4]
    replacement = {e["rank"]: e["replacement"] for e in rejoined}
    assert replacement == {0: False, 1: True}, rejoined
    (joined,) = [e for e in rejoined if e["replacement"]]
    assert {"imports_s", "setup_s", "rendezvous_s"} <= set(joined["phases"]), joined
    from rayguard.observe.goodput import goodput

    assert goodput(events).replayed_steps <= 4  # at most the steps the faults cut short


def test_kills_during_live_recoveries_release_the_survivor_or_fall_back_to_one_restart(
        clean, tmp_path):
    """Two live recoveries that fail, one after the other (these were two fits). Rank 1
    killed at step 3; its replacement killed again while it loads the state (attempt 1): the
    survivor, waiting in the load, is released and either rejoins a second replacement or,
    the documented fallback, the group restarts (attempt 2). Then rank 1 killed at step 6;
    its replacement dies in its set-up, before the live attempt 3 formed: the live recovery
    that fails falls back to one restart of the whole group (attempt 4, never another
    "replaced alone" round). The run still ends with the exact weights."""
    weights, events, entered = _fit(
        tmp_path, "twice",
        faults="kill:rank=1,step=3,attempt=0;kill:rank=1,at=load,attempt=1;"
               "kill:rank=1,step=6,attempt=2;kill:rank=1,at=setup,attempt=3",
        health=rayguard.HealthConfig(max_restarts=4))
    assert same_weights(weights, clean)
    kinds = [e["kind"] for e in events]
    assert kinds.count("worker_died") == 4 and kinds[-1] == "finished", kinds
    injected = [e for e in events if e["kind"] == "fault_injected"]
    assert [(e["rank"], e["attempt"]) for e in injected] == [(1, a) for a in range(4)], injected
    restarts = [e for e in events if e["kind"] == "restart"]
    paths = [e.get("path") for e in restarts]
    assert paths[:1] == ["live"] and paths[1] in ("live", None), restarts  # live, or fallback
    assert paths[2:] == ["live", None], restarts
    assert "live attempt 3" in restarts[3]["fallback"], restarts[3]
    started = [e["attempt"] for e in events if e["kind"] == "attempt_started"]
    assert 3 not in started and started[-1] == 4, started  # attempt 3 never formed
    survivor = [(e["attempt"], e["pid"]) for e in entered if e["rank"] == 0]
    before = {pid for attempt, pid in survivor if attempt <= 2}
    last = {pid for attempt, pid in survivor if attempt == 4}
    assert len(last) == 1 and not last & before, entered  # the whole group started again
    if paths[1] == "live":  # released from the load, rank 0 kept its process until then
        assert len(before) == 1, entered


def spare_loop(config):
    """Rank 1 waits for its node's warm spare to be up, notes its pid, then dies at step 3."""
    import json
    import os
    import signal
    import time

    from rayguard._ray.spare import idle_spares

    ctx = rayguard.train.get_context()
    state = rayguard.train.load_state()
    start = 0 if state is None else state["step"] + 1
    with open(config["log"], "a") as f:
        f.write(json.dumps({"rank": ctx.rank, "pid": os.getpid(), "start": start}) + "\n")
    for step in range(start, 6):
        if step == 3 and ctx.rank == 1 and ctx.attempt == 0:
            deadline = time.monotonic() + 60
            while not idle_spares() and time.monotonic() < deadline:
                time.sleep(0.2)
            with open(config["log"], "a") as f:
                f.write(json.dumps({"spares": idle_spares()}) + "\n")
            os.kill(os.getpid(), signal.SIGKILL)
        rayguard.train.report({"loss": 1.0 / (step + 1), "step": step}, state={"step": step})


@pytest.mark.compat  # the raylet's prestart is a Ray internal: the oldest Ray too
def test_the_replacement_starts_in_the_nodes_warm_spare(ray_local_module, tmp_path):
    import json

    from rayguard._ray.spare import SPARE_DIR_ENV, idle_spares

    log = tmp_path / "spare.jsonl"
    trainer = make_trainer(spare_loop, tmp_path, name="spare", config={"log": str(log)},
                           guard=rayguard.GuardConfig(
                               numa="off", recovery="live",
                               health=rayguard.HealthConfig(live_spare_after_s=0)))
    assert trainer.fit().error is None
    rows = [json.loads(line) for line in log.read_text().splitlines() if line]
    (spares,) = [r["spares"] for r in rows if "spares" in r]
    assert len(spares) == 1, rows  # one per node, not one per rank
    replaced = [r for r in rows if r.get("rank") == 1]
    assert [r["start"] for r in replaced] == [0, 3] and replaced[1]["pid"] == spares[0], rows
    events = read_events(trainer.run_dir)
    (joined,) = [e for e in events if e["kind"] == "rejoined" and e["replacement"]]
    assert joined["spare"] is True and joined["phases"]["process_start_s"] == 0.0, joined
    assert "warm spare" in joined["detail"]
    # The run's end ends the spare the new attempt started (none is left behind).
    directory = trainer._rc.worker_runtime_env["env_vars"][SPARE_DIR_ENV]
    assert idle_spares(directory) == []
