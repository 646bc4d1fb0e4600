"""Async checkpoint snapshots of CUDA state (run on a GPU machine; skipped elsewhere): CUDA
tensors land in pinned host buffers through non-blocking copies, synchronised before the
snapshot is returned, and the buffers are reused."""

from __future__ import annotations

import pytest
import torch

from rayguard.train.snapshot import SnapshotBuffers

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_cuda_tensors_are_copied_into_reused_pinned_buffers() -> None:
    buffers = SnapshotBuffers()
    state = {"w": torch.randn(1 << 24, device="cuda"), "b": torch.randn(7, device="cuda")}
    expected = state["w"].cpu()
    snap = buffers.take(state)
    state["w"].add_(1)  # queued after the copy on the same stream: the snapshot is taken
    assert snap["w"].device.type == "cpu" and snap["w"].is_pinned()
    assert torch.equal(snap["w"], expected)
    ptr = snap["w"].data_ptr()
    again = buffers.take(state)
    assert again["w"].data_ptr() == ptr and torch.equal(again["w"], state["w"].cpu())


def test_pin_memory_false_uses_pageable_buffers() -> None:
    snap = SnapshotBuffers(pin_memory=False).take({"w": torch.ones(10, device="cuda")})
    assert not snap["w"].is_pinned() and torch.equal(snap["w"], torch.ones(10))
