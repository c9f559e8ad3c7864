"""Batches that leave a torch DataLoader worker without a copy, in reused shared memory.

A DataLoader worker sends each batch to the training process by pickling it: a tensor whose
memory is not shared yet is first copied into a new shared-memory segment, then its descriptor
is sent. torch's own ``default_collate`` saves the copy by stacking straight into a new segment;
a fastdata reader builds the batch itself (one vectorised read, the fused decode writing each
image into its row), so in a worker of the ``torch`` backend it writes the pixels straight into
shared memory too (:func:`share_batches`, called by that backend's ``worker_init_fn``).

A new segment per batch still costs: the kernel hands out and zeroes every page on first write
(``benchmarks/bench_handover.py``: 8.4 ms for a 9.6 MB batch into a new segment, 0.3 ms into one
written before, on the machine of docs/reading.md).
So each worker keeps a few segments (:class:`BatchSlots`, ``prefetch_factor + 2``) and writes a
batch into one the training process has let go of: a segment starts with a 64-byte header
(:data:`MAGIC`, worker, slot, a random token), the batch's tensor is a view after it, and the
worker marks the slot taken with the token in a table in shared memory. The loader, in the
training process, watches each batch's storage (:meth:`BatchSlots.received`); once no tensor
there uses it any more (views included: torch's ``StorageWeakRef``), it clears the slot
(:meth:`BatchSlots.poll`) and the worker may write there again. A batch the loop keeps is never
written over; when every slot is taken the worker takes a new segment, as a DataLoader does.

Workers that are not persistent end with their epoch, and a new loader starts new ones: their
segments would be new pages again every epoch. So the training process maps each slot's segment
too (:attr:`BatchSlots.segments`, one mapping per segment: a fifth header word names it), and
when an epoch ran to its end it gives back the segments of the slots it has let go of
(:meth:`BatchSlots.release`); the loader keeps them for the next workers it starts
(:mod:`fastdata.loading.spares`), which inherit them when forked (a spawned worker starts
without: a segment pickled to it would come back as the training process's own mapping, which
never lets go).
Only a batch that leaves the worker as read uses a slot (a ``batch_transform`` or a per-sample
transform make new tensors; those batches get a new segment each). The process backend passes
its own ``allocate`` (its ring) and is unaffected.

>>> array = shared_allocate((2, 3), np.uint8)
>>> as_tensor(array).untyped_storage().is_shared(), as_tensor(np.zeros((2, 3), np.uint8)).is_shared()
(True, False)
"""

from __future__ import annotations

import os
import threading
from math import prod
from typing import Any, Callable, Sequence

import numpy as np
import torch

from fastdata.machine import populate, shared_memory_full

__all__ = ["BatchSlots", "SlotConvert", "as_tensor", "default_allocate", "share_batches", "shared_allocate",
           "slot_header"]

MAGIC = 0x6661737464617461  # b"fastdata": the first word of a slot's header
HEADER = 64  # bytes before a slot's batch (aligned for any dtype)

_WORKER: _WorkerSlots | None = None  # set in a torch DataLoader worker by share_batches()
_SHARED = False


def share_batches(slots: BatchSlots | None = None, worker_id: int = 0) -> None:
    """In this process (a DataLoader worker), readers build batches in shared memory, reusing
    ``slots``' segments (row ``worker_id``) where given."""
    global _SHARED, _WORKER
    _SHARED = True
    _WORKER = _WorkerSlots(slots, worker_id) if slots is not None else None


def default_allocate(as_read: bool = False) -> Callable | None:
    """The ``allocate`` a reader uses when its caller passes none: in a DataLoader worker of the
    ``torch`` backend, one into shared memory (a reused slot when ``as_read``: the batch's pixels
    leave as this tensor), else None (plain memory)."""
    if not _SHARED:
        return None
    return _WORKER.allocate if as_read and _WORKER is not None else shared_allocate


def _shared_tensor(nbytes: int) -> torch.Tensor | None:
    try:
        return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes))
    except RuntimeError as exc:
        if "No space left on device" in str(exc):  # /dev/shm is full: so would the DataLoader's copy be
            raise shared_memory_full(nbytes, "a batch") from None  # (its failure is lost and the loop hangs)
        return None  # no shared memory here
    except (AttributeError, TypeError):  # a torch without it
        return None


