"""ElasticSampler: every sample of an epoch exactly once across resizes; constant global batch."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from rayguard.elastic import ElasticSampler, valid_world_sizes
from rayguard.elastic.sampler import epoch_order
from rayguard.exceptions import ConfigError


def make(n: int, g: int, m: int, rank: int, w: int, state: dict | None = None, **kw: object) -> ElasticSampler:
    s = ElasticSampler(n, global_batch_size=g, micro_batch_size=m, rank=rank, world_size=w, **kw)  # type: ignore[arg-type]
    if state:
        s.load_state_dict(state)
    return s


def run_segment(n: int, g: int, m: int, w: int, state: dict, steps: int, drop_last: bool) -> tuple[list[list[int]], dict]:
    """Run ``steps`` optimizer steps at world size ``w`` from ``state``; return the samples of each step."""
    samplers = [make(n, g, m, r, w, state, drop_last=drop_last) for r in range(w)]
    plans = [s.step_plan() for s in samplers]
    micro = [s.micro_batches() for s in samplers]
    assert all(p == plans[0] for p in plans) or not drop_last  # full steps: same count on every rank
    steps = min(steps, samplers[0].steps_remaining())
    out: list[list[int]] = []
    pos = [0] * w
    for step in range(steps):
        taken: list[int] = []
        for r in range(w):
            k = plans[r][step]
            assert drop_last is False or k == samplers[r].grad_accum_steps
            for batch in micro[r][pos[r]:pos[r] + k]:
                assert len(batch) <= m
                taken.extend(batch)
            pos[r] += k
        consumed = [s.advance() for s in samplers]
        assert consumed == [len(taken)] * w
        out.append(taken)
    states = [s.state_dict() for s in samplers]
    assert all(st_ == states[0] for st_ in states)  # identical on every rank
    return out, states[0]


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    m=st.sampled_from([1, 2, 3]),
    accum_unit=st.sampled_from([4, 6, 12]),
    n=st.integers(0, 150),
    drop_last=st.booleans(),
    epochs=st.integers(1, 2),
)
def test_resizes_consume_every_sample_once(data: st.DataObject, m: int, accum_unit: int, n: int,
                                           drop_last: bool, epochs: int) -> None:
    g = m * accum_unit
    sizes = valid_world_sizes(g, m, 1, 12)
    for epoch in range(epochs):
        state = {"epoch": epoch, "cursor": 0}
        steps_seen: list[list[int]] = []
        while True:
            w = data.draw(st.sampled_from(sizes))
            k = data.draw(st.integers(0, 4))  # resize at a random step boundary (0: immediately)
            steps, state = run_segment(n, g, m, w, state, k, drop_last)
            steps_seen += steps
            if make(n, g, m, 0, 1, state, drop_last=drop_last).steps_remaining() == 0:
                break
        order = epoch_order(n, 0, epoch)
        consumed = Counter(i for s in steps_seen for i in s)
        expected = order[: n // g * g] if drop_last else order
        assert consumed == Counter(expected)  # every id of the epoch exactly once
        sizes_per_step = [len(s) for s in steps_seen]
        full = [x for x in sizes_per_step if x == g]
        assert len(full) == n // g  # each optimizer step consumes exactly the global batch...
        assert sizes_per_step[len(full):] == ([] if drop_last or n % g == 0 else [n % g])  # ...but the last


def test_dataloader_yields_the_planned_micro_batches() -> None:
    n, g, m = 50, 12, 2
    ds = TensorDataset(torch.arange(n))
    s = make(n, g, m, rank=1, w=3, seed=5)
    s.set_epoch(2)
    got = [b[0].tolist() for b in DataLoader(ds, batch_size=m, sampler=s)]
    assert got == s.micro_batches()
    assert len(got) == s.steps_remaining() * s.grad_accum_steps == 4 * 2
    assert len(s) == sum(len(b) for b in got)


def test_resume_mid_epoch_at_other_world_size() -> None:
    n, g, m = 96, 24, 3
    a = [make(n, g, m, r, 4) for r in range(4)]
    for s in a:
        s.set_epoch(1)
        s.advance(2)
    state = a[0].state_dict()
    assert state["cursor"] == 48 and state["epoch"] == 1
    b = [make(n, g, m, r, 2, state) for r in range(2)]
    assert b[0].grad_accum_steps == 4
    rest = sorted(i for s in b for i in s)
    assert rest == sorted(epoch_order(n, 0, 1)[48:])


def test_epoch_transitions() -> None:
    s = make(10, 4, 2, 0, 1)
    s.advance(2)
    with pytest.raises(ConfigError, match="already complete"):
        s.advance()
    s.set_epoch(0)  # same epoch: resume, cursor kept
    assert s.cursor == 8
    s.set_epoch(1)
    assert s.cursor == 0 and s.epoch == 1 and s.next_step_size() == 4
    assert epoch_order(10, 0, 0) != epoch_order(10, 0, 1)
    assert make(10, 4, 2, 0, 1, shuffle=False).micro_batches()[0] == [0, 1]


def test_short_final_step_without_drop_last() -> None:
    # 11 samples, global 4 over 2 ranks: steps 4, 4, 3; the last split 2 + 1
    ranks = [make(11, 4, 2, r, 2, drop_last=False) for r in range(2)]
    assert [s.step_plan() for s in ranks] == [[1, 1, 1], [1, 1, 1]]
    assert [len(b) for b in ranks[1].micro_batches()] == [2, 2, 1]
    assert ranks[0].advance(3) == 11


def test_load_state_rejects_another_dataset() -> None:
    s = make(100, 8, 2, 0, 1)
    with pytest.raises(ConfigError, match="num_samples"):
        s.load_state_dict({"epoch": 0, "cursor": 0, "num_samples": 99})
    with pytest.raises(ConfigError, match="cursor=101"):
        s.load_state_dict({"epoch": 0, "cursor": 101})


def test_invalid_world_size_and_rank() -> None:
    with pytest.raises(ConfigError, match=r"valid world sizes: \[1, 2, 4\]"):
        make(100, 8, 2, 0, 3)
    with pytest.raises(ConfigError, match="rank="):
        make(100, 8, 2, 2, 2)
