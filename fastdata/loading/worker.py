"""The loop a ``process`` backend worker runs.

At the start of each epoch the worker receives its share of the batches (batch ``b`` goes to
worker ``b % num_workers``) over its task pipe. For each one it waits for a free slot (a
semaphore the consumer releases, with the slot's number in the control block's free ring),
computes the batch straight into the slot where the dataset can, writes a few hundred bytes
saying where the arrays lie into the control block's next header, and releases the "ready"
semaphore. No message per batch, no pickled pixels. A batch that does not fit (the first one,
before any slot exists; a larger one later) is built on the worker's heap; its header asks
for slots of the size it needs (``NEEDS_SLOTS``), the consumer sends a new segment, and the
worker copies the batch in and releases "ready" again for the same header. Only what holds no
arrays, and errors, go through the result pipe.

Slots come back to the worker in the order the consumer frees them, not in the order it filled
them: a batch lent to the training loop frees its slot when the loop drops it. So the free
ring carries slot numbers, and each header names the slot (and the segment generation) its
batch lies in.

Control block: ``slots`` headers of ``HEADER_BYTES`` (header ``j`` describes the worker's
``j``-th batch modulo ``slots``), then the free ring, ``slots`` uint32 slot numbers.

Task pipe messages (pickled): ``("epoch", [indices, ...])``, ``("segment", name, slot_bytes, generation)``;
an empty message stops the worker. Result pipe messages: ``("pickled", number, data)`` (a batch
without arrays to place) or ``("error", number, text, exception)``.
"""

from __future__ import annotations

import os
import pickle
import random
import struct
import traceback
from typing import Any, Callable

import numpy as np
import torch

from fastdata.loading import shm
from fastdata.machine import become_worker, populate, release_free_memory

HEADER_BYTES = 8192  # per slot in the control block: status, then the packed batch's header
STATUS = struct.Struct("<BIIQ")  # kind, slot, segment generation, header length
FREE = struct.Struct("<I")  # one entry of the free ring: a slot number
IN_SLOT, IN_PIPE, NEEDS_SLOTS = 1, 2, 3  # NEEDS_SLOTS: the header's length field is the slot size needed
_WAIT_S = 0.1


def set_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any) -> None:
    """``torch.utils.data.get_worker_info()`` in this process, as a DataLoader worker has it."""
    from torch.utils.data._utils import worker as torch_worker

    torch_worker._worker_info = torch_worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                                        dataset=dataset)


def seed_worker(base_seed: int, worker_id: int) -> int:
    """Seed ``random``, torch and numpy the way a DataLoader worker is seeded; the torch seed."""
    from torch.utils.data._utils.worker import _generate_state

    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(_generate_state(base_seed, worker_id))
    return seed


class _Stop(Exception):
    pass


