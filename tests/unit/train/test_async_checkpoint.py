"""The pieces of asynchronous checkpoints: the snapshot into reused host buffers, and the
single checkpoint in flight (back-pressure, errors raised once in the loop)."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import pytest
import torch

from rayguard.checkpoint import format as fmt
from rayguard.exceptions import CheckpointError
from rayguard.train.async_checkpoint import AsyncCheckpointer
from rayguard.train.snapshot import SnapshotBuffers


def _state(step: int) -> dict:
    model = torch.nn.Linear(8, 4)
    return {"model": OrderedDict(model.state_dict()), "step": step, "cfg": {"lr": [0.1, 0.2]},
            "arr": np.arange(6.0), "name": "run", "t": (torch.ones(3), 7)}


def test_the_second_snapshot_reuses_the_first_ones_buffers() -> None:
    buffers = SnapshotBuffers()
    state = _state(1)
    first = buffers.take(state)
    ptrs = {k: v.data_ptr() for k, v in first["model"].items()}
    allocated = buffers.bytes_allocated
    state["model"]["weight"].add_(1.0)
    second = buffers.take(state)
    assert {k: v.data_ptr() for k, v in second["model"].items()} == ptrs
    assert buffers.bytes_allocated == allocated == buffers.nbytes
    assert torch.equal(second["model"]["weight"], state["model"]["weight"])


def test_the_loop_changing_its_state_after_the_snapshot_does_not_change_it() -> None:
    state = _state(1)
    snap = SnapshotBuffers().take(state)
    before = state["model"]["weight"].clone()
    state["model"]["weight"].mul_(0).add_(5)
    state["cfg"]["lr"].append(9)
    state["arr"][0] = 42
    state["t"][0].zero_()
    assert torch.equal(snap["model"]["weight"], before)
    assert snap["cfg"] == {"lr": [0.1, 0.2]} and snap["arr"][0] == 0.0
    assert torch.equal(snap["t"][0], torch.ones(3)) and snap["t"][1] == 7
    assert snap["step"] == 1 and snap["name"] == "run" and isinstance(snap["model"], OrderedDict)


def test_a_snapshot_encodes_to_the_same_checkpoint_as_the_state() -> None:
    shared = torch.arange(4.0)
    param = torch.nn.Parameter(torch.ones(2))
    state = {"a": shared, "b": shared, "p": param, "nc": torch.arange(12.0).view(3, 4).t()}
    snap = SnapshotBuffers().take(state)
    assert snap["a"] is snap["b"]  # tied tensors stay one entry
    (want, want_entries), (got, got_entries) = fmt.encode(state), fmt.encode(snap)
    assert got == want and len(got_entries) == len(want_entries) == 3
    for w, g in zip(want_entries, got_entries, strict=True):
        want_buf, got_buf = fmt.source_buffer(w), fmt.source_buffer(g)  # (view, its owner)
        assert bytes(want_buf[0]) == bytes(got_buf[0])


def test_a_changed_structure_frees_the_buffers_it_no_longer_uses() -> None:
    buffers = SnapshotBuffers()
    buffers.take({"a": torch.zeros(1000), "b": torch.zeros(10)})
    buffers.take({"a": torch.zeros(1000)})
    assert buffers.nbytes == 1000 * 4
    buffers.take({"a": torch.zeros(2000)})  # another shape: a new buffer
    assert buffers.nbytes == 2000 * 4


def test_a_checkpoint_waits_for_the_one_in_flight() -> None:
    beats = []
    checkpointer = AsyncCheckpointer(heartbeat=lambda: beats.append(1))
    release = threading.Event()
    checkpointer.submit(lambda: release.wait() and "first")
    assert checkpointer.in_flight and checkpointer.poll() is None
    with pytest.raises(RuntimeError, match="still in flight"):
        checkpointer.submit(lambda: "second")  # never two in flight
    result: list = []
    waiter = threading.Thread(target=lambda: result.append(checkpointer.wait()))
    waiter.start()
    waiter.join(timeout=0.5)
    assert waiter.is_alive()  # back-pressure: blocked until the first one finished
    release.set()
    waiter.join(timeout=30)
    assert result[0][1] == "first" and result[0][0] > 0
    assert checkpointer.waits == 1 and checkpointer.waited_s >= result[0][0]
    assert not checkpointer.in_flight
    checkpointer.submit(lambda: "second")
    assert checkpointer.drain() == "second"
    assert checkpointer.wait() == (0.0, None) and checkpointer.waits == 1  # nothing in flight
    checkpointer.close()


def test_a_background_failure_is_raised_once_in_the_loop() -> None:
    checkpointer = AsyncCheckpointer()

    def fail() -> None:
        raise CheckpointError("checkpoint of step 3 was not saved (earlier checkpoints are intact)")

    checkpointer.submit(fail)
    with pytest.raises(CheckpointError, match="step 3 was not saved"):
        checkpointer.drain()
    assert checkpointer.poll() is None  # raised once
    checkpointer.submit(fail)
    with pytest.raises(CheckpointError):
        checkpointer.wait()
    checkpointer.close()


def test_drain_gives_up_after_its_timeout_and_the_checkpoint_stays_in_flight() -> None:
    checkpointer = AsyncCheckpointer()
    release = threading.Event()
    checkpointer.submit(release.wait)
    assert checkpointer.drain(timeout_s=0.05) is None and checkpointer.in_flight
    release.set()
    assert checkpointer.drain() is True
    checkpointer.close()
