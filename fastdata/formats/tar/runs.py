"""How the map-style tar reader reads members: one ``pread`` per contiguous byte run.

A sample's members (image, ``.cls``, each field's member) lie one after another in its shard, and
so do the samples of sorted or adjacent indices. :func:`plan_runs` groups the members one read
wants into runs, and :func:`read_runs` reads each run once and hands every member out as a
``memoryview`` slice of it (no copy). Pure planning, so its invariant has a property test
(tests/test_tar_runs.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from fastdata.formats.tar.index import read_exact

# Members closer than this join one run: the bytes between them (tar headers, padding, a small
# member nobody asked for) cost less to read than another system call. 8 KiB spans a ``.cls``
# member with its headers and padding (under 2 KiB) with room for a short caption.
RUN_GAP_BYTES = 8 * 1024
# No run grows past this (a member bigger than it is a run of its own): a batch's runs are read
# one at a time, and one read of 2 GiB or more comes back short on Linux.
RUN_LIMIT_BYTES = 64 * 1024 * 1024


def plan_runs(shards: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, *, gap: int = RUN_GAP_BYTES,
              limit: int = RUN_LIMIT_BYTES) -> tuple[np.ndarray, np.ndarray]:
    """Group members (member ``i``: ``sizes[i]`` bytes at ``offsets[i]`` of shard ``shards[i]``)
    into byte runs. Returns ``(order, bounds)``: the members sorted by (shard, offset), and the
    positions in ``order`` where each run starts, with ``len(order)`` last (run ``r`` is
    ``order[bounds[r]:bounds[r + 1]]``).

    Invariant: every run is of one shard; a member joins the run before it when it starts at
    most ``gap`` bytes after the end of the member before it and the run then spans at most
    ``limit`` bytes; so each run spans at most ``max(limit, its largest member)`` bytes. The
    same member asked twice (``ds[[3, 3]]``) is read once."""
    count = len(offsets)
    if not count:
        return np.empty(0, np.int64), np.zeros(1, np.int64)
    order = np.lexsort((offsets, shards))
    shard, start = shards[order], offsets[order]
    end = start + sizes[order]
    # the member before's end: in an index fastdata wrote members never overlap, so it is the
    # furthest end so far (read_runs sizes each run by all its members' ends, whatever the index)
    apart = (shard[1:] != shard[:-1]) | (start[1:] > end[:-1] + gap)
    bounds = np.concatenate([[0], np.flatnonzero(apart) + 1, [count]]).astype(np.int64)
    if np.all(np.maximum.reduceat(end, bounds[:-1]) - start[bounds[:-1]] <= limit):
        return order, bounds
    return order, _split_long(start, end, bounds, limit)


def _split_long(start: np.ndarray, end: np.ndarray, bounds: np.ndarray, limit: int) -> np.ndarray:
    """``bounds`` with every run that spans more than ``limit`` bytes cut greedily (a rare case:
    asked for more than ``limit`` bytes of adjacent samples at once)."""
    out = [0]
    for low, high in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        first, reach = int(start[low]), int(end[low])
        for member in range(low + 1, high):
            reach_with = max(reach, int(end[member]))
            if reach_with - first > limit:
                out.append(member)
                first, reach_with = int(start[member]), int(end[member])
            reach = reach_with
        out.append(high)
    return np.asarray(out, np.int64)


def read_runs(shards: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
              opened: Callable[[int], object], file: Callable[[int], Callable[[], Path]]) -> list[memoryview]:
    """Each member's bytes (as :func:`plan_runs` takes them), each run read with one ``pread``:
    ``opened(shard)`` is a context manager giving the shard's open descriptor, ``file(shard)``
    a callable naming the shard in the error of a short read."""
    order, bounds = plan_runs(shards, offsets, sizes)
    members: list[memoryview] = [memoryview(b"")] * len(offsets)
    for low, high in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        run = order[low:high]
        shard = int(shards[run[0]])
        first = int(offsets[run[0]])
        size = int((offsets[run] + sizes[run]).max()) - first
        with opened(shard) as descriptor:
            view = memoryview(read_exact(descriptor, size, first, file(shard)))
        for member, at, length in zip(run.tolist(), (offsets[run] - first).tolist(), sizes[run].tolist()):
            members[member] = view[at:at + length]
    return members
