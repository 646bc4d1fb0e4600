"""Which path a recovery takes (restart, live, replica group, or the fallback with its
reason), as rayguard's callback plans it and Ray Train's real controller executes it: a
replacement of one worker alone through Ray's replica-group path, or a whole-group restart
(rayguard.testing.controller).

Proves the path decisions of tests/ray/test_live_replace.py, tests/ray/test_memory_peer.py,
tests/ray/test_torchft.py and tests/ray/test_scale_workers.py (each test names its twin). Not covered here: the exact weights after a recovery (real DDP
over gloo), the survivors leaving their broken process group and re-forming it with the
replacement (rayguard.train.live), the memory tier's restore, Ray's warm spare process, and
Ray placing the replacement on the placement group's bundle.
"""

from __future__ import annotations

from ray.train import FailureConfig

import rayguard


def live(**health):
    return rayguard.GuardConfig(numa="off", preflight=False, recovery="live",
                                health=rayguard.HealthConfig(**health))


def until(steps, fault):
    """A loop of ``steps`` steps, committed by rank 0 each step, with ``fault(w)`` first."""
    def loop(w):
        if fault(w):
            return
        if w.step + 1 >= steps:
            return w.finish()
        w.report(loss=1.0)
        if w.rank == 0:
            w.commit()
    return loop


def kill_at(rank, step, attempt=0):
    def fault(w):
        if (w.rank, w.step, w.attempt) == (rank, step, attempt):
            w.die("SIGKILL")
            return True
        return False
    return fault


def paths(h):
    return [(e.get("path"), e.get("ranks")) for e in h.events("restart")]


def test_a_killed_worker_is_replaced_alone(harness):
    # tests/ray/test_live_replace.py::test_killed_hung_and_raising_workers_are_replaced_alone
    h = harness(until(10, kill_at(1, 5)), num_workers=2, guard=live()).run()
    assert h.state == "FINISHED" and paths(h) == [("live", [1])]
    first, replaced = h.groups
    assert replaced.replaced == (1,) and replaced.attempt == 1
    assert replaced.pids[0] == first.pids[0] and replaced.pids[1] != first.pids[1]
    assert [e["rank"] for e in h.events("worker_died")] == [1]


def test_an_exception_on_one_rank_replaces_it_alone(harness):
    # tests/ray/test_live_replace.py::test_killed_hung_and_raising_workers_are_replaced_alone (attempt 3)
    def raise_once(w):
        if (w.rank, w.step, w.attempt) == (1, 6, 0):
            raise RuntimeError("injected")
        return False

    h = harness(until(10, raise_once), num_workers=2, guard=live()).run()
    assert h.state == "FINISHED" and paths(h) == [("live", [1])]
    (died,) = h.events("worker_died")
    assert died["rank"] == 1 and died["error_type"] == "builtins.RuntimeError"


def test_the_middle_rank_of_three_is_replaced_alone(harness):
    # tests/ray/test_live_replace.py::test_the_middle_rank_of_three_is_replaced_alone
    h = harness(until(8, kill_at(1, 3)), num_workers=3, guard=live(),
                failure_config=FailureConfig(max_failures=2, controller_failure_limit=0)).run()
    assert h.state == "FINISHED" and paths(h) == [("live", [1])]
    first, replaced = h.groups
    assert [replaced.pids[r] == first.pids[r] for r in range(3)] == [True, False, True]


def test_sixteen_workers_a_kill_is_replaced_alone(harness):
    # tests/ray/test_scale_workers.py::test_sixteen_workers_a_kill_is_replaced_alone (its path)
    nodes = {f"n{i}": 4 for i in range(4)}
    h = harness(until(14, kill_at(11, 8)), num_workers=16, nodes=nodes, guard=live(),
                failure_config=FailureConfig(max_failures=3, controller_failure_limit=0)).run()
    assert h.state == "FINISHED" and paths(h) == [("live", [11])]
    first, replaced = h.groups
    kept = [r for r in range(16) if replaced.pids[r] == first.pids[r]]
    assert kept == [r for r in range(16) if r != 11]
    assert replaced.nodes == first.nodes  # the replacement is on the lost rank's node
    assert [e["rank"] for e in h.events("worker_died")] == [11]


def test_a_lost_node_falls_back_to_a_group_restart(harness):
    # tests/ray/test_memory_peer.py::test_a_lost_node_restarts_the_group_and_its_rank_restores_from_the_peer_copy
    def lose_rank_1s_node(w):
        if (w.rank, w.step, w.attempt) == (0, 5, 0):
            h.lose_node(h.groups[0].nodes[1])
        return False

    h = harness(until(12, lose_rank_1s_node), num_workers=2, guard=live(),
                nodes={"n1": 1, "n2": 1, "n3": 1},
                failure_config=FailureConfig(max_failures=3, controller_failure_limit=0))
    h.run()
    assert h.state == "FINISHED"
    (restart,) = h.events("restart")
    assert restart.get("path") is None and "lost" in restart["fallback"]
    assert h.node("n2")[:12] in restart["fallback"]
    assert [g.nodes for g in h.groups] == [("n1", "n2"), ("n1", "n3")]
    assert h.groups[1].replaced == () and h.groups[1].pids[0] != h.groups[0].pids[0]
    assert [e["rank"] for e in h.events("worker_died")] == [1]  # the survivor is not dead


