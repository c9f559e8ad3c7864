"""Which samples each DataLoader worker of each distributed rank reads in one epoch.

Pure functions of the shard sample counts, ``(seed, epoch)``, the rank and the worker, so
every process computes its share without communicating, and every sample of the epoch goes
to exactly one ``(rank, worker)``.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np



def shard_order(count: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The epoch's shard order, identical on every rank and worker."""
    if not shuffle:
        return np.arange(count)
    return np.random.default_rng([seed, epoch, 0x7A5]).permutation(count)


def split_pieces(
    counts: np.ndarray,
    order: np.ndarray,
    *,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    even: bool = False,
) -> tuple[list[tuple[int, int, int]], bool]:
    """The ``(shard, start, stop)`` sample ranges one consumer reads, and whether shards were split.

    Consumers are ``rank * num_workers + worker``. With at least as many shards as consumers,
    each takes whole shards round-robin from ``order``. Otherwise (or with ``even``) the
    samples, concatenated in ``order``, are cut into contiguous ranges: one per consumer, or
    with ``even`` exactly ``N // world_size`` per rank, split alike on every rank.
    """
    consumers = world_size * num_workers
    consumer = rank * num_workers + worker
    if not even and len(counts) >= consumers:
        return [(int(s), 0, int(counts[s])) for s in order[consumer::consumers] if counts[s]], False
    total = int(counts.sum())
    if even:
        quota = total // world_size
        start = rank * quota + quota * worker // num_workers
        stop = rank * quota + quota * (worker + 1) // num_workers
    else:
        start, stop = total * consumer // consumers, total * (consumer + 1) // consumers
    pieces, position = [], 0
    for shard in order.tolist():
        low, high = max(start, position), min(stop, position + int(counts[shard]))
        if low < high:
            pieces.append((shard, low - position, high - position))
        position += int(counts[shard])
    return pieces, not even


def buffer_shuffle(items: Iterator[Any], size: int, rng: np.random.Generator) -> Iterator[Any]:
    """webdataset-style shuffle: keep ``size`` items, emit a random one as each new one arrives."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        slot = int(rng.integers(size))
        yield buffer[slot]
        buffer[slot] = item
    rng.shuffle(buffer)
    yield from buffer
