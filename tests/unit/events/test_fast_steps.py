"""The fast path for step summaries (msgspec) accepts only lines the reference parser
accepts, with the same values, and gives up on the rest (which the reference parser then
reads): what it declines costs time, never an event. Readers get the same events with it
and without it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayguard.events import fast
from rayguard.events.lines import EventSource
from rayguard.events.read import iter_events, iter_records, parse_line
from rayguard.events.record import json_safe
from rayguard.events.summary import StepSummary

pytest.importorskip("msgspec")
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def summary(**over: Any) -> dict[str, Any]:
    """A ``steps`` event as the coordinator writes it (RunObserver.on_summaries)."""
    event = {"time": 1700000030.25, "kind": "steps", "rank": 0, "node": "n0", "step": 299,
             "attempt": 2, "detail": "rank 0: steps 250..299, 50 report(s)", "reports": 50,
             "intervals": 49, "step_time_sum_s": 4.9, "step_time_max_s": 0.2,
             "blocked_sum_s": 0.01, "blocked_max_s": 0.001, "first_step": 250,
             "last_step": 299, "first_time": 1700000025.0, "last_time": 1700000030.0,
             "begin_time": 1700000024.5, "metric": "loss", "gpu_ids": [0],
             "straggler_score": None, "samples": [[250, 0.5], [252, float("nan")], [254, 3]]}
    event.update(over)
    return event


def line(event: dict[str, Any]) -> bytes:
    return json.dumps(json_safe(event), sort_keys=True).encode()  # as EventLog writes


def decode(data: bytes) -> Any:
    decoder, errors = fast.decoder()  # type: ignore[misc]
    try:
        return decoder(data)
    except errors:
        return None


def as_event(record: Any) -> dict[str, Any]:
    return {**record.event(), "samples": [list(p) for p in record.samples]}


def same_fields(got: dict[str, Any], reference: dict[str, Any]) -> None:
    """Each field of the reference's event, with its value and type (a field that is
    ``None`` may be left out of the record's)."""
    for name, value in reference.items():
        if name == "samples":
            value = [list(p) for p in value]
        assert got.get(name) == value and type(got.get(name)) is type(value), name
    assert all(reference.get(k) == v for k, v in got.items() if k != "samples")


def test_a_summary_as_written_takes_the_fast_path_with_the_reference_values():
    data = line(summary())
    record = decode(data)
    assert record is not None
    reference = parse_line(data)
    assert reference is not None
    same_fields(as_event(record), reference)  # the sample 3 stays an int, "nan" a string
    assert record.reach == 299 and StepSummary(reference).reach == 299


def test_a_summary_with_optimizer_counts_takes_the_fast_path():
    data = line(summary(optimizer_steps=500, replay_optimizer_steps=100))
    record = decode(data)
    assert record is not None
    assert (record.optimizer_steps, record.replay_optimizer_steps) == (500, 100)
    reference = parse_line(data)
    assert reference is not None
    same_fields(as_event(record), reference)
    assert StepSummary(reference).replay_optimizer_steps == 100


@pytest.mark.parametrize("data", [
    line(summary(time=2**63)),  # past int64: the reference reads it (< 10**19)
    line(summary(extra_field={"a": 1})),  # a field the schema does not know
    line(summary(rank=True)),
    line(summary(samples=[[1, 2, 3]])),
    line(summary(samples=[[1, [2]]])),
    line(summary(detail="lone \ud800")),  # a lone surrogate escape: the reference repairs it
    line(summary()).replace(b'"n0"', b'"n\xff"'),  # invalid UTF-8: the reference replaces it
    line(summary()).replace(b"4.9", b"NaN"),  # an older writer's literal
    line(summary()).replace(b'"last_step": 299, ', b""),  # no last_step: reach is step
])
def test_lines_off_the_schema_are_declined_and_read_by_the_reference(data):
    assert decode(data) is None
    assert parse_line(data) is not None


@pytest.mark.parametrize("data", [
    line(summary()).replace(b"4.9", b"1e999"),
    line(summary()).replace(b"299", b"99999999999999999999"),
    b'{"kind": "steps", "time": 1, "last_step": 1, "samples": ' + b"[" * 5000 + b"]" * 5000
    + b"}",
    line(summary())[:-3],
    b"",
])
def test_lines_neither_accepts(data):
    assert decode(data) is None and parse_line(data) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=12)
FIELDS = sorted(summary())


@SETTINGS
@given(st.dictionaries(st.sampled_from([*FIELDS, "other"]), json_values, max_size=4),
       st.lists(st.sampled_from(FIELDS), max_size=3))
def test_whatever_the_fast_path_accepts_the_reference_reads_the_same(changes, removed):
    event = {k: v for k, v in {**summary(), **changes}.items() if k not in removed}
    data = json.dumps(event, allow_nan=True).encode()
    record = decode(data)
    if record is None:
        return
    reference = parse_line(data)
    assert reference is not None, data
    same_fields(as_event(record), reference)


def test_readers_get_the_same_events_with_and_without_the_fast_path(tmp_path, monkeypatch):
    lines = [line({"time": 1.0, "kind": "start", "detail": "fit() started"}),
             line(summary()), line(summary(rank=1, samples=[], metric=None)),
             line(summary(time=2**63)), b'{"broken', line(summary(attempt=3))[:40],
             line({"time": 2.0, "kind": "finished", "detail": "done"})]
    path = tmp_path / "rayguard_events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    source = EventSource("run", str(path))
    events = list(iter_events(source))
    records = list(iter_records(source))
    assert sum(not isinstance(r, dict) for r in records) == 2  # the two written summaries
    assert len(records) == len(events) == 5
    for r, e in zip(records, events, strict=True):
        same_fields(r if isinstance(r, dict) else as_event(r), e)
    monkeypatch.setattr(fast, "msgspec", None)
    assert all(isinstance(r, dict) for r in iter_records(source))
