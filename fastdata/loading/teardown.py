"""Stopping a loader's worker processes: a ``process`` loader's (at the end of an epoch without
waiting for them, at shutdown for sure), and what becomes of its shared-memory segments when it
closes: its slot segments kept for the next loader (:mod:`fastdata.loading.spares`), the rest
removed (used by :mod:`fastdata.loading.processes`); a DataLoader's (the ``torch`` backend's) at
the end of an epoch, behind the training loop (:func:`retiring`)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from fastdata.loading import shm, spares
from fastdata.machine import restart_calls_on_child_exit

_STOP_GRACE_S = 0.5


def ask_to_stop(workers: list[Any]) -> None:
    """Send every worker its stop message and close the result pipes, without waiting."""
    for worker in workers:
        try:
            worker.tasks.send_bytes(b"")
        except (OSError, ValueError):  # already asked (its pipe closed), or gone
            pass
        worker.results.close()  # a worker blocked sending a batch no one will read gets EPIPE: it stops


def reap_stopped(stopping: list[Any]) -> None:
    """Forget the workers of ``stopping`` that have exited (asked by :func:`ask_to_stop`); one
    still running after ``_STOP_GRACE_S`` is stopped for sure, as :func:`stop_workers` does."""
    now = time.monotonic()
    late = []
    for worker in list(stopping):
        worker.process.join(0)
        if worker.process.exitcode is not None:
            worker.tasks.close()
            stopping.remove(worker)
        elif now - worker.asked > _STOP_GRACE_S:
            stopping.remove(worker)
            late.append(worker)
    stop_workers(late)


def stop_workers(workers: list[Any]) -> None:
    """Ask every worker to stop, wait a little, then make sure (SIGTERM, then SIGKILL)."""
    ask_to_stop(workers)
    deadline = time.monotonic() + _STOP_GRACE_S
    for worker in workers:  # one that is mid-batch (or blocked sending one) is not waited for
        worker.process.join(max(0.0, deadline - time.monotonic()))
        if worker.process.is_alive():
            worker.process.terminate()
            worker.process.join(2)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
        worker.tasks.close()
    workers.clear()


def retire(workers: list[Any], segments: dict[str, Any], stopping: list[Any]) -> None:
    """The end of an epoch that took every batch: ask ``workers`` to stop and move them to
    ``stopping`` without waiting for them to exit (tearing down a process that inherited torch
    takes 10-20 ms; it overlaps the training loop's work). They write nothing more: each waits
    for its next message. Their control segments are removed; :func:`reap_stopped` forgets them.
    Their exit interrupts no system call of the loop's (:func:`~fastdata.machine.restart_calls_on_child_exit`)."""
    restart_calls_on_child_exit()
    ask_to_stop(workers)
    now = time.monotonic()
    for worker in workers:
        worker.asked = now
        shm.release(segments.pop(worker.control.name), unlink=True)
    stopping.extend(workers)
    workers.clear()


def shut_down(workers: list[Any], segments: dict[str, Any], stopping: list[Any]) -> None:
    """Stop ``workers`` and those of ``stopping`` and remove the running ones' control segments
    (their data segments stay in ``segments`` for the next workers)."""
    controls = [worker.control.name for worker in workers]
    stop_workers(workers)
    stop_workers(stopping)
    for name in controls:
        shm.release(segments.pop(name), unlink=True)


@dataclass
class Lending:
    """What the loader's clean-up needs to keep its slot segments for the next loader: the
    leases of the batches the loop holds, each segment's slot size, whether views without a
    lease were handed out (``zero_copy``)."""

    zero_copy: bool
    leases: Any = None
    slot_bytes: dict[str, int] = field(default_factory=dict)


def cleanup(workers: list[Any], segments: dict[str, Any], lending: Lending, stopping: list[Any]) -> None:
    """Stop the workers (and wait for those of ``stopping``, asked to stop at the end of an
    epoch) and remove the segments (at close, garbage collection or exit); slot segments are kept
    for the next loader (:func:`spares.keep_spare`), those with lent batches still held in them
    with those batches' leases (never with ``zero_copy``'s views)."""
    shut_down(workers, segments, stopping)  # the running workers' control segments go; the rest hold slots
    leases = None
    if not lending.zero_copy and lending.leases is not None:
        leases = [lease for ref in list(lending.leases.watched.values()) if (lease := ref()) is not None]
    for name, segment in segments.items():
        if not spares.keep_spare(segment, lending.slot_bytes.get(name, 0), leases):
            shm.release(segment, unlink=True)
    segments.clear()
    lending.slot_bytes.clear()


def retiring(batches: Iterator[Any], drawn: Any) -> Iterator[Any]:
    """The batches of a DataLoader iterator whose workers end with the epoch (``batches``), its
    workers stopped behind the training loop. A DataLoader stops them when the loop asks for the
    batch after the last and waits there for their exit (13-19 ms on the machine of
    docs/reading.md, as a worker that imported torch tears down). Here the last batch is known
    when it arrives (it is the ``drawn.count``-th and the sampler's pass, ``drawn``, has
    ended: a :class:`~fastdata.loading.samplers.Drawn`), and a thread asks the iterator for the
    next one, which stops the workers and waits for them, while the loop works on that batch. The
    thread is not a daemon: a script that ends with the epoch waits for the workers' normal exit
    (their finalizers run), as it did in the loop, instead of having them killed. Their exit
    interrupts no system call of the loop's (:func:`~fastdata.machine.restart_calls_on_child_exit`):
    the DataLoader's SIGCHLD handler would otherwise fail a blocking call in C code that does not
    retry (torch's shared-memory manager start spins forever on it)."""
    received = 0
    for batch in batches:
        received += 1
        if drawn.ended and received == drawn.count:
            restart_calls_on_child_exit()
            threading.Thread(target=_run_out, args=(batches,), name="fastdata-retire").start()
            del batches  # the thread's now
            yield batch
            return  # before the loop here asks for another
        yield batch
        del batch


def _run_out(batches: Iterator[Any]) -> None:
    for _ in batches:  # the DataLoader's own end: its workers stopped and joined
        pass
