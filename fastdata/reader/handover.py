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
from typing import Any, Callable

import numpy as np
import torch

__all__ = ["BatchSlots", "as_tensor", "default_allocate", "share_batches", "shared_allocate", "slot_header"]

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
    except (AttributeError, RuntimeError, TypeError):  # a torch without it, or no shared memory here
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
    Pickled to the workers (the table only)."""

    def __init__(self, num_workers: int, slots: int):
        self.table = torch.zeros((num_workers, slots), dtype=torch.int64).share_memory_()
        self._watched: list[tuple[Any, int, int, int]] = []  # (StorageWeakRef, worker, slot, token)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"table": self.table}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.table = state["table"]
        self._watched, self._lock = [], threading.Lock()

    def received(self, batch: Any) -> None:
        """Watch the slots ``batch``'s tensors were written in (a tuple, list or dict of them)."""
        from torch.multiprocessing.reductions import StorageWeakRef

        values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else (batch,)
        found = []
        for value in values:
            header = slot_header(value)
            if header is not None and 0 <= header[1] < self.table.shape[0] and 0 <= header[2] < self.table.shape[1]:
                found.append((StorageWeakRef(value.untyped_storage()), *header[1:]))
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


def slot_header(value: Any) -> tuple[int, int, int, int] | None:
    """(magic, worker, slot, token) of a tensor written in a slot, else None."""
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" \
            or value.storage_offset() * value.element_size() != HEADER:
        return None
    storage = value.untyped_storage()
    if not storage.is_shared() or storage.nbytes() < HEADER:
        return None
    words = torch.empty(0, dtype=torch.int64).set_(storage, 0, (4,), (1,)).tolist()
    return tuple(words) if words[0] == MAGIC else None


class _WorkerSlots:
    """One worker's segments: ``allocate`` writes into a free slot of the shared table's row, a
    new segment where none is free."""

    def __init__(self, slots: BatchSlots, worker_id: int):
        self.table = slots.table[worker_id]
        self.worker_id = worker_id
        self.segments: list[torch.Tensor | None] = [None] * len(self.table)

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray | None:
        dtype = np.dtype(dtype)
        nbytes = prod(shape) * dtype.itemsize
        free = [slot for slot in range(len(self.segments)) if int(self.table[slot]) == 0]
        if not free:
            return shared_allocate(shape, dtype)  # the loop holds every slot: a new segment, as a DataLoader does
        fits = [slot for slot in free if self.segments[slot] is not None and self.segments[slot].numel() == HEADER + nbytes]
        slot = fits[0] if fits else free[0]
        if not fits:
            self.segments[slot] = _shared_tensor(HEADER + nbytes)
            if self.segments[slot] is None:
                return None
        segment = self.segments[slot]
        token = int.from_bytes(os.urandom(8), "little") >> 1 or 1
        segment[:HEADER].view(torch.int64)[:4] = torch.tensor([MAGIC, self.worker_id, slot, token])
        self.table[slot] = token  # taken until the training process has let go of this batch
        return _array(segment[HEADER:], shape, dtype)
