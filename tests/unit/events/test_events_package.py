"""One kind list for runs and sweeps, checked the same way; the old import paths still work."""

from __future__ import annotations

import importlib

import pytest

from rayguard import constants
from rayguard.events import KINDS, NOTABLE_KINDS, make_event
from rayguard.events import kinds as k
from rayguard.tune import events as ev


def test_run_and_sweep_kinds_are_one_list():
    assert set(k.RUN_KINDS) | set(k.SWEEP_KINDS) == set(KINDS)
    assert len(KINDS) == len(set(KINDS))
    assert NOTABLE_KINDS <= set(k.RUN_KINDS)
    make_event(ev.TRIAL_STARTED, "a sweep kind is a kind")  # the same check for both


def test_a_sweep_kind_not_in_the_list_is_refused_as_a_run_kind_is():
    with pytest.raises(ValueError, match="unknown event kind 'bogus'"):
        make_event("bogus", "x")
    with pytest.raises(ValueError, match="unknown event kind 'bogus'"):
        ev.SweepLog().record("bogus", None, "x")


def test_old_import_paths_still_give_the_same_objects():
    from rayguard.events import read
    from rayguard.observe.progress import ProgressPrinter, attempt_view

    progress = importlib.import_module("rayguard.progress")
    assert progress.NOTABLE_KINDS is NOTABLE_KINDS
    assert progress.SEND_INTERVAL_S == constants.SEND_INTERVAL_S
    assert progress.attempt_view is attempt_view and progress.ProgressPrinter is ProgressPrinter
    with pytest.warns(DeprecationWarning, match="SweepLog"):
        assert ev.EventLog is ev.SweepLog
    observe_log = importlib.import_module("rayguard.observe.log")
    with pytest.warns(DeprecationWarning, match="rayguard.events.read"):
        assert observe_log.read_log is importlib.import_module("rayguard.events.read").read_log
    assert read is importlib.import_module("rayguard.events.read").read
