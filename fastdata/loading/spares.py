"""Slot segments of closed ``process`` loaders, kept for the next loader of the same process.

A new segment's pages are allocated and zeroed by the kernel at their first write: about 1 ms
per MB on a VM (a 9.6 MB batch of 64 224x224 images: 8.4 ms against 0.3 ms into pages written
before; benchmarks/bench_handover.py). A loader keeps its segments across epochs, but a new
loader (one per epoch, a ``num_workers="auto"`` change of setting, a sweep) would pay it for every
slot of every worker again. So a closed loader's slot segments, when no batch of theirs is still
held, wait here for the next loader's workers, up to :func:`spare_limit` bytes in all; they are
removed at exit (and, like every fastdata segment, by the next loader's sweep if this process is
killed: their names carry its pid).

The ``torch`` backend's DataLoader workers write into segments of torch's own (unnamed: an open
file descriptor is their only handle, :mod:`fastdata.reader.handover`); those of an epoch that ran
to its end wait here too, as this process's mappings of them (:func:`keep_storages`), for the
next workers the loader starts (:func:`take_storages`). The same limit counts both kinds.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from fastdata.loading.shm import PREFIX, Segment, attach, unlink_name

SPARE_ENV = "FASTDATA_SHM_SPARE_BYTES"
# kept segments, newest last: (name, size, pid) of the process backend's, unmapped here, and
# (storage, size, pid) of the torch backend's, mapped here
_spare: list[tuple[Any, int, int]] = []
_spare_lock = threading.Lock()
_exiting = False


def spare_limit() -> int:
    """Bytes of closed loaders' segments kept for the next loader: ``FASTDATA_SHM_SPARE_BYTES``,
    else 1/16 of the RAM, at most 2 GiB."""
    value = os.environ.get(SPARE_ENV)
    if value is not None and value.strip().isdigit():
        return int(value)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        ram = 0
    return min(2 * 2**30, ram // 16)


def _own(name: str) -> bool:
    return name.startswith(f"{PREFIX}{os.getpid()}_")


def keep_spare(segment: Segment) -> bool:
    """Keep a closed loader's data segment for the next loader, unmapped here (False: not kept,
    the caller releases it). Only a segment no view of which is alive (its mapping closes: no
    batch of it is held), that this process created, while it is not exiting, within
    :func:`spare_limit` (the oldest kept ones make room)."""
    limit = spare_limit()
    if segment.size > limit or not _own(segment.name):
        return False
    with _spare_lock:
        if _exiting:
            return False
        try:
            segment.map.close()
        except BufferError:  # a batch in it is still held: its memory goes with it, never reused
            return False
        _spare.append((segment.name, segment.size, os.getpid()))
        _evict(limit)
    return True


def _evict(limit: int) -> None:
    """Drop the oldest kept segments until those left hold at most ``limit`` bytes (lock held)."""
    while sum(size for _, size, _ in _spare) > limit:
        item, _, _ = _spare.pop(0)
        if isinstance(item, str):
            unlink_name(item)  # a storage's memory goes with the last mapping of it


def keep_storages(storages: list[Any]) -> None:
    """Keep a torch-backend loader's segments (this process's mappings of them, torch storages)
    for the next workers it starts, within :func:`spare_limit` (the oldest kept make room)."""
    limit = spare_limit()
    with _spare_lock:
        if _exiting:
            return
        _spare.extend((storage, storage.nbytes(), os.getpid()) for storage in storages if storage.nbytes() <= limit)
        _evict(limit)


def take_storages(count: int) -> list[Any]:
    """Up to ``count`` kept torch-backend segments, newest first, no longer kept (a forked
    child never takes its parent's: the parent may give them to its own workers)."""
    with _spare_lock:
        mine = [entry for entry in _spare if not isinstance(entry[0], str) and entry[2] == os.getpid()]
        chosen = mine[::-1][:count]
        for entry in chosen:
            _spare.remove(entry)
    return [storage for storage, _, _ in chosen]


def take_spare(min_bytes: int) -> Segment | None:
    """The smallest kept segment of at least ``min_bytes``, mapped here and no longer kept (None:
    none fits)."""
    with _spare_lock:
        fits = [entry for entry in _spare if isinstance(entry[0], str) and entry[1] >= min_bytes and _own(entry[0])]
        if not fits:
            return None
        chosen = min(fits, key=lambda entry: entry[1])
        _spare.remove(chosen)
    try:
        return attach(chosen[0])
    except OSError:  # removed from /dev/shm by someone else
        return None


def spares() -> list[str]:
    """Names of the process backend's segments kept for the next loader."""
    with _spare_lock:
        return [item for item, _, _ in _spare if isinstance(item, str)]


def kept_storages() -> int:
    """How many torch-backend segments are kept for the next workers."""
    with _spare_lock:
        return sum(not isinstance(item, str) for item, _, _ in _spare)


def clear_spares(*, exiting: bool = False) -> None:
    """Remove every kept segment (at exit none is kept after; a forked child's exit leaves its
    parent's alone)."""
    global _exiting
    with _spare_lock:
        _exiting = _exiting or exiting
        kept, _spare[:] = list(_spare), []
    for item, _, _ in kept:
        if isinstance(item, str) and _own(item):
            unlink_name(item)


atexit.register(clear_spares, exiting=True)
