"""Property: the event-log reader is total. Random bytes and random JSON lines give events
or skipped lines, and the only exception the line parser raises is UnsafeJSONError; what
the table prints of any event is inert and encodable; the report's data of any events is
built and serialised without error."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayguard.events.lines import EventSource
from rayguard.events.read import iter_events, parse_line
from rayguard.inert import inert
from rayguard.observe.report import data_json
from rayguard.observe.table import format_event
from rayguard.observe.timeline import build_run, build_sweep
from rayguard.safejson import UnsafeJSONError, loads_line

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)
FIELDS = ("time", "rank", "node", "step", "attempt", "detail", "cause", "first_time",
          "last_step", "samples", "metric", "bytes", "blocked_s", "intervals",
          "step_time_sum_s", "trial_id", "verdict", "fallback", "data", "stacks")
KINDS = st.sampled_from(["start", "attempt_started", "restart", "restored", "steps",
                         "worker_died", "stall_detected", "checkpoint_committed", "finished",
                         "unhealthy", "trial_completed", "failed"]) | st.text(max_size=5)
events = st.fixed_dictionaries({"kind": KINDS}, optional={f: json_values for f in FIELDS})


def _line(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()  # NaN / Infinity literals included


def _check_parse(data: bytes) -> None:
    try:
        value = loads_line(data)
    except UnsafeJSONError:
        value = None
    event = parse_line(data)
    assert value is not None or event is None
    if event is not None:
        assert isinstance(event, dict) and isinstance(event["kind"], str)
        json.dumps(event, allow_nan=False).encode("utf-8")  # finite, encodable


@SETTINGS
@given(st.binary(max_size=400))
def test_random_bytes_never_raise(data):
    _check_parse(data)


@SETTINGS
@given(json_values | events)
def test_random_json_lines_never_raise(value):
    _check_parse(_line(value))


@SETTINGS
@given(st.lists(st.binary(max_size=60) | events.map(_line), max_size=12))
def test_random_files_stream_events_or_count_bad_lines(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("log") / "rayguard_events.jsonl"
    path.write_bytes(b"\n".join(lines))
    for kind in ("run", "sweep"):
        got = list(iter_events(EventSource(kind, str(path))))
        assert all(isinstance(e, dict) for e in got)


@SETTINGS
@given(st.lists(events.map(_line), max_size=10))
def test_any_parsed_events_give_inert_rows_and_report_data(lines):
    parsed = [e for e in (parse_line(ln) for ln in lines) if e is not None]
    for event in parsed:
        row = format_event(event, 0.0)
        assert row == inert(row)
        row.encode("utf-8")
        format_event(event, 0.0, as_json=True).encode("ascii")
    text = data_json(build_run(parsed))
    assert "<" not in text
    json.loads(text)
    data_json(build_sweep(parsed))
