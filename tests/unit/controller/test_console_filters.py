"""Ray's console lines about a failure rayguard handles are dropped, a user's own error's
traceback is kept, and nothing is dropped at RAYGUARD_LOG_LEVEL=DEBUG. Real loggers, no Ray."""

from __future__ import annotations

import logging

import pytest

from rayguard._ray import console

PEER = ("Error in training function:\nTraceback (most recent call last):\n  File \"x.py\", "
        "line 1, in loop\nRuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed "
        "by peer [127.0.0.1]:21207. This is typically caused by a remote worker crashing.\n")
BUG = ("Error in training function:\nTraceback (most recent call last):\n  File \"x.py\", "
       "line 1, in loop\nValueError: my bug at this step\n")


def test_a_peers_loss_reads_as_such_and_a_bug_does_not():
    assert console.peer_loss(PEER)
    assert not console.peer_loss(BUG)


@pytest.fixture
def captured(monkeypatch):
    monkeypatch.delenv("RAYGUARD_LOG_LEVEL", raising=False)
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    loggers = [logging.getLogger(console.TRAIN_FN_LOGGER), logging.getLogger(console.BACKEND_LOGGER)]
    saved = [(lg, list(lg.filters), lg.propagate) for lg in loggers]
    handler = Keep()
    for lg in loggers:
        lg.filters.clear()
        lg.addHandler(handler)
        lg.propagate = False
    yield seen
    for lg, filters, propagate in saved:
        lg.removeHandler(handler)
        lg.filters[:] = filters
        lg.propagate = propagate


def test_the_filters_drop_only_what_rayguard_says_itself(captured):
    console.quiet_worker()
    console.quiet_controller()
    console.quiet_worker()  # installed once
    train_fn = logging.getLogger(console.TRAIN_FN_LOGGER)
    backend = logging.getLogger(console.BACKEND_LOGGER)
    assert len(train_fn.filters) == 1
    train_fn.error(PEER)
    train_fn.error(BUG)
    backend.warning("Graceful shutdown of backend failed. This is expected if one of the "
                    "workers has crashed.")
    backend.warning("something else")
    assert captured == [BUG, "something else"]


def test_debug_keeps_everything(captured, monkeypatch):
    monkeypatch.setenv("RAYGUARD_LOG_LEVEL", "DEBUG")
    console.quiet_worker()
    assert not logging.getLogger(console.TRAIN_FN_LOGGER).filters


def test_rays_dump_of_a_retried_failure_is_left_to_debug(monkeypatch):
    from ray.train import FailureConfig

    from rayguard._ray.train import DefaultFailurePolicy, FailureDecision
    from rayguard.controller.failure_policy import GuardFailurePolicy

    logged = []
    monkeypatch.setattr(DefaultFailurePolicy, "_log_decision",  # absent before Ray 2.60: set
                        lambda self, decision, *args: logged.append(decision), raising=False)
    monkeypatch.delenv("RAYGUARD_LOG_LEVEL", raising=False)
    policy = GuardFailurePolicy(FailureConfig(max_failures=3))
    policy._log_decision(FailureDecision.RETRY, None, 1, 3)
    policy._log_decision(FailureDecision.RAISE, None, 4, 3)
    assert logged == [FailureDecision.RAISE]  # the run ends: Ray's text stays
    monkeypatch.setenv("RAYGUARD_LOG_LEVEL", "DEBUG")
    policy._log_decision(FailureDecision.RETRY, None, 1, 3)
    assert logged[-1] == FailureDecision.RETRY


EXITING = '''
import os, signal, sys, time, weakref

def ray_sigterm_handler(signum, frame):  # as Ray's worker: a stop signal raises SystemExit
    raise SystemExit(1)

signal.signal(signal.SIGTERM, ray_sigterm_handler)

class Library:  # as torch's op libraries, finalized at exit
    pass

library = Library()

def stopped_while_exiting():
    os.kill(os.getpid(), signal.SIGTERM)  # Ray stops the worker as it exits
    time.sleep(1)

weakref.finalize(library, stopped_while_exiting)
if sys.argv[1] == "quiet":
    from rayguard._ray.console import quiet_worker
    quiet_worker()
'''


@pytest.mark.parametrize("quiet", [False, True])
def test_a_stop_signal_while_the_worker_exits_prints_no_traceback(quiet, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RAYGUARD_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", EXITING, "quiet" if quiet else "plain"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    if quiet:
        assert done.stderr == "" and done.returncode == -signal.SIGTERM, done.stderr
    else:  # what a worker printed: the control that shows the test can fail
        assert "Exception ignored in atexit callback" in done.stderr
        assert "SystemExit" in done.stderr
