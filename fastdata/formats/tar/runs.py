"""How the map-style tar reader reads members: one ``pread`` per contiguous byte run.

A sample's members (image, ``.cls``, each field's member) lie one after another in its shard, and
so do the samples of sorted or adjacent indices. :func:`plan_runs` groups the members one read
wants into runs, and :func:`read_runs` reads each run once and hands every member out as a
``memoryview`` slice of it (no copy). The planning is a pure function, with a property test of
its invariant (tests/test_tar_runs.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from fastdata.formats.tar.index import read_exact

# Members closer than this join one run: the bytes between them (tar headers, padding, a small
# member nobody asked for) cost less to read than another system call. 8 KiB spans a ``.cls``
# member with its headers and padding (under 2 KiB) with room for a short caption.
RUN_GAP_BYTES = 8 * 1024
# No run grows past this (a member bigger than it is a run of its own): a batch's runs are read
# one at a time, and one read of 2 GiB or more comes back short on Linux.
RUN_LIMIT_BYTES = 64 * 1024 * 1024


def plan_runs(shards: list[int], offsets: list[int], sizes: list[int], *, gap: int = RUN_GAP_BYTES,
              limit: int = RUN_LIMIT_BYTES) -> Iterator[tuple[int, int, int, int, list[tuple[int, int, int]] | None]]:
    """Group members (member ``i``: ``sizes[i]`` bytes at ``offsets[i]`` of shard ``shards[i]``)
    into byte runs: ``(shard, first byte, bytes, first member, members)``, in (shard, offset)
    order, each run as soon as it is known; ``members`` is None for a run of its first member
    alone, else every ``(member, offset in the run, size)`` sorted by offset.

    Invariant: every member is in exactly one run, of its shard; a member joins the run before it
    when it starts at most ``gap`` bytes after the end of that run's members so far and the run
    then spans at most ``limit`` bytes, so a run spans at most ``max(limit, its largest member)``
    bytes and covers all its members. (Plain Python: for the few members of one read, sorting
    tuples costs less than numpy's calls; most runs of a random batch are one member, which
    costs no list.)"""
    shard = lead = first = end = gap_end = -1
    members: list[tuple[int, int, int]] | None = None
    for member_shard, offset, size, member in sorted(zip(shards, offsets, sizes, range(len(offsets)))):
        stop = offset + size
        if member_shard == shard and offset <= gap_end:
            reach = stop if stop > end else end
            if reach - first <= limit:
                if members is None:
                    members = [(lead, 0, end - first)]
                members.append((member, offset - first, size))
                end, gap_end = reach, reach + gap
                continue
        if lead >= 0:
            yield shard, first, end - first, lead, members
        shard, lead, first, end, gap_end, members = member_shard, member, offset, stop, stop + gap, None
    if lead >= 0:
        yield shard, first, end - first, lead, members


def read_runs(shards: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
              opened: Callable[[int], Any], file: Callable[[int], Callable[[], Path]]) -> list[bytes | memoryview]:
    """Each member's bytes (as :func:`plan_runs` takes them), each run read with one ``pread``
    (a run of one member: its bytes; else views of the run's bytes). ``opened(shard)`` is a
    context manager giving the shard's open descriptor (entered once per shard in a row),
    ``file(shard)`` a callable naming the shard in the error of a short read."""
    out: list[bytes | memoryview] = [b""] * len(offsets)
    current = descriptor = name = None
    with contextlib.ExitStack() as held:
        for shard, first, size, lead, members in plan_runs(shards.tolist(), offsets.tolist(), sizes.tolist()):
            if shard != current:
                held.close()  # the shard before, done with
                current, descriptor, name = shard, held.enter_context(opened(shard)), file(shard)
            data = read_exact(descriptor, size, first, name)
            if members is None:
                out[lead] = data  # the member itself: no view
                continue
            view = memoryview(data)
            for member, at, length in members:
                out[member] = view[at:at + length]
    return out
