"""Slot segments of closed ``process`` loaders, kept for the next loader of the same process.

A new segment's pages are allocated and zeroed by the kernel at their first write: about 1 ms
per MB on a VM (a 9.6 MB batch of 64 224x224 images: 8.4 ms against 0.3 ms into pages written
before; benchmarks/bench_handover.py). A loader keeps its segments across epochs, but a new
loader (one per epoch, a ``num_workers="auto"`` change of setting, a sweep) would pay it for every
slot of every worker again. So a closed loader's slot segments wait here for the next loader's
workers, up to :func:`spare_limit` bytes in all; they are removed at exit (and, like every
fastdata segment, by the next loader's sweep if this process is killed: their names carry its
pid). A segment in which the loop still holds lent batches (``for images, labels in loader``
keeps the last batch bound after the loop, when the next epoch's loader starts) is kept too,
mapped, with the leases of those batches (:class:`Kept`): the next loader whose slots have the
same size takes it with those slots marked lent, and its workers write into them only once the
loop has dropped the batches. A segment with views that are not leases (``zero_copy``) is not
kept.

The ``torch`` backend's DataLoader workers write into segments of torch's own (unnamed: an open
file descriptor is their only handle, :mod:`fastdata.reader.handover`); those of an epoch that ran
to its end wait here too, as this process's mappings of them (:func:`keep_storages`), for the
next workers the loader starts (:func:`take_storages`). The same limit counts both kinds.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

from fastdata.loading.shm import Segment, attach, segment_prefix, unlink_name
from fastdata.machine import SHM_DIR

SPARE_ENV = "FASTDATA_SHM_SPARE_BYTES"


@dataclass
class Kept:
    """A process-backend segment kept for the next loader: unmapped here (``segment`` None), or
    still mapped because the loop holds lent batches in it: ``held`` maps the offset of each
    such batch's slot to a weakref to its lease, valid for slots of ``slot_bytes``."""

    name: str
    segment: Segment | None = None
    slot_bytes: int = 0
    held: dict[int, Any] = field(default_factory=dict)

    def alive(self) -> dict[int, Any]:
        """The held slots' leases still alive, by offset."""
        return {offset: lease for offset, ref in self.held.items() if (lease := ref()) is not None}

    def drop(self) -> None:
        unlink_name(self.name)
        if self.segment is not None:
            self.segment.close()  # the mapping goes with the last batch held in it


# kept segments, newest last: (Kept, size, pid) of the process backend's and (storage, size, pid)
# of the torch backend's, mapped here
_spare: list[tuple[Any, int, int]] = []
_spare_lock = threading.Lock()
_slot_sizes: dict[tuple, int] = {}  # see slot_size
_SLOT_SIZES_KEPT = 16
_exiting = False


