"""The order of an epoch, and how a job's layout cuts it: pure functions of a few integers.

An epoch's order is a sequence of sample positions that depends only on ``(seed, epoch, dataset
length)`` (and a mix's weights, :mod:`fastdata.loading.mix`). A :class:`Layout` (``world_size``,
``batch_size``, ``even``, ``drop_last``) cuts a sequence of ``n`` positions: rank ``r`` takes a
contiguous block of it (``even=True``: the same size on every rank, the sequence padded with its own
first positions, as ``DistributedSampler`` pads, or truncated with ``drop_last``), then cuts its
block into batches. A position in an epoch is therefore ``(layout, consumed)``: under the lockstep
rule (every rank of a job has consumed the same number of batches, or all of its own when it has
fewer), ``consumed`` batches of one rank say which positions every rank has read.

A resume in another layout continues with :func:`remaining`: the positions the old layout would
still have read that epoch, none it read, in epoch order; the new layout cuts that sequence.
Invariant (property-tested): over the old job's consumed batches and the new job's whole pass,
each position the old layout reads in the epoch is read exactly once with ``even=False`` (with
``even=True`` at least once: the new layout pads with not-yet-read positions only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


STATE_VERSION = 2  # 1: fastdata up to 0.x (no "version" key, no layout change on resume)
MAX_STAGES = 16  # resumes into another layout within one epoch that a state records


@dataclass(frozen=True)
class Layout:
    """What cuts an epoch's sequence: ranks, their evenness, batches. ``batch_size=None``: items
    are single samples (a sampler used without batches)."""

    world_size: int
    batch_size: int | None
    even: bool
    drop_last: bool

    @property
    def unit(self) -> int:
        """Samples per counted item (a batch, or one sample without batches)."""
        return self.batch_size or 1

    def bounds(self, total: int, rank: int) -> tuple[int, int]:
        """``(start, stop)`` of ``rank``'s block of a sequence of ``total`` positions, in the padded
        (``stop`` may pass ``total``: positions wrap to the sequence's start) or truncated sequence."""
        if self.world_size == 1:
            return 0, total
        if not self.even:
            return total * rank // self.world_size, total * (rank + 1) // self.world_size
        quota = total // self.world_size if self.drop_last else -(-total // self.world_size)
        return rank * quota, (rank + 1) * quota

    def batches(self, samples: int) -> int:
        """Items a block of ``samples`` positions is cut into."""
        if self.batch_size is None:
            return samples
        return samples // self.batch_size if self.drop_last else -(-samples // self.batch_size)

    def reads(self, total: int, rank: int) -> int:
        """Positions of its block that ``rank`` reads in a whole pass (``drop_last``: whole batches only)."""
        start, stop = self.bounds(total, rank)
        if self.batch_size is not None and self.drop_last:
            return (stop - start) // self.batch_size * self.batch_size
        return stop - start

    def block(self, sequence: np.ndarray, rank: int) -> np.ndarray:
        """``rank``'s block of ``sequence`` (padded with the sequence's first entries where needed)."""
        start, stop = self.bounds(len(sequence), rank)
        if stop > len(sequence) and len(sequence):
            sequence = np.concatenate([sequence, np.resize(sequence, stop - len(sequence))])
        return sequence[start:stop]

    def as_list(self, consumed: int) -> list[Any]:
        return [self.world_size, self.batch_size, self.even, self.drop_last, consumed]


def layout_of(entry: Any) -> tuple[Layout, int]:
    """``(layout, consumed)`` from a state's ``[world_size, batch_size, even, drop_last, consumed]``."""
    world_size, batch_size, even, drop_last, consumed = entry
    return Layout(int(world_size), None if batch_size is None else int(batch_size), bool(even),
                  bool(drop_last)), int(consumed)


def remaining(total: int, layout: Layout, consumed: int) -> np.ndarray:
    """Positions (ascending, so in epoch order) of a sequence of ``total`` that ``layout`` reads in
    a whole pass and that no rank had read after ``consumed`` items each (the lockstep rule; a rank
    with fewer items had read all of them). A position read by any rank, as itself or as padding,
    counts as read."""
    read = np.zeros(total, dtype=bool)
    done = np.zeros(total, dtype=bool)
    if total == 0:
        return np.flatnonzero(read)
    for rank in range(layout.world_size):
        start, _ = layout.bounds(total, rank)
        count = layout.reads(total, rank)
        taken = min(consumed * layout.unit, count)
        read[np.arange(start, start + count) % total] = True
        done[np.arange(start, start + taken) % total] = True
    return np.flatnonzero(read & ~done)


def most_items(total: int, layout: Layout) -> int:
    """The most items any rank of ``layout`` reads from a sequence of ``total`` (rank 0's)."""
    start, stop = layout.bounds(total, 0)
    return layout.batches(stop - start)


def epoch_sequence(order: np.ndarray, stages: list[tuple[Layout, int]]) -> np.ndarray:
    """What is left of an epoch's ``order`` after the ``stages`` it ran in before this one."""
    for layout, consumed in stages:
        order = order[remaining(len(order), layout, consumed)]
    return order

