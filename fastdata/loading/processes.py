"""The ``process`` backend: ``num_workers`` processes that write each batch into a ring of
preallocated shared-memory slots.

No per-batch allocation, no pickled pixels, no file descriptor per batch: batch ``b`` goes to
worker ``b % num_workers``, which computes it straight into one of its slots (fastdata's
readers gather or decode into the slot itself) and sends back a few hundred bytes saying where
it lies. By default the consumer lends the slot itself to the training loop: the batch's
tensors are views of it, and the slot goes back to its worker when the loop drops the last of
them (a weakref on the slot's lease), as a DataLoader batch lives in shared memory until it is
dropped. A loop that keeps more batches than the ring can spare gets copies of the rest, so
workers never wait on a batch the loop holds. With ``zero_copy=k`` the batches are views that
stay valid until ``k`` more batches have been drawn, whether dropped or not. It
behaves like the DataLoader users know: the same keyword names (``multiprocessing_context``,
``persistent_workers``, ``prefetch_factor``, ``worker_init_fn``, ``timeout``), per-worker seeds
and ``torch.utils.data.get_worker_info()``; a worker that raises, dies or times out is an error
naming it, the batch and its indices; Ctrl-C stops it cleanly; no shared-memory segment
outlives it (a killed main process's segments are removed by the next loader that starts).
"""

from __future__ import annotations

import copy
import errno
import math
import mmap
import multiprocessing
import pickle
import time
import weakref
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from fastdata.loading import failures, shm, spares
from fastdata.loading.base import BatchLoader, WorkerError
from fastdata.loading.teardown import Lending, cleanup, reap_stopped, retire, shut_down
from fastdata.loading.worker import FREE, HEADER_BYTES, IN_SLOT, NEEDS_SLOTS, STATUS, worker_main
from fastdata.machine import populate, preload_worker_imports, shared_memory_full, spare_core, stop_signals_held

_POLL_S = 0.25  # how often a waiting consumer checks that its worker is alive
# A consumer whose batch is not ready polls for this long before it sleeps, when a core is free for
# it: waking a sleeping process takes tens of microseconds (an inter-processor interrupt, more on a
# VM), and the scheduler tends to wake it on the worker's own core. Raw 32x32 batches of 256 take
# ~90 us to gather: sleeping per batch cost 0.71x num_workers=0 there, polling 0.82-0.86x
# (benchmarks/bench_loaders.py, docs/reading.md). Never where the workers already fill the cores.
_SPIN_S = 0.0005
_SLOT_HEADROOM = 1.1
_SPARE_SLOT_BYTES = 4 * 2**20  # batches up to this size get a spare slot per worker (ProcessLoader._active_slots)


@dataclass
class _Worker:
    process: Any
    tasks: Any
    results: Any
    free: Any  # semaphore: slots the worker may fill
    ready: Any  # semaphore: batches the worker has finished
    control: Any  # shared-memory block: per batch in flight, where it lies; then the free ring
    consumed: int = 0  # batches taken from this worker in its life: batch j's header is j % slots
    given: int = 0  # slot numbers written into its free ring in its life
    asked: float = 0.0  # time.monotonic() when it was asked to stop at the end of an epoch