def test_a_replacement_that_dies_before_its_first_commit_falls_back_to_one_restart(harness):
    # attempts 2-4 of tests/ray/test_live_replace.py::
    # test_kills_during_live_recoveries_release_the_survivor_or_fall_back_to_one_restart
    def twice(w):
        if (w.rank, w.attempt) == (1, 1):  # the replacement dies at once
            w.die("SIGKILL")
            return True
        if (w.rank, w.attempt) == (0, 1):  # the survivor waits to rejoin: no commit
            return True
        return kill_at(1, 5)(w)

    h = harness(until(10, twice), num_workers=2, guard=live()).run()
    assert h.state == "FINISHED"
    assert paths(h) == [("live", [1]), (None, None)]  # never "replaced alone" twice
    assert "live attempt 1" in h.events("restart")[1]["fallback"]
    assert [g.attempt for g in h.groups] == [0, 1, 2] and h.groups[2].replaced == ()
    assert len(set(h.groups[2].pids) & set(h.groups[1].pids)) == 0  # the whole group anew


def test_a_crash_loop_under_live_recovery_ends_the_run(harness):
    # tests/ray/test_live_replace.py::test_a_crash_loop_under_live_recovery_ends_the_run
    def bug_at_step_3(w):
        if w.rank == 1 and w.step >= 2:
            raise ValueError("my bug at step 3")
        if w.rank == 0 and w.step >= 2:  # blocked in the collective with rank 1
            return True
        return False

    h = harness(until(8, bug_at_step_3), num_workers=2, guard=live()).run()
    assert h.state == "ERRORED" and "crash_loop" in h.kinds()
    assert paths(h) == [("live", [1])]
    assert [e["rank"] for e in h.events("worker_died")] == [1, 1]


def test_a_failure_after_the_live_attempt_committed_is_a_new_loss(harness):
    # the live attempt committed (it formed): a later loss is replaced alone again
    def two_kills(w):
        return kill_at(1, 3)(w) or kill_at(1, 7, attempt=1)(w)

    h = harness(until(10, two_kills), num_workers=2, guard=live()).run()
    assert h.state == "FINISHED" and paths(h) == [("live", [1]), ("live", [1])]
    assert [g.attempt for g in h.groups] == [0, 1, 2] and h.groups[2].replaced == (1,)


def test_replica_groups_replace_the_failed_rank_alone_without_a_new_attempt(harness):
    # tests/ray/test_torchft.py::test_rank1_killed_then_failing_is_replaced_alone_twice_rank0_keeps_its_process (its path)
    from ray.train.v2.torch.torchft_config import TorchftConfig

    h = harness(until(10, kill_at(1, 5)), num_workers=2,
                torch_config=TorchftConfig(lighthouse_kwargs={"min_replicas": 2}, backend="gloo"))
    h.run()
    assert h.state == "FINISHED" and paths(h) == [("replica_group", [1])]
    first, replaced = h.groups
    assert replaced.replaced == (1,) and replaced.attempt == first.attempt == 0
    assert replaced.pids[0] == first.pids[0] and replaced.pids[1] != first.pids[1]
    assert h.kinds().count("attempt_started") == 1  # no worker-group restart


def test_live_recovery_is_the_default(harness):
    h = harness(until(10, kill_at(1, 5)), num_workers=2).run()
    assert h.state == "FINISHED" and paths(h) == [("live", [1])]


def test_without_live_recovery_every_failure_restarts_the_group(harness):
    restart = rayguard.GuardConfig(numa="off", preflight=False, recovery="restart")
    h = harness(until(10, kill_at(1, 5)), num_workers=2, guard=restart).run()
    assert h.state == "FINISHED" and paths(h) == [(None, None)]
    assert "fallback" not in h.events("restart")[0]
    assert len(h.groups) == 2 and h.groups[1].replaced == ()


def test_every_rank_failing_under_live_recovery_restarts_and_says_why(harness):
    def both(w):
        if w.step == 3 and w.attempt == 0:
            w.die("SIGKILL")
            return True
        return False

    h = harness(until(6, both), num_workers=2, guard=live()).run()
    assert h.state == "FINISHED" and paths(h) == [(None, None)]
    assert "every rank failed" in h.events("restart")[0]["fallback"]


def test_a_replica_group_replacement_that_fails_is_not_given_its_predecessors_cause(harness):
    """A replica-group replacement runs in the attempt its predecessor ran in: the mark the
    watchdog left when it killed the predecessor (``killed by rayguard: stall``) is not the
    cause of the replacement's own failure, an exception of the loop."""
    from ray.train.v2.torch.torchft_config import TorchftConfig

    hung, raised = [], []

    def loop(w):
        if w.rank == 1 and w.step == 3 and not hung:
            hung.append(w)
            return w.hang()  # the first process of rank 1 stalls: the watchdog kills it
        if w.rank == 1 and hung and w is not hung[0] and w.step == 2 and not raised:
            raised.append(w)
            raise ValueError("my bug")  # its replacement raises, once
        if w.step + 1 >= 10:
            return w.finish()
        w.report(loss=1.0)

    h = harness(loop, num_workers=2, guard=live(stall_timeout_s=2.0),
                failure_config=FailureConfig(max_failures=3),
                torch_config=TorchftConfig(lighthouse_kwargs={"min_replicas": 2}, backend="gloo"))
    h.run()
    died = h.events("worker_died")
    assert [(e["rank"], e["failure"]) for e in died] == [(1, "hang"), (1, "error")], died
    assert "killed by rayguard: stall" in died[0]["detail"], died[0]
    assert "my bug" in died[1]["detail"] and "killed by rayguard" not in died[1]["detail"], died[1]
    assert paths(h) == [("replica_group", [1])] * 2 and h.state == "FINISHED"
