"""Ray Train's placement-group cleaner is left out where Ray's State API does not answer (no
dashboard: it could only warn, every few seconds), and kept where it does. No cluster: the
State API's answer is given."""

from __future__ import annotations

import pytest

from rayguard._ray.cleaner import without_blind_cleaner

PlacementGroupCleanerCallback = pytest.importorskip(  # Ray 2.60's; an older Ray has none
    "ray.train.v2._internal.callbacks.placement_group_callback").PlacementGroupCleanerCallback


def test_the_cleaner_is_dropped_only_when_the_state_api_does_not_answer():
    other = object()
    callbacks = [other, PlacementGroupCleanerCallback()]
    assert without_blind_cleaner(callbacks, lambda: False) == [other]
    assert without_blind_cleaner(callbacks, lambda: True) == callbacks
    asked = []
    assert without_blind_cleaner([other], lambda: asked.append(1) or False) == [other]
    assert not asked  # no cleaner: the State API is not asked


def test_where_the_controller_can_die_without_ending_the_run_a_releaser_takes_its_place():
    """A fit() in a Tune trial (not the main thread): Tune stops the trial's actor and the
    controller dies with it, so rayguard's releaser removes the run's groups instead."""
    import threading

    from rayguard._ray.cleaner import GroupReleaser

    other = object()
    callbacks = [other, PlacementGroupCleanerCallback()]
    kept = without_blind_cleaner(callbacks, lambda: False, owner_may_vanish=True)
    assert kept[0] is other and len(kept) == 2 and isinstance(kept[1], GroupReleaser)
    assert without_blind_cleaner(callbacks, lambda: True, owner_may_vanish=True) == callbacks
    assert without_blind_cleaner(callbacks, lambda: False) == [other]  # the main thread
    in_thread = []
    thread = threading.Thread(
        target=lambda: in_thread.extend(without_blind_cleaner(callbacks, lambda: False)))
    thread.start()
    thread.join()
    assert [type(c) for c in in_thread] == [object, GroupReleaser]
