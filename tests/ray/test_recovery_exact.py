"""Failure recovery on a real local cluster (2 CPU workers, DDP on gloo): a run with injected
faults finishes with weights bitwise equal to a run without faults, and its event log tells,
attempt by attempt, what happened.

One fit per checkpoint mode carries its faults in sequence, one per attempt (``attempt=`` in
the fault spec), each at a later step than the one before, so that each attempt's failure and
the next attempt's restore are read from the log on their own: in sync mode a kill of rank 1, a
kill of rank 0 inside the restore itself, a hang of rank 0 (the stall bound), a NaN and an
exception; in async mode a kill of rank 0 while a checkpoint may be persisting, and a NaN.
Where each fault's decision is made (the cause, the restore's checkpoint, the crash-loop rule)
the unit tests prove it over every case; these fits prove that the whole path, Ray included,
resumes exactly after each.

These are the whole-group restart's fits (``GuardConfig(recovery="restart")``): under live
recovery, the default, the same exactness is proved by ``test_live_replace.py`` (a rank
replaced alone), ``test_rollback_live.py`` (a NaN rolled back in place) and
``test_scale_workers.py`` (a kill at 16 workers), each bitwise against a clean run. All of them
compare with the same fault-free run of :func:`rayguard.testing.exact_loop.exact_loop`, made
once per pytest run (``tests/conftest.py::exact_clean``; this file had a fault-free fit of its
own, of the same loop)."""

from __future__ import annotations

from collections import defaultdict

import pytest

import rayguard
from rayguard.testing.exact_loop import fit_exact, same_weights

STEPS = 10  # the steps of the session's fault-free run (tests/conftest.py, exact_clean)
STALL_S = 5.0  # the hang's cost: still many of these steps (each a sync checkpoint)


def _fit(tmp_path, name, faults, mode):
    """:func:`exact_loop` for ``STEPS`` under the whole-group restart, ``faults`` one
    per attempt: rank 0's final weights and the run's events."""
    health = rayguard.HealthConfig(stall_timeout_s=STALL_S, max_restarts=len(faults))
    weights, events, _ = fit_exact(tmp_path, name, steps=STEPS, faults=";".join(faults),
                                   recovery="restart", mode=mode, health=health)
    return weights, events


def _attempts(events):
    """The run's events by attempt (attempt 0 first)."""
    by = defaultdict(list)
    for e in events:
        if e.get("attempt") is not None:
            by[e["attempt"]].append(e)
    return [by[a] for a in range(max(by) + 1)]


def _of(events, kind, **fields):
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in fields.items())]


def _restored_step(events):
    """The step the attempt restored through ``load_state()`` (None: it restored nothing;
    the loop also asks ``ray.train.get_checkpoint()``, whose answer is logged as a
    ``restored`` event of ``source`` ``ray.train.report``: Ray's own view, not counted)."""
    restored = [e for e in _of(events, "restored") if e.get("source") != "ray.train.report"]
    assert len(restored) <= 1, restored
    return restored[0]["step"] if restored else None


def _assert_ended(events, *, cause, rank, died):
    """The attempt ended in a restart for ``cause``, rank ``rank`` failing with ``died`` (in
    its one-line reason)."""
    assert [e["cause"] for e in _of(events, "restart")] == [cause]
    failed = _of(events, "worker_died", rank=rank)
    assert failed and died in failed[0]["detail"], failed


def _assert_injected(events, *, kind, rank):
    """An injected fault ended the attempt, and its ``worker_died`` says so on one line."""
    _assert_ended(events, cause="error" if kind == "raise" else kind, rank=rank,
                  died=f"injected {kind}")
    detail = _of(events, "worker_died", rank=rank)[0]["detail"]
    assert "GuardConfig(faults=...)" in detail and "\n" not in detail


def _assert_hang(events, *, rank, step):
    """The stall bound caught rank ``rank`` stuck after ``step``; its stacks show where."""
    _assert_ended(events, cause="hang", rank=rank, died="killed by rayguard: stall")
    stalls = _of(events, "stall_detected")
    assert stalls and stalls[0]["rank"] == rank and stalls[0]["step"] == step, stalls
    with open(stalls[0]["stacks"]) as f:
        assert "_hang" in f.read()  # the stack dump shows where it was stuck


def _assert_nan(events, *, step):
    """The NaN at ``step`` ended the attempt before a checkpoint of that step committed."""
    _assert_ended(events, cause="nan", rank=0, died="NonFiniteMetricError")
    assert [e["step"] for e in _of(events, "nan_detected")] == [step]
    assert not _of(events, "checkpoint_committed", step=step)


@pytest.mark.compat  # also run on the oldest supported Ray: a kill that resumes exactly
def test_sync_faults_in_sequence_resume_exactly(ray_local_module, exact_clean, tmp_path):
    faults = ("kill:rank=1,step=3,attempt=0",   # attempt 0
              "kill:rank=0,at=load,attempt=1",  # attempt 1: inside the restore itself
              "hang:rank=0,step=5,attempt=2",   # attempt 2: rank 0 stuck in step 5
              "nan:rank=0,step=7,attempt=3",
              "raise:rank=0,step=9,attempt=4")
    weights, events = _fit(tmp_path, "sync", faults, mode="sync")
    assert same_weights(weights, exact_clean)
    a = _attempts(events)
    assert len(a) == 6 and [e["kind"] for e in a[5]][-1] == "finished"
    _assert_injected(a[0], kind="kill", rank=1)
    assert _restored_step(a[0]) is None
    _assert_injected(a[1], kind="kill", rank=0)
    assert _restored_step(a[1]) is None  # killed before it restored
    _assert_hang(a[2], rank=0, step=4)
    assert _restored_step(a[2]) == 2  # the checkpoint before the kill, once the restore lived
    _assert_nan(a[3], step=7)
    assert _restored_step(a[3]) == 4  # the last one before the hang
    _assert_injected(a[4], kind="raise", rank=0)
    assert _restored_step(a[4]) == 6  # the one before the NaN
    assert _restored_step(a[5]) == 8
    assert not _of(a[5], "restart")


# not in the oldest-Ray set: the sync fit above is its kill that resumes exactly, and the
# async writer is rayguard's own thread behind the same ray.train.report
def test_async_faults_in_sequence_resume_exactly(ray_local_module, exact_clean, tmp_path):
    # rank 0, the writer of the replicated state, killed while its step-2 checkpoint may still
    # be persisting in the background (a hang's end is the same SIGKILL: the sync fit's)
    faults = ("kill:rank=0,step=3,attempt=0",
              "nan:rank=0,step=7,attempt=1")
    weights, events = _fit(tmp_path, "async", faults, mode="async")
    assert same_weights(weights, exact_clean)
    a = _attempts(events)
    assert len(a) == 3 and [e["kind"] for e in a[2]][-1] == "finished"
    _assert_injected(a[0], kind="kill", rank=0)
    # the checkpoint before the kill: step 2's may still have been persisting
    assert _restored_step(a[1]) in (1, 2)
    _assert_nan(a[1], step=7)
    assert _restored_step(a[2]) == 6  # the one before the NaN: no NaN step was committed
    assert not _of(a[2], "restart")
