"""Preemption notices: the SIGTERM handler (real signals in this process), the grace period
setting, and when should_checkpoint() turns on and off."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from rayguard.train import preemption as pre
from rayguard.train.agreement import Flags


@pytest.fixture
def handler():
    """The notice handler in front of a recording 'previous' handler; restored afterwards."""
    calls: list[int] = []
    original = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    saved = pre._SIGTERM
    pre._SIGTERM = pre._Sigterm()
    assert pre.install_handler(grace_s=30.0)
    yield calls
    if pre._SIGTERM.timer is not None:
        pre._SIGTERM.timer.cancel()
    pre._SIGTERM = saved
    signal.signal(signal.SIGTERM, original)


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_during_training_is_held_and_handed_on_at_release(handler):
    pre.set_active(True)
    _sigterm()
    notice = pre.sigterm_notice()
    assert notice is not None and notice.source == "SIGTERM" and notice.grace_s == 30.0
    assert handler == []  # the previous handler (Ray's: exit) has not run yet
    assert pre.release()
    assert handler == [signal.SIGTERM]


def test_a_second_sigterm_is_handed_on_at_once(handler):
    pre.set_active(True)
    _sigterm()
    _sigterm()
    assert handler == [signal.SIGTERM]


def test_a_sigterm_outside_training_is_handed_on_at_once(handler):
    pre.set_active(False)
    _sigterm()
    assert handler == [signal.SIGTERM] and pre.sigterm_notice() is None


def test_without_a_checkpoint_the_signal_is_handed_on_after_the_grace_period(handler):
    pre._SIGTERM.grace_s = 0.01
    pre.set_active(True)
    _sigterm()
    assert pre._SIGTERM.timer is not None
    pre._SIGTERM.timer.join(timeout=30)
    assert pre._SIGTERM.released
    threading.Event().wait(0.01)  # the re-sent signal runs the handler at the next bytecode
    assert handler == [signal.SIGTERM]


def test_the_handler_is_only_installed_from_the_main_thread():
    result = []
    thread = threading.Thread(target=lambda: result.append(pre.install_handler(1.0)))
    thread.start()
    thread.join()
    assert result == [False]


@pytest.mark.parametrize("raw, expected", [("12", 12.0), ("0", 0.0), ("x", 25.0), ("-1", 25.0)])
def test_grace_period_setting(raw, expected):
    assert pre.grace_period_s({"RAYGUARD_PREEMPTION_GRACE_S": raw}) == expected
    assert pre.grace_period_s({}) == 25.0


def test_should_checkpoint_turns_on_after_an_agreed_notice_and_off_after_a_save():
    notice = pre.Notice("SIGTERM", 30.0, 0.0)
    seen = []
    p = pre.Preemption((lambda: seen.append(1) or notice,))
    assert p.local_flag() and not p.should_checkpoint()
    assert not p.after_report(Flags(notice=True), saved=False)  # step s: agreed
    assert p.should_checkpoint()
    assert not p.after_report(Flags(notice=True), saved=False)  # the loop did not pass state
    assert p.should_checkpoint()
    assert p.after_report(Flags(state=True, notice=True), saved=True)  # just in time
    assert not p.should_checkpoint() and not p.local_flag()
    assert not p.after_report(Flags(), saved=True)  # a later periodic save is not "just in time"
    assert seen == [1]  # a notice is polled until seen, then kept


def test_a_peer_notice_makes_this_rank_checkpoint_too():
    p = pre.Preemption((lambda: None,))
    assert not p.local_flag()
    p.after_report(Flags(notice=True), saved=False)
    assert p.should_checkpoint()
    assert p.after_report(Flags(state=True), saved=True)
    assert not p.should_checkpoint()


def test_a_notice_at_a_step_that_saves_is_answered_by_that_save():
    p = pre.Preemption((lambda: pre.Notice("ray drain", None, 0.0),))
    assert p.local_flag()
    assert p.after_report(Flags(state=True, notice=True), saved=True)
    assert not p.should_checkpoint() and not p.local_flag()
