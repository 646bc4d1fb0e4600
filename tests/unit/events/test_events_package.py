"""One kind list for runs and sweeps, checked the same way; the 0.x paths are gone."""

from __future__ import annotations

import importlib

import pytest

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


def test_the_reader_is_the_packages_read_and_the_0x_paths_are_gone():
    from rayguard.events import read

    assert read is importlib.import_module("rayguard.events.read").read
    assert not hasattr(ev, "EventLog")  # the sweep's log is ev.SweepLog
    for old in ("rayguard.progress", "rayguard.observe.log"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
