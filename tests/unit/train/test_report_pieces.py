"""The pure pieces behind rayguard.train.report: step resolution, metric conversion, and the
ordered forwarder (a real thread, no Ray)."""

import threading
import time

import numpy as np
import pytest
import torch

from rayguard.train.forwarder import Forwarder
from rayguard.train.steps import plain as _plain
from rayguard.train.steps import resolve_step


def test_resolve_step_precedence():
    assert resolve_step(7, {"step": 3}, {"step": 1}, last_step=0) == 7
    assert resolve_step(None, {"step": 3}, {"step": 1}, last_step=0) == 3
    assert resolve_step(None, {}, {"step": 1}, last_step=0) == 1
    assert resolve_step(None, {}, None, last_step=4) == 5
    assert resolve_step(None, {"step": True}, None, last_step=-1) == 0  # a bool is not a step


def test_scalar_tensors_and_numpy_numbers_become_python_numbers():
    assert _plain(torch.tensor(2.5)) == 2.5 and isinstance(_plain(torch.tensor(2.5)), float)
    assert _plain(torch.tensor([3])) == 3
    assert _plain(np.float32(1.5)) == 1.5 and isinstance(_plain(np.float32(1.5)), float)
    big = torch.ones(2)
    assert _plain(big) is big  # Ray will refuse it with its own message
    assert _plain("text") == "text"


def test_forwarder_keeps_order_and_flush_waits():
    seen = []
    fwd = Forwarder()

    def slow_append(i):
        time.sleep(0.001)
        seen.append(i)

    for i in range(200):
        fwd.submit(slow_append, i)
    fwd.flush(timeout_s=30)
    assert seen == list(range(200))
    fwd.close(timeout_s=30)


def test_forwarder_error_reaches_the_training_thread_and_stops_later_calls():
    fwd = Forwarder()
    ran = threading.Event()

    def boom():
        raise RuntimeError("controller went away")

    fwd.submit(boom)
    with pytest.raises(RuntimeError, match="controller went away"):
        fwd.flush(timeout_s=30)
    with pytest.raises(RuntimeError, match="controller went away"):
        fwd.submit(ran.set)
    assert not ran.is_set()


def test_a_ray_train_report_step_is_its_step_like_metric_else_one_past_the_last():
    from rayguard.train.ray_report import report_step

    assert report_step({"loss": 1.0, "step": 40, "epoch": 2}, 10) == 40
    assert report_step({"global_step": 7}, 10) == 7
    assert report_step({"training_iteration": 3}, 10) == 3
    assert report_step({"loss": 1.0, "step": True}, 10) == 11  # a bool is no step
    assert report_step({"loss": 1.0}, -1) == 0
    assert report_step({"loss": 1.0, "epoch": 140}, 0) == 140  # a loop that counts epochs
    assert report_step({"iteration": 5}, 0) == 5
