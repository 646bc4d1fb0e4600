"""The quarantine file from an attacker's side (anyone who can write the run directory): a
link, a FIFO, an oversize file, invalid entries, and an entry list that names every node.
The reader and what consumes its state (the list, the fence, the wait message) stay total:
a state, or the documented ValueError."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayguard.controller.fence import wait_message
from rayguard.health import quarantine_file
from rayguard.health.cli import entry_sources, format_state
from rayguard.health.quarantine import fence_nodes

A, B, C = "a" * 56, "b" * 56, "c" * 56


def _entry(**change) -> dict:
    entry = {"reason": "killed", "time": 1.7e9,
             "failures": [{"node": A, "attempt": 0, "reason": "killed", "rank": 0,
                           "detail": "worker process died"}]}
    entry.update(change)
    return entry


def _write(path, nodes, lifted=None) -> None:
    path.write_text(json.dumps({"version": 1, "nodes": nodes, "lifted": lifted or {}}))


def test_a_link_to_dev_zero_is_refused_not_read(tmp_path) -> None:
    path = quarantine_file.quarantine_path(tmp_path)
    os.symlink("/dev/zero", path)
    with pytest.raises(ValueError, match="not a rayguard quarantine file"):
        quarantine_file.read(path)


def test_a_link_to_a_valid_file_is_not_followed(tmp_path) -> None:
    real = tmp_path / "elsewhere.json"
    _write(real, {A: _entry()})
    os.symlink(real, quarantine_file.quarantine_path(tmp_path))
    with pytest.raises(ValueError, match="link"):
        quarantine_file.read(quarantine_file.quarantine_path(tmp_path))


def test_a_fifo_is_refused_promptly(tmp_path) -> None:
    path = quarantine_file.quarantine_path(tmp_path)
    os.mkfifo(path)
    outcome: list = []

    def reader() -> None:
        try:
            outcome.append(quarantine_file.read(path))
        except ValueError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(timeout=5)
    if thread.is_alive():  # unblock the reader before failing
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a FIFO as the quarantine file blocked")
    assert len(outcome) == 1 and isinstance(outcome[0], ValueError)


def test_an_oversize_file_is_refused(tmp_path) -> None:
    path = quarantine_file.quarantine_path(tmp_path)
    path.write_bytes(b" " * (quarantine_file.MAX_BYTES + 10) + b"{}")
    with pytest.raises(ValueError, match="limit"):
        quarantine_file.read(path)


@pytest.mark.parametrize("bad", [
    _entry(failures="abc"), _entry(failures=7), _entry(reason=5), _entry(time="soon"),
    _entry(time=None), _entry(failures=[{"attempt": "x"}]), _entry(failures=[3]),
    _entry(failures=[{"attempt": True}]), _entry(failures=[{"attempt": 0, "rank": "r"}]),
    _entry(failures=[{"attempt": 0, "detail": 5}]), "killed", None, [1]])
def test_an_invalid_entry_is_dropped_with_a_warning_naming_it(tmp_path, caplog, bad) -> None:
    path = quarantine_file.quarantine_path(tmp_path)
    _write(path, {A: _entry(), B: bad})
    state = quarantine_file.read(path)
    assert list(state["nodes"]) == [A]
    assert f"nodes entry '{B}' dropped" in caplog.text and "Fix:" in caplog.text


@pytest.mark.parametrize("node", ["zz" * 28, "A" * 56, "a" * 7, "a" * 129, "\x1b]0;x\x07" * 4])
def test_a_node_id_that_is_not_hex_of_sane_length_is_dropped(tmp_path, caplog, node) -> None:
    path = quarantine_file.quarantine_path(tmp_path)
    _write(path, {node: _entry(), A: _entry()}, lifted={node: 1.0, B: "x", C: 2.0})
    state = quarantine_file.read(path)
    assert list(state["nodes"]) == [A] and list(state["lifted"]) == [C]
    assert "\x1b" not in caplog.text


def test_a_planted_file_naming_every_node_never_fences_them_all() -> None:
    assert fence_nodes((), {A, B, C}, alive={A, B}).fenced == {C}  # C: not alive anyway
    only = fence_nodes((), {A}, alive={A})
    assert only.fenced == frozenset() and only.withheld == {A}
    mixed = fence_nodes({A}, {B}, alive={A, B})  # the run's own decision stays
    assert mixed.fenced == {A} and mixed.withheld == {B}
    assert fence_nodes({A}, {B}, alive={A, B, C}).fenced == {A, B}
    assert fence_nodes((), {A, B}, alive=None).fenced == {A, B}  # not known: as the file says


@pytest.mark.parametrize("entry", [{"reason": "oom", "failures": "abc"}, {"failures": 7},
                                   {"reason": ["x"], "failures": [None, {"attempt": "1"}]}, 5])
def test_the_wait_message_takes_entries_of_any_shape(entry) -> None:
    text = wait_message(4, 2, {A: entry}, "/runs/r")
    assert A[:12] in text and "attempts ?" in text


def test_the_list_marks_where_each_entry_came_from() -> None:
    state = {"nodes": {A: _entry(), B: _entry()}, "lifted": {}}
    text = format_state(state, entry_sources(state, {A}))
    assert f"{A}  [this run]" in text and f"{B}  [file]" in text


SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20)
node_ids = st.sampled_from([A, B, C, "x", "ab12cd00"]) | st.text(max_size=10)
entries = json_values | st.fixed_dictionaries(
    {}, optional={"reason": json_values, "time": json_values,
                  "failures": json_values | st.lists(st.fixed_dictionaries(
                      {}, optional={k: json_values for k in ("attempt", "rank", "reason",
                                                             "detail", "node")}), max_size=3)})
documents = st.fixed_dictionaries({}, optional={
    "version": json_values, "nodes": json_values | st.dictionaries(node_ids, entries, max_size=4),
    "lifted": json_values | st.dictionaries(node_ids, json_values, max_size=4)})


def _consume(path) -> None:
    try:
        state = quarantine_file.read(path)
    except ValueError:
        return
    format_state(state, entry_sources(state, {A}))
    wait_message(2, 1, state["nodes"], "RUN_DIR")
    fence_nodes({A}, set(state["nodes"]), alive={A, B})
    json.dumps(state)


@SETTINGS
@given(documents)
def test_fuzz_structured_documents(tmp_path, document) -> None:
    path = quarantine_file.quarantine_path(tmp_path)
    path.write_text(json.dumps(document))
    _consume(path)


@SETTINGS
@given(st.binary(max_size=300) | documents.map(lambda d: json.dumps(d).encode()[:-3]))
def test_fuzz_bytes(tmp_path, data) -> None:
    path = quarantine_file.quarantine_path(tmp_path)
    path.write_bytes(data)
    started = time.monotonic()
    _consume(path)
    assert time.monotonic() - started < 5