def _array(data: torch.Tensor, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The uint8 tensor ``data`` seen as a C-contiguous array of ``shape`` and ``dtype`` (its
    ``base`` a tensor: :func:`as_tensor` gives that back)."""
    return data.view(torch.from_numpy(np.empty(0, dtype)).dtype).view(shape).numpy()


def shared_allocate(shape: tuple[int, ...], dtype: Any) -> np.ndarray | None:
    """A C-contiguous array of ``shape`` in a new shared-memory tensor (what ``default_collate``
    stacks into in a worker), or None where torch cannot make one (the caller then allocates)."""
    dtype = np.dtype(dtype)
    tensor = _shared_tensor(prod(shape) * dtype.itemsize)
    return None if tensor is None else _array(tensor, shape, dtype)


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy(array)``, except that an array made in shared memory here gives back
    its shared tensor (``from_numpy`` would wrap the same memory in storage torch does not know
    is shared, and the DataLoader would copy it again)."""
    base = array.base
    if (isinstance(base, torch.Tensor) and tuple(base.shape) == array.shape and base.is_contiguous()
            and array.flags.c_contiguous and base.data_ptr() == array.ctypes.data):
        return base
    return torch.from_numpy(array)


class BatchSlots:
    """The slots of one set of a torch-backend loader's workers (one epoch's, or the persistent
    ones'): a ``(num_workers, slots)`` table of tokens (0: free) in shared memory, and, in the
    training process, the batches handed out, whose slots are cleared once nothing uses them.
    Pickled to spawned workers (the table only); forked ones inherit :attr:`segments` too."""

    def __init__(self, num_workers: int, slots: int, given: Sequence[Any] = ()):
        self.table = torch.zeros((num_workers, slots), dtype=torch.int64).share_memory_()
        self._watched: list[tuple[Any, int, int, int]] = []  # (StorageWeakRef, worker, slot, token)
        self._lock = threading.Lock()
        # (worker, slot) -> (segment id, this process's own mapping of the slot's segment): what
        # the workers start with (``given``, spread over the workers) and what they wrote in since
        self.segments: dict[tuple[int, int], tuple[int, Any]] = {}
        for index, storage in enumerate(given[:num_workers * slots]):
            self.segments[(index % num_workers, index // num_workers)] = (_segment_id(storage), storage)

    def __getstate__(self) -> dict[str, Any]:
        return {"table": self.table}  # no segments: a spawned worker makes its own

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.table = state["table"]
        self._watched, self._lock, self.segments = [], threading.Lock(), {}

    def received(self, batch: Any) -> None:
        """Watch the slots ``batch``'s tensors were written in (a tuple, list or dict of them)."""
        from torch.multiprocessing.reductions import StorageWeakRef

        values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else (batch,)
        found = []
        for value in values:
            header = slot_header(value)
            if header is not None and 0 <= header[1] < self.table.shape[0] and 0 <= header[2] < self.table.shape[1]:
                _, worker, slot, token, segment = header
                found.append((StorageWeakRef(value.untyped_storage()), worker, slot, token))
                if self.segments.get((worker, slot), (0,))[0] != segment:  # a segment new to this slot
                    mapping = _own_mapping(value.untyped_storage())
                    if mapping is not None:
                        self.segments[(worker, slot)] = (segment, mapping)
        with self._lock:
            self._watched.extend(found)

    def poll(self) -> None:
        """Clear the slot of every watched batch whose storage nothing uses any more."""
        with self._lock:
            kept = []
            for ref, worker, slot, token in self._watched:
                if not ref.expired():
                    kept.append((ref, worker, slot, token))
                elif int(self.table[worker, slot]) == token:
                    self.table[worker, slot] = 0
            self._watched = kept

    def release(self) -> list[Any]:
        """The segments of the slots the loop has let go of, no longer mapped by these slots
        (call it once the workers have ended: a running worker may take a free slot again). A slot
        still taken (a batch held, or one in flight that never arrived) keeps its segment to
        itself, so a batch held is never given to new workers to write over."""
        self.poll()
        with self._lock:
            free = [storage for (worker, slot), (_, storage) in sorted(self.segments.items())
                    if int(self.table[worker, slot]) == 0]
            self.segments = {}
        return free


def _segment_id(storage: Any) -> int:
    """The id a worker wrote in the header of a slot segment (0: none)."""
    header = _header(storage)
    return 0 if header is None else header[4]


def _header(storage: Any) -> tuple[int, int, int, int, int] | None:
    """(magic, worker, slot, token, segment id) at the start of a slot segment, else None."""
    if storage.nbytes() < HEADER:
        return None
    words = torch.empty(0, dtype=torch.int64).set_(storage, 0, (5,), (1,)).tolist()
    return tuple(words) if words[0] == MAGIC else None


def _own_mapping(storage: Any) -> Any:
    """A second mapping of a segment received from a worker: a storage of its own, so the batch's
    storage still dies when the loop lets go of it (torch's file-descriptor sharing; None with
    any other strategy, where ``_share_fd_cpu_`` would copy the batch into a new segment)."""
    import torch.multiprocessing

    if torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        return None
    try:
        fd, size = storage._share_fd_cpu_()
        return torch.UntypedStorage._new_shared_fd_cpu(fd, size)
    except (AttributeError, RuntimeError, TypeError):  # a torch without them
        return None


def slot_header(value: Any) -> tuple[int, int, int, int, int] | None:
    """(magic, worker, slot, token, segment id) of a tensor written in a slot, else None."""
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" \
            or value.storage_offset() * value.element_size() != HEADER:
        return None
    storage = value.untyped_storage()
    return _header(storage) if storage.is_shared() else None


class _WorkerSlots:
    """One worker's segments: ``allocate`` writes into a free slot of the shared table's row (the
    smallest segment that holds the batch), a new segment where none is free."""

    def __init__(self, slots: BatchSlots, worker_id: int):
        self.table = slots.table[worker_id]
        self.worker_id = worker_id
        self.segments: list[torch.Tensor | None] = [None] * len(self.table)
        self.ids = [0] * len(self.table)
        self.mapped: set[int] = set()  # slots whose segment's pages this process has mapped (machine.populate)
        for (worker, slot), (segment, storage) in slots.segments.items():  # inherited from the training process
            if worker == worker_id and segment:
                self.segments[slot], self.ids[slot] = torch.empty(0, dtype=torch.uint8).set_(storage), segment

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray | None:
        dtype = np.dtype(dtype)
        nbytes = prod(shape) * dtype.itemsize
        free = [slot for slot in range(len(self.segments)) if int(self.table[slot]) == 0]
        if not free:
            return shared_allocate(shape, dtype)  # the loop holds every slot: a new segment, as a DataLoader does
        fits = [slot for slot in free if self.segments[slot] is not None and self.segments[slot].numel() >= HEADER + nbytes]
        if fits:
            slot = min(fits, key=lambda slot: self.segments[slot].numel())
        else:  # an empty slot, else the smallest segment makes way
            slot = min(free, key=lambda slot: -1 if self.segments[slot] is None else self.segments[slot].numel())
            self.segments[slot] = _shared_tensor(HEADER + nbytes + tail_bytes(shape))
            if self.segments[slot] is None:
                return None
            self.ids[slot] = _random_word()
            self.mapped.discard(slot)
        segment = self.segments[slot]
        if slot not in self.mapped:  # its first batch in this process: the pages mapped in one call
            self.mapped.add(slot)
            populate(segment.data_ptr(), HEADER + nbytes)
        token = _random_word()
        segment[:HEADER].view(torch.int64)[:5] = torch.tensor([MAGIC, self.worker_id, slot, token, self.ids[slot]])
        self.table[slot] = token  # taken until the training process has let go of this batch
        return _array(segment[HEADER:HEADER + nbytes], shape, dtype)


def tail_bytes(shape: tuple[int, ...]) -> int:
    """Room kept after a slot's batch for an int64 per row (its labels: :class:`SlotConvert`)."""
    return -(-8 * (shape[0] if shape else 1) // 64) * 64


class SlotConvert:
    """The torch backend's ``collate_fn`` where batches leave in slots: what a DataLoader with
    ``batch_size=None`` does to a batch (``default_convert``), then each small plain tensor of it
    (the labels) copied into the room after the pixels in their slot. The batch then leaves the
    worker as one shared segment: one descriptor sent and received, where the labels alone took
    a new segment and a second descriptor every batch (about 0.7 ms of CPU a batch between the
    worker and the training process, ``benchmarks/bench_handover.py``). Picklable."""

    def __call__(self, batch: Any) -> Any:
        from torch.utils.data import default_convert

        batch = default_convert(batch)
        if isinstance(batch, list):
            return into_slot_tail(batch)
        return batch


def into_slot_tail(values: list[Any]) -> list[Any]:
    """``values`` with each plain CPU tensor not in shared memory replaced by a copy in the room
    after the slot tensor among them (the first value written in a slot), where it fits."""
    slot = next((value for value in values if slot_header(value) is not None), None)
    if slot is None:
        return values
    storage = slot.untyped_storage()
    used = HEADER + slot.numel() * slot.element_size()
    out = []
    for value in values:
        if type(value) is torch.Tensor and value is not slot and value.device.type == "cpu" \
                and not value.is_shared() and value.numel():
            start = -(-used // value.element_size()) * value.element_size()  # aligned for its dtype
            end = start + value.numel() * value.element_size()
            if end <= storage.nbytes():
                moved = torch.empty(0, dtype=value.dtype).set_(storage, start // value.element_size(), value.shape)
                value = moved.copy_(value)
                used = end
        out.append(value)
    return out


def _random_word() -> int:
    """A random positive int64 (a token or a segment id; never 0)."""
    return int.from_bytes(os.urandom(8), "little") >> 1 or 1
