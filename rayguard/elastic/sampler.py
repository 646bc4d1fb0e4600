"""ElasticSampler: each sample of an epoch exactly once, across any sequence of resizes.

The sampler's whole state is ``{"epoch", "cursor"}``: ``cursor`` counts the samples of the
epoch's (deterministically shuffled) order that optimizer steps have already consumed,
summed over all ranks. It is the same on every rank, so any rank's copy can be checkpointed.

Layout of the not-yet-consumed samples ``order[cursor:]`` at world size ``W`` with
``A = grad_accum_steps``, micro-batch ``m`` and global batch ``G = m * A * W``::

    optimizer step s          : order[cursor + s*G : cursor + (s+1)*G]
      rank r's share of step s: the r-th block of A*m samples of that step
        micro-batch k of rank r: the k-th block of m samples of that share

A checkpoint taken at an optimizer-step boundary therefore resumes exactly: the next
attempt (any world size) restarts from ``cursor`` and splits the rest over its ranks.

**End of the epoch.** When fewer than ``G`` samples remain: ``drop_last=True`` (default)
skips them (the epoch holds ``n // G`` full steps, every step exactly ``G`` samples);
``drop_last=False`` runs one smaller final step over the remaining ``R < G`` samples,
split over the ranks as evenly as possible (rank shares differ by at most one sample and may
be empty when ``R < W``; the last micro-batch of a share may be short). Call
:meth:`ElasticSampler.advance` after every optimizer step either way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import Sampler

from rayguard.elastic.geometry import grad_accum_steps
from rayguard.exceptions import ConfigError, config_error
from rayguard.health.divergence import take_data_skip


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The sample order of ``epoch``: a permutation of ``range(num_samples)`` fixed by
    ``(seed, epoch)`` (the same rule as ``torch.utils.data.DistributedSampler``)."""
    if not shuffle:
        return list(range(num_samples))
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=g).tolist()


def epoch_end(num_samples: int, global_batch_size: int, drop_last: bool) -> int:
    """Cursor value at which the epoch is over."""
    return num_samples // global_batch_size * global_batch_size if drop_last else num_samples


