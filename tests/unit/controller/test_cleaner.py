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