class ProcessLoader(BatchLoader):
    """Batches computed by worker processes into shared-memory slots (module docstring)."""

    backend = "process"

    def __init__(self, *args: Any, multiprocessing_context: Any = None, zero_copy: int = 0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if isinstance(multiprocessing_context, str) or multiprocessing_context is None:
            multiprocessing_context = multiprocessing.get_context(multiprocessing_context)
        self.context = multiprocessing_context
        self.zero_copy = zero_copy
        # Slots per worker (the most; see _active_slots): prefetch_factor batches in flight, as in a
        # DataLoader, and the batch the loop holds. zero_copy=k: the k views instead.
        if zero_copy:
            self.slots = self.prefetch_factor + math.ceil(zero_copy / self.num_workers)
        else:
            self.slots = self.prefetch_factor + 1
        self.lend_limit = 0 if zero_copy else math.inf  # most batches lent at once per worker (0: copy every one)
        self.spin_s = _SPIN_S if spare_core(self.num_workers) else 0.0
        self._serving = False  # an epoch is under way on this loader's workers
        self._companions: list[ProcessLoader] = []  # loaders serving (or kept for) a second live iterator (below)
        self._own_workers()

    def _own_workers(self) -> None:
        """No workers, segments or slots yet (a new loader, or a companion copied from one)."""
        self._workers: list[_Worker] = []
        self._stopping: list[_Worker] = []  # asked to stop at the end of an epoch; reaped once they exit
        self._all_segments: dict[str, Any] = {}  # owned here: created and unlinked here, by name
        self._lending = Lending(zero_copy=bool(self.zero_copy))
        self._forget_slots()
        self._finalizer = weakref.finalize(self, cleanup, self._workers, self._all_segments, self._lending,
                                           self._stopping)

    def _forget_slots(self) -> None:
        """No data segment yet (the first batch of each worker sizes them) and nothing handed out."""
        # per worker, its data segments (segment, slot bytes) in the order made: generation g is
        # entry g - 1, and the last one is current (the old ones stay: batches may still lie in them)
        self._generations: list[list[tuple[Any, int]]] = [[] for _ in range(self.num_workers)]
        self._lent: list[set[int]] = [set() for _ in range(self.num_workers)]  # slots the loop holds
        self._held: list[tuple[int, int]] = []  # zero_copy: (worker, slot) of the views handed out, oldest first
        self._leases = self._lending.leases = shm.Leases()  # a new one: leases of an earlier life return to the old one
        self._lending.slot_bytes.clear()

    def _slot_bytes(self, worker_id: int) -> int:
        """The size of a worker's current slots (0: none yet)."""
        generations = self._generations[worker_id]
        return generations[-1][1] if generations else 0

    def _active_slots(self, worker_id: int) -> int:
        """The slots a worker uses. With 2+ workers the slot for the batch the loop holds is used
        only for batches up to ``_SPARE_SLOT_BYTES``: a small batch is quick to make, so a worker
        whose last batch is still held must not lose one batch of its lead (raw 32x32 batches at
        2 workers, four runs with both interleaved: 0.73-0.89x num_workers=0 without it,
        0.81-0.98x with it); a large one costs memory (one more batch per worker) and takes long
        enough to make that the lead matters less. A lone worker always has it: its next batch is
        drawn while the loop holds its last one. Slots not used are never written: no memory."""
        return self._slots_used(self._slot_bytes(worker_id))

    def _slots_used(self, slot_bytes: int) -> int:
        """:meth:`_active_slots` for slots of ``slot_bytes`` (0: not sized yet)."""
        if self.zero_copy or self.num_workers == 1 or 0 < slot_bytes <= _SPARE_SLOT_BYTES:
            return self.slots
        return self.slots - 1

    def _free_slots(self, worker_id: int) -> list[int]:
        """The slots a new worker starts with: those it uses that the loop does not hold; at least
        one (the loop may hold batches lent while the worker used one slot more, before its
        batches grew past ``_SPARE_SLOT_BYTES``; fewer than ``slots`` are ever lent at once)."""
        lent = self._lent[worker_id]
        free = [slot for slot in range(self._active_slots(worker_id)) if slot not in lent]
        return free or [min(set(range(self.slots)) - lent)]

    def _may_lend(self, worker_id: int) -> bool:
        """Whether the next batch of a worker may be lent: one of its slots must keep cycling."""
        limit = min(self.lend_limit, self._active_slots(worker_id) - 1)
        return len(self._lent[worker_id]) < limit

    # --- workers --------------------------------------------------------------------------

    def _start(self) -> None:
        if self._workers:
            return
        reap_stopped(self._stopping)
        preload_worker_imports()
        shm.sweep_stale_segments()
        self._take_back()
        base_seed = int(torch.empty((), dtype=torch.int64).random_().item())
        with stop_signals_held():  # a Ctrl-C mid-fork would be lost (see machine.stop_signals_held)
            for worker_id in range(self.num_workers):
                if not self._generations[worker_id]:
                    self._take_kept(worker_id)
                task_read, task_write = self.context.Pipe(duplex=False)
                result_read, result_write = self.context.Pipe(duplex=False)
                free_slots = self._free_slots(worker_id)
                free, ready = _semaphores(self.context, len(free_slots))
                control = shm.new_segment((HEADER_BYTES + FREE.size) * self.slots)
                self._all_segments[control.name] = control
                populate(control.address, control.size, what="a worker's control block")  # no SIGBUS later
                for position, slot in enumerate(free_slots):
                    FREE.pack_into(control.buf, self.slots * HEADER_BYTES + position * FREE.size, slot)
                # the ends this process keeps: a forked worker inherits them and must close them, or a
                # worker blocked writing would never see its reader go (EPIPE)
                parent_ends = [end for worker in self._workers for end in (worker.tasks, worker.results)]
                parent_ends += [worker.tasks for worker in self._stopping]  # (their result ends are closed)
                parent_ends += [task_write, result_read]
                process = self.context.Process(
                    target=worker_main, name=f"fastdata-loader-{worker_id}", daemon=True,
                    args=(worker_id, self.num_workers, self.fetch, task_read, result_write, free, ready,
                          control.name, self.slots, base_seed, self.worker_init_fn, parent_ends),
                )
                process.start()
                task_read.close()
                result_write.close()
                worker = _Worker(process, task_write, result_read, free, ready, control, given=len(free_slots))
                self._workers.append(worker)
                if self._generations[worker_id]:  # slots sized in an earlier epoch
                    self._send_segment(worker_id)

    def _size_key(self) -> tuple[int, int, int]:
        return id(self.fetch.dataset), self.batch_size, self.slots

    def _take_kept(self, worker_id: int) -> None:
        """Slots for a worker before its first batch, where a loader of the same dataset and batch
        size sized them before and closed, leaving its segment kept (:mod:`spares`): the first
        batch is computed straight into a slot, not on the worker's heap, then copied into a
        segment sent for it (a round trip, a 9.6 MB copy and its heap's pages: about 6 ms of the
        first batch of 64 224x224 images on a VM). Only a kept segment: no memory is allocated
        on the guess; a first batch that does not fit grows the slots as without it."""
        slot_bytes = spares.slot_size(self._size_key())
        # batches still held in it may take all but one of the slots the worker uses (one must
        # cycle, as when lending); none with zero_copy, whose views need zero_copy slots of their own
        max_held = 0 if self.zero_copy else self._slots_used(slot_bytes) - 1
        taken = spares.take_spare(slot_bytes * self.slots, slot_bytes, max_held) if slot_bytes else None
        if taken is None:
            return
        segment, held = taken
        self._add_segment(worker_id, segment, slot_bytes)
        for offset, lease in held.items():  # batches of a closed loader the loop still holds (in its slots)
            self._lent[worker_id].add(offset // slot_bytes)
            self._leases.watch((worker_id, offset // slot_bytes), lease)

    def _add_segment(self, worker_id: int, segment: Any, slot_bytes: int) -> None:
        """A worker's slots lie in ``segment`` from now on (a new generation)."""
        self._all_segments[segment.name] = segment
        self._lending.slot_bytes[segment.name] = slot_bytes
        # headers name the generation: batches in flight, or held by the loop, may lie in the old one
        self._generations[worker_id].append((segment, slot_bytes))

    def shutdown(self) -> None:
        """Stop the workers (the data segments stay for the next start; :meth:`close` frees them)."""
        shut_down(self._workers, self._all_segments, self._stopping)  # new workers start with every free slot

    def _retire(self) -> None:
        """At the end of an epoch every batch was taken: the workers are asked to stop and not
        waited for (:func:`~fastdata.loading.teardown.retire`); the next start (or :meth:`close`)
        reaps them."""
        retire(self._workers, self._all_segments, self._stopping)

    def close(self) -> None:
        """Stop the workers and remove the shared-memory segments (the next epoch starts anew);
        slot segments no batch of which is held are kept for the next process loader (spares.keep_spare)."""
        cleanup(self._workers, self._all_segments, self._lending, self._stopping)  # held batches keep their memory mapped
        self._forget_slots()
        while self._companions:
            self._companions.pop().close()

    def _send(self, worker_id: int, message: tuple) -> None:
        try:
            self._workers[worker_id].tasks.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, OSError):
            raise self._died(worker_id, -1, np.empty(0, dtype=np.int64)) from None

    # --- one epoch ---------------------------------------------------------------------------

    def epoch_iter(self) -> Iterator[Any]:
        if self._serving:  # another iterator of this loader is mid-epoch on its workers
            yield from self._companion_epoch()
            return
        self._serving = True
        try:
            yield from self._workers_epoch()
        finally:
            self._serving = False

    def _companion_epoch(self) -> Iterator[Any]:
        """The epoch of an iterator that starts while another is mid-epoch on this loader's workers
        ("peek, then train": ``it = iter(loader); next(it); for batch in loader``, or ``zip(loader,
        loader)``): the next epoch of the same sampler, on workers of its own (a companion loader
        with this one's options), as a DataLoader gives each iterator its own workers. With
        ``persistent_workers`` the companion is kept for the next such iterator; :meth:`close`
        closes it, mid-epoch too."""
        companion = next((idle for idle in self._companions if not idle._serving), None)
        if companion is None:
            companion = copy.copy(self)
            companion._serving, companion._companions = False, []
            companion._own_workers()
            self._companions.append(companion)
        finished = False
        try:
            yield from companion.epoch_iter()
            finished = True
        finally:
            if not (finished and self.persistent_workers):
                companion.close()
                self._companions = [kept for kept in self._companions if kept is not companion]

    def _workers_epoch(self) -> Iterator[Any]:
        batches = self.epoch_batches()
        held = self._held  # kept across epochs and worker restarts: views stay valid for zero_copy more
        finished = False   # batches, whatever the epoch
        try:
            self._start()  # (a start that fails midway stops the workers it started: below)
            for worker_id in range(self.num_workers):
                share = [(number, batches[number]) for number in range(worker_id, len(batches), self.num_workers)]
                self._send(worker_id, ("epoch", share))
            for number, indices in enumerate(batches):
                if self.zero_copy and len(held) >= self.zero_copy:
                    self._give(*held.pop(0))
                yield self._receive(number % self.num_workers, number, indices)
            finished = True
        finally:
            if not finished:
                self.shutdown()  # an epoch left early leaves batches in flight: start afresh
            elif not self.persistent_workers:
                self._retire()

    def _give(self, worker_id: int, slot: int) -> None:
        """Slot ``slot`` of a worker is free again: into its free ring (when it runs)."""
        self._lent[worker_id].discard(slot)
        if not self._workers:
            return
        worker = self._workers[worker_id]
        FREE.pack_into(worker.control.buf, self.slots * HEADER_BYTES + (worker.given % self.slots) * FREE.size, slot)
        worker.given += 1
        worker.free.release()

    def _take_back(self) -> None:
        """The slots of lent batches the loop has dropped since last time."""
        for worker_id, slot in self._leases.drain():
            self._give(worker_id, slot)

    def _receive(self, worker_id: int, number: int, indices: np.ndarray) -> Any:
        """Batch ``number`` from its worker: lent, copied or as views (module docstring)."""
        self._take_back()
        worker = self._workers[worker_id]
        status = worker.control.buf
        at = (worker.consumed % self.slots) * HEADER_BYTES
        while True:
            self._wait_until_ready(worker_id, number, indices)
            kind, slot, generation, length = STATUS.unpack_from(status, at)
            if kind != NEEDS_SLOTS:
                break
            self._grow(worker_id, length)  # the worker copies the batch in and says "ready" again
        worker.consumed += 1
        if kind != IN_SLOT:
            self._give(worker_id, slot)
            return self._from_pipe(worker_id, number, indices)
        segment, slot_bytes = self._generations[worker_id][generation - 1]
        allocate = None
        if self.zero_copy:
            mode = "view"
        elif self.pin_memory and torch.cuda.is_available():
            mode, allocate = "copy", _pinned_empty_like
        else:
            mode = "lend" if self._may_lend(worker_id) else "copy"
        start = at + STATUS.size
        unpacked = shm.unpack(status[start : start + length], segment.buf, slot * slot_bytes, slot_bytes,
                              mode=mode, allocate=allocate)
        if mode == "view":
            self._lent[worker_id].add(slot)
            self._held.append((worker_id, slot))
        elif unpacked.lease is not None:
            self._lent[worker_id].add(slot)
            self._leases.watch((worker_id, slot), unpacked.lease)
        else:
            self._give(worker_id, slot)
        return unpacked.batch

    def _wait_until_ready(self, worker_id: int, number: int, indices: np.ndarray) -> None:
        worker = self._workers[worker_id]
        deadline = time.monotonic() + self.timeout if self.timeout else None
        while not (_poll(worker.ready, self.spin_s) or worker.ready.acquire(timeout=_POLL_S)):
            if not worker.process.is_alive():
                raise self._died(worker_id, number, indices)
            if deadline is not None and time.monotonic() > deadline:
                raise failures.timed_out(worker_id, worker.process, self.timeout, number, indices)

    def _from_pipe(self, worker_id: int, number: int, indices: np.ndarray) -> Any:
        worker = self._workers[worker_id]
        try:
            message = pickle.loads(worker.results.recv_bytes())
        except (EOFError, OSError):
            raise self._died(worker_id, number, indices) from None
        if message[0] == "error":
            raise self._failed(worker_id, number, indices, message[2], message[3])
        return self.pinned(pickle.loads(message[2]))  # a batch without arrays: a few bytes

    def _grow(self, worker_id: int, needed: int) -> None:
        """Give a worker slots big enough for a batch it could not place (the first one, or a
        larger one): a new segment (the old one stays until close: batches the loop holds, or in
        flight, may lie in it). Sized to the first batch; with headroom when batches vary."""
        active = self._active_slots(worker_id)
        current = self._slot_bytes(worker_id)
        if needed > current:
            slot_bytes = -(-int(needed * (_SLOT_HEADROOM if current else 1.0)) // 4096) * 4096
            # a closed loader's segment where one fits: its pages were written before (no first-write
            # cost); none with batches still held in it (the worker's free ring names slots already)
            taken = spares.take_spare(slot_bytes * self.slots)
            if taken is None:  # a worker writing into slots /dev/shm cannot hold would die of SIGBUS
                self._check_room(worker_id, slot_bytes)
            self._add_segment(worker_id, taken[0] if taken else shm.new_segment(slot_bytes * self.slots), slot_bytes)
            spares.remember_slot_size(self._size_key(), slot_bytes)
        self._send_segment(worker_id)
        for slot in range(active, self._active_slots(worker_id)):  # sized small enough for the spare slot
            self._give(worker_id, slot)

    def _check_room(self, worker_id: int, slot_bytes: int) -> None:
        """Refuse new slots of ``slot_bytes`` for a worker where /dev/shm cannot hold what every
        worker will write: these slots, the pages of the other workers' slots not written yet (a
        new segment takes no room until written), and slots as large for those that have none yet
        (their first batch comes next). Counting this worker's alone passed each one in turn."""
        used = self._slots_used(slot_bytes)
        needed = slot_bytes * used
        for other, generations in enumerate(self._generations):
            if other == worker_id:
                continue
            if not generations:
                needed += slot_bytes * used
                continue
            segment, size = generations[-1]
            needed += max(0, size * self._slots_used(size) - shm.written_bytes(segment.name))
        workers = f"{self.num_workers} worker{'s' if self.num_workers > 1 else ''}"
        shm.check_room(needed, f"a loader of {workers} ({used} slots of {slot_bytes / 2**20:.1f} MB each)")

    def _send_segment(self, worker_id: int) -> None:
        """Tell a worker which segment its slots are in now."""
        generations = self._generations[worker_id]
        segment, slot_bytes = generations[-1]
        self._send(worker_id, ("segment", segment.name, slot_bytes, len(generations)))

    def _died(self, worker_id: int, number: int, indices: np.ndarray) -> WorkerError:
        worker = self._workers[worker_id]
        if worker.results.poll(0):  # it said why before it went (an error in worker_init_fn)
            try:
                message = pickle.loads(worker.results.recv_bytes())
            except (EOFError, OSError):
                message = None
            if message is not None and message[0] == "error":
                return self._failed(worker_id, message[1], indices, message[2], message[3])
        worker.process.join(1)
        self.shutdown()
        return failures.died(worker_id, worker.process, number, indices)

    def _failed(self, worker_id: int, number: int, indices: np.ndarray, text: str, payload: bytes | None) -> WorkerError:
        self.shutdown()
        return failures.failed(worker_id, number, indices, text, payload)


def _semaphores(context: Any, free: int) -> tuple[Any, Any]:
    """A worker's two semaphores (slots free, batches ready). On Linux each takes a page of /dev/shm:
    none left there is :class:`~fastdata.errors.SharedMemoryFullError`, as for its slots."""
    try:
        return context.Semaphore(free), context.Semaphore(0)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        raise shared_memory_full(2 * mmap.PAGESIZE, "a worker's pair of semaphores") from None


def _poll(ready: Any, seconds: float) -> bool:
    """Take ``ready`` if it is released within ``seconds``, without sleeping (see ``_SPIN_S``)."""
    if ready.acquire(False):
        return True
    if not seconds:
        return False
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        if ready.acquire(False):
            return True
    return False


def _pinned_empty_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(tensor, pin_memory=True)