class _Worker:
    """One worker's state: its pipes, semaphores, control block and current data segment."""

    def __init__(self, worker_id: int, num_workers: int, fetch: Any, tasks: Any, results: Any, free: Any,
                 ready: Any, control: str, slots: int):
        self.worker_id, self.num_workers, self.fetch = worker_id, num_workers, fetch
        self.tasks, self.results, self.free, self.ready = tasks, results, free, ready
        self.control = shm.attach(control)
        self.slots = slots
        self.segment = None
        self.slot_bytes = 0
        self.generation = 0
        self.attached = 0  # segment messages received: each NEEDS_SLOTS is answered by exactly one
        self.produced = 0  # batches made in this worker's life: batch j's header is j % slots
        self.taken = 0  # slots taken from the free ring
        self.slot = 0  # the slot the next batch goes into
        self.mapped: set[int] = set()  # slots of the current segment whose pages this process has mapped

    def run(self) -> None:
        while True:
            message = self._next_message(block=True)
            if message[0] == "epoch":
                for number, indices in message[1]:
                    self._wait_for_slot()
                    self._produce(number, indices)

    def _next_message(self, *, block: bool) -> tuple:
        """The next control message (``None``-like when there is none and not ``block``)."""
        while True:
            if not block and not self.tasks.poll(0):
                return ("none",)
            try:
                message = self.tasks.recv_bytes()
            except (EOFError, OSError):  # the main process is gone
                raise _Stop from None
            if not message:
                raise _Stop
            parsed = pickle.loads(message)
            if parsed[0] == "segment":
                self._attach(*parsed[1:])
                continue
            return parsed

    def _attach(self, name: str, slot_bytes: int, generation: int) -> None:
        if self.segment is not None:
            shm.release(self.segment, unlink=False)
        self.segment, self.slot_bytes, self.generation = shm.attach(name), slot_bytes, generation
        self.mapped = set()
        self.attached += 1

    def _wait_for_slot(self) -> None:
        while not self.free.acquire(timeout=_WAIT_S):
            if os.getppid() == 1:
                raise _Stop
            self._next_message(block=False)  # a new segment, or stop
        ring = self.slots * HEADER_BYTES + (self.taken % self.slots) * FREE.size
        (self.slot,) = FREE.unpack_from(self.control.buf, ring)
        self.taken += 1
        self._next_message(block=False)

    def _writer(self, slot: int) -> shm.SlotWriter | None:
        if self.segment is None:
            return None
        buffer = np.frombuffer(self.segment.buf, dtype=np.uint8, count=self.slot_bytes, offset=slot * self.slot_bytes)
        if slot not in self.mapped:  # its first batch in this process: the slot's pages mapped in one call
            self.mapped.add(slot)
            populate(buffer.ctypes.data, self.slot_bytes)
        return shm.SlotWriter(buffer)

    def _await_slots(self, status: memoryview, slot: int, needed: int) -> shm.SlotWriter:
        """Ask the consumer for slots of ``needed`` bytes and wait for its answer (a segment
        message; "ready" is released again only after it, so the consumer never sees this
        header change under it)."""
        STATUS.pack_into(status, 0, NEEDS_SLOTS, slot, self.generation, needed)
        self.ready.release()
        answered = self.attached + 1
        while self.attached < answered:
            while not self.tasks.poll(_WAIT_S):
                if os.getppid() == 1:
                    raise _Stop
            self._next_message(block=False)  # the segment (nothing else comes mid-epoch), or stop
        return self._writer(slot)

    def _produce(self, number: int, indices: np.ndarray) -> None:
        """Batch ``number`` into the slot taken from the free ring, described in header
        ``produced % slots``; "ready" is released once the consumer can take it: after the slot is
        written, or before a pipe message (so the consumer reads while a large one is being sent)."""
        slot, header_at = self.slot, self.produced % self.slots
        self.produced += 1
        status = memoryview(self.control.buf)[header_at * HEADER_BYTES : (header_at + 1) * HEADER_BYTES]
        message = batch = None
        needed = 0
        try:
            writer = self._writer(slot)
            batch = self.fetch(indices, allocate=writer.allocate if writer is not None else None)
            header = writer.pack(batch) if writer is not None else None
            needed = shm.needed_bytes(batch) if header is None else 0
            if needed:  # built on the heap: copied into new slots (the heap is given back below)
                header = self._await_slots(status, slot, needed).pack(batch)
            if header is not None and STATUS.size + len(header) <= HEADER_BYTES:
                STATUS.pack_into(status, 0, IN_SLOT, slot, self.generation, len(header))
                status[STATUS.size : STATUS.size + len(header)] = header
            else:
                data = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
                message = pickle.dumps(("pickled", number, data))
        except _Stop:
            raise
        except Exception as exc:
            message = error_message(number, exc, "batch")
        if message is not None:
            STATUS.pack_into(status, 0, IN_PIPE, slot, self.generation, 0)
        status.release()
        self.ready.release()
        if message is not None:
            try:
                self.results.send_bytes(message)
            except (OSError, EOFError):  # the consumer is gone
                raise _Stop from None
        if needed or message is not None:
            del message, batch
            release_free_memory()  # the batch was built on the heap: do not hold it for life


def worker_main(worker_id: int, num_workers: int, fetch: Any, tasks: Any, results: Any, free: Any, ready: Any,
                control: str, slots: int, base_seed: int, init_fn: Callable[[int], None] | None,
                parent_ends: list[Any] = ()) -> None:
    """Entry point of one worker process (also under spawn: everything here is picklable)."""
    become_worker()
    for end in parent_ends:  # pipe ends that belong to the main process (inherited under fork)
        end.close()
    torch.set_num_threads(1)
    seed = seed_worker(base_seed, worker_id)
    set_worker_info(worker_id, num_workers, seed, fetch.dataset)
    if init_fn is not None:
        try:
            init_fn(worker_id)
        except Exception as exc:  # reported when the first batch is awaited
            try:
                results.send_bytes(error_message(-1, exc, "worker_init_fn"))
            except (OSError, EOFError):
                pass
            return
    try:
        worker = _Worker(worker_id, num_workers, fetch, tasks, results, free, ready, control, slots)
    except FileNotFoundError:  # its control block is gone: the loader retired it before it started (an
        return                 # epoch with fewer batches than workers ended first); nothing to do or say
    try:
        worker.run()
    except _Stop:
        pass
    finally:
        for segment in (worker.segment, worker.control):
            if segment is not None:
                shm.release(segment, unlink=False)


def error_message(number: int, exc: BaseException, stage: str) -> bytes:
    """The pickled ``("error", ...)`` message for an exception (its text travels even when the
    exception itself does not pickle)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    try:
        payload = pickle.dumps(exc)
        pickle.loads(payload)
    except Exception:  # noqa: BLE001
        payload = None
    return pickle.dumps(("error", number, f"{stage} in worker pid {os.getpid()}:\n{text}", payload))