def step_share(step_start: int, step_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[begin, end)`` positions (in the epoch order) of ``rank``'s share of one step.

    Full steps split into equal blocks; a short final step splits as evenly as possible.
    """
    base, extra = divmod(step_size, world_size)
    begin = step_start + rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)


def rank_positions(cursor: int, end: int, global_batch_size: int, rank: int, world_size: int) -> list[int]:
    """Positions (in the epoch order) that ``rank`` reads from ``cursor`` to ``end``, in order."""
    out: list[int] = []
    for start in range(cursor, end, global_batch_size):
        b, e = step_share(start, min(global_batch_size, end - start), rank, world_size)
        out.extend(range(b, e))
    return out


class ElasticSampler(Sampler[int]):
    """Indices of one rank for the rest of the current epoch, resumable at any world size.

    Use with ``DataLoader(dataset, batch_size=micro_batch_size, sampler=sampler)``; every
    ``grad_accum_steps`` micro-batches form one optimizer step; call :meth:`advance` after
    each optimizer step and checkpoint :meth:`state_dict` with the model. Create it (or
    call :meth:`load_state_dict`) before iterating: an iterator fixes its indices when
    it starts.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        global_batch_size: int,
        micro_batch_size: int,
        rank: int,
        world_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        if not (isinstance(num_samples, int) and num_samples >= 0):
            raise config_error("ElasticSampler", "num_samples", num_samples, "must be an int >= 0",
                               "pass len(dataset)")
        if not (isinstance(rank, int) and isinstance(world_size, int) and 0 <= rank < world_size):
            raise config_error("ElasticSampler", "rank", rank, f"must be in [0, world_size={world_size})",
                               "pass ctx.rank and ctx.world_size")
        self.grad_accum_steps = grad_accum_steps(global_batch_size, micro_batch_size, world_size)
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.cursor = 0

    # -- position -----------------------------------------------------------------------
    @property
    def end(self) -> int:
        """Cursor value at which this epoch is over."""
        return epoch_end(self.num_samples, self.global_batch_size, self.drop_last)

    def steps_remaining(self) -> int:
        """Optimizer steps left in this epoch from the cursor (the final short one counts)."""
        return -(-max(0, self.end - self.cursor) // self.global_batch_size)

    def next_step_size(self) -> int:
        """Samples (over all ranks) the next optimizer step consumes; 0 at the epoch's end."""
        return max(0, min(self.global_batch_size, self.end - self.cursor))

    def advance(self, steps: int = 1) -> int:
        """Move the cursor past ``steps`` optimizer steps; returns the samples consumed."""
        consumed = 0
        for _ in range(steps):
            size = self.next_step_size()
            if size == 0:
                raise ConfigError(f"ElasticSampler.advance(): epoch {self.epoch} is already complete "
                                  f"(cursor={self.cursor}). Fix: call set_epoch(epoch + 1) first")
            self.cursor += size
            consumed += size
        return consumed

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` (cursor 0). Same epoch again: keep the cursor (resume)."""
        if epoch != self.epoch:
            self.epoch, self.cursor = epoch, 0

    # -- checkpoint ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "cursor", "num_samples", "seed"}``: identical on every rank."""
        return {"epoch": self.epoch, "cursor": self.cursor, "num_samples": self.num_samples,
                "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at a saved position; the world size may differ from the saving run's.
        After a restore from before a divergence (``HealthConfig(divergence=...)``), the
        cursor then moves past the steps that diverged
        (``rayguard.train.get_context().data_skip_steps``)."""
        for key in ("num_samples", "seed"):
            if key in state and state[key] != getattr(self, key):
                raise ConfigError(
                    f"ElasticSampler.load_state_dict(): saved {key}={state[key]!r} but this sampler "
                    f"has {key}={getattr(self, key)!r}; the data order would differ. Fix: build the "
                    "sampler over the same dataset with the same seed")
        cursor = int(state["cursor"])
        if not 0 <= cursor <= self.num_samples:
            raise ConfigError(f"ElasticSampler.load_state_dict(): cursor={cursor} outside "
                              f"[0, {self.num_samples}]. Fix: pass a state from state_dict()")
        self.epoch, self.cursor = int(state["epoch"]), cursor
        skip = take_data_skip()  # a rollback past a divergence leaves its data out
        if skip:
            self.advance(min(skip, self.steps_remaining()))

    # -- indices ------------------------------------------------------------------------
    def micro_batches(self) -> list[list[int]]:
        """This rank's remaining indices cut into micro-batches, per optimizer step in order."""
        order = epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle)
        out: list[list[int]] = []
        for start in range(self.cursor, self.end, self.global_batch_size):
            b, e = step_share(start, min(self.global_batch_size, self.end - start), self.rank, self.world_size)
            out.extend(order[i:min(i + self.micro_batch_size, e)] for i in range(b, e, self.micro_batch_size))
        return out

    def step_plan(self) -> list[int]:
        """Micro-batches this rank runs in each remaining optimizer step (``grad_accum_steps``
        for a full step; the short final step of ``drop_last=False`` may differ, even be 0)."""
        m = self.micro_batch_size
        return [-(-(e - b) // m) for start in range(self.cursor, self.end, self.global_batch_size)
                for b, e in [step_share(start, min(self.global_batch_size, self.end - start),
                                        self.rank, self.world_size)]]

    def __iter__(self) -> Iterator[int]:
        order = epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle)
        positions = rank_positions(self.cursor, self.end, self.global_batch_size, self.rank, self.world_size)
        return iter([order[p] for p in positions])

    def __len__(self) -> int:
        return sum(
            e - b
            for start in range(self.cursor, self.end, self.global_batch_size)
            for b, e in [step_share(start, min(self.global_batch_size, self.end - start),
                                    self.rank, self.world_size)]
        )