def spare_limit() -> int:
    """Bytes of closed loaders' segments kept for the next loader: ``FASTDATA_SHM_SPARE_BYTES``,
    else 1/16 of the RAM, at most 2 GiB and a quarter of /dev/shm (a container's is 64 MB)."""
    value = os.environ.get(SPARE_ENV)
    if value is not None and value.strip().isdigit():
        return int(value)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        ram = 0
    try:
        stats = os.statvfs(SHM_DIR)
        shm_bytes = stats.f_blocks * stats.f_frsize
    except (OSError, AttributeError):  # pragma: no cover - no /dev/shm (macOS)
        shm_bytes = ram
    return min(2 * 2**30, ram // 16, shm_bytes // 4)


def _own(name: str) -> bool:
    return name.startswith(segment_prefix())


def keep_spare(segment: Segment, slot_bytes: int = 0, leases: Sequence[Any] | None = None) -> bool:
    """Keep a closed loader's data segment for the next loader (False: not kept, the caller
    releases it): unmapped here when no view of it is alive; else, when ``leases`` (the lent
    batches' leases of the loader, slots of ``slot_bytes``) account for its views, mapped, with
    those of them that lie in it (:class:`Kept`). Only a segment this process created, while it
    is not exiting, within :func:`spare_limit` (the oldest kept ones make room)."""
    limit = spare_limit()
    if segment.size > limit or not _own(segment.name):
        return False
    with _spare_lock:
        if _exiting:
            return False
        try:
            segment.map.close()
            kept = Kept(segment.name)
        except BufferError:  # batches in it are still held
            held = _held_in(segment, slot_bytes, leases)
            if not held:  # views, and no lease of the loader's in it: its memory goes with them, never reused
                return False
            kept = Kept(segment.name, segment, slot_bytes, held)
        _spare.append((kept, segment.size, os.getpid()))
        _evict(limit)
    return True


def _held_in(segment: Segment, slot_bytes: int, leases: Sequence[Any] | None) -> dict[int, Any] | None:
    """Offset -> weakref of each lease that lies in ``segment`` at the start of a slot of
    ``slot_bytes`` (None: no leases given, or one of them lies elsewhere in it)."""
    if leases is None or not slot_bytes:
        return None
    base = segment.address
    held = {}
    for lease in leases:
        offset = ctypes.addressof(lease) - base
        if 0 <= offset < segment.size:
            if offset % slot_bytes:
                return None
            held[offset] = weakref.ref(lease)
    return held


def _evict(limit: int) -> None:
    """Drop the oldest kept segments until those left hold at most ``limit`` bytes (lock held)."""
    while sum(size for _, size, _ in _spare) > limit:
        item, _, _ = _spare.pop(0)
        if isinstance(item, Kept):
            item.drop()
        # (a storage's memory goes with the last mapping of it)


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
        mine = [entry for entry in _spare if not isinstance(entry[0], Kept) and entry[2] == os.getpid()]
        chosen = mine[::-1][:count]
        for entry in chosen:
            _spare.remove(entry)
    return [storage for storage, _, _ in chosen]


def take_spare(min_bytes: int, slot_bytes: int = 0, max_held: int = 0) -> tuple[Segment, dict[int, Any]] | None:
    """The smallest kept segment of at least ``min_bytes``, mapped here and no longer kept, and
    the leases of the batches the loop still holds in it, by offset (None: none fits). A segment
    with batches held is taken only for slots of the size it was kept with (``slot_bytes``), with
    at most ``max_held`` of them held, all within the first ``min_bytes``: each held batch fills
    one of the caller's slots, which it keeps from its workers until the batch is dropped."""

    def usable(kept: Kept) -> bool:
        held = kept.alive()
        return not held or (kept.slot_bytes == slot_bytes and len(held) <= max_held
                            and all(offset + slot_bytes <= min_bytes for offset in held))

    with _spare_lock:
        fits = [entry for entry in _spare if isinstance(entry[0], Kept) and entry[1] >= min_bytes
                and _own(entry[0].name) and usable(entry[0])]
        if not fits:
            return None
        chosen = min(fits, key=lambda entry: entry[1])
        _spare.remove(chosen)
    kept = chosen[0]
    held = kept.alive()
    if kept.segment is not None:
        return kept.segment, held
    try:
        return attach(kept.name), held
    except OSError:  # removed from /dev/shm by someone else
        return None


def slot_size(key: tuple) -> int:
    """The slot size a process loader of ``key`` (id of its dataset, batch size, slots per worker)
    last gave its workers (0: none): where a segment of that size is kept, a new loader's workers
    start in it (``ProcessLoader._take_kept``)."""
    with _spare_lock:
        return _slot_sizes.get(key, 0)


def remember_slot_size(key: tuple, slot_bytes: int) -> None:
    """Note the slot size a process loader of ``key`` gave a worker (the newest
    ``_SLOT_SIZES_KEPT`` keys are kept)."""
    with _spare_lock:
        _slot_sizes.pop(key, None)
        _slot_sizes[key] = slot_bytes  # the newest last: the oldest make room
        while len(_slot_sizes) > _SLOT_SIZES_KEPT:
            del _slot_sizes[next(iter(_slot_sizes))]


def spares() -> list[str]:
    """Names of the process backend's segments kept for the next loader."""
    with _spare_lock:
        return [item.name for item, _, _ in _spare if isinstance(item, Kept)]


def kept_storages() -> int:
    """How many torch-backend segments are kept for the next workers."""
    with _spare_lock:
        return sum(not isinstance(item, Kept) for item, _, _ in _spare)


def clear_spares(*, exiting: bool = False) -> None:
    """Remove every kept segment (at exit none is kept after; a forked child's exit leaves its
    parent's alone)."""
    global _exiting
    with _spare_lock:
        _exiting = _exiting or exiting
        kept, _spare[:] = list(_spare), []
    for item, _, _ in kept:
        if isinstance(item, Kept) and _own(item.name):
            item.drop()


atexit.register(clear_spares, exiting=True)
