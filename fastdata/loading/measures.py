"""What the search behind ``num_workers="auto"`` reads and answers (:mod:`fastdata.loading.autotune`):
the :class:`Setting` a loader runs, the :class:`Window` it measured there, the :class:`Budget` the
search may use, a :class:`Decision`, and the rows of ``loader.tuning_log``. Plain values, no
clocks: the search is tested on simulated windows for any number of cores."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

THREADS_PER_CORE = 4  # threads may go this far beyond the cores while the cores stay idle
MIN_THREADS = 16  # ... and to this many on a machine of few cores (I/O waits per sample)


@dataclass(frozen=True)
class Setting:
    """What the loader runs: a backend, its workers, and batches in flight per worker."""

    backend: str
    num_workers: int
    prefetch: int = 2

    def with_workers(self, num_workers: int) -> "Setting":
        return dataclasses.replace(self, num_workers=num_workers)


@dataclass(frozen=True)
class Window:
    """What the loop measured over a few consecutive batches at one setting (durations in s).

    ``wait_s``: the loop inside ``next()``; ``step_s``: between ``next()`` calls (the training
    step); ``produce_s``: the producers' time per batch summed (None where not seen);
    ``busy_cores``: CPU seconds of the process tree per second of the window.

    ``period_s``, ``wait_per_batch_s``, ``step_median_s``: per batch, trimmed means over the window's
    chunks (runs of consecutive batches longer than the batches in flight, so that a chunk's time is
    what its batches cost), where the loop gave them. The rates are read from them: on a shared
    machine a few batches that waited for a core (another program's) move a plain mean far more
    than a trimmed one."""

    batches: int
    samples: int
    wall_s: float
    wait_s: float
    step_s: float
    produce_s: float | None = None
    busy_cores: float | None = None
    worker_bytes: int | None = None  # memory a worker process adds (its USS, not what it shares); None for threads
    flight_bytes: int | None = None  # memory of one worker's batches in flight (prefetch x a batch's arrays)
    available_bytes: int | None = None
    period_s: float | None = None
    wait_per_batch_s: float | None = None
    step_median_s: float | None = None

    @property
    def samples_per_s(self) -> float:
        if self.period_s:
            return self.samples / self.batches / self.period_s
        return self.samples / self.wall_s if self.wall_s > 0 else math.inf

    @property
    def wait_fraction(self) -> float:
        if self.period_s and self.wait_per_batch_s is not None:
            return min(1.0, self.wait_per_batch_s / self.period_s)
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def step_per_batch_s(self) -> float:
        return self.step_median_s if self.step_median_s is not None else self.step_s / max(1, self.batches)

    @property
    def produce_per_batch_s(self) -> float | None:
        return None if self.produce_s is None else self.produce_s / max(1, self.batches)


@dataclass(frozen=True)
class Budget:
    """What the search may use: ``cores`` (affinity and cgroup quota), ``memory_bytes`` for all
    workers together, ``max_workers`` (the user's bound) and the backends it may choose."""

    cores: int
    memory_bytes: int
    max_workers: int | None = None
    backends: tuple[str, ...] = ("thread", "process")

    def limit(self, backend: str, worker_bytes: int | None = None, flight_bytes: int | None = None) -> int:
        """The most workers of ``backend``: the cores for processes (they compute), a few per core
        for threads (they may wait on I/O); the user's bound; what the memory budget holds
        (:meth:`worker_cost` each)."""
        most = self.cores if backend != "thread" else max(MIN_THREADS, THREADS_PER_CORE * self.cores)
        if self.max_workers is not None:
            most = min(most, self.max_workers)
        cost = self.worker_cost(backend, worker_bytes, flight_bytes)
        if cost:
            most = min(most, max(0, self.memory_bytes // cost))
        return max(0, most)

    @staticmethod
    def worker_cost(backend: str, worker_bytes: int | None, flight_bytes: int | None) -> int:
        """The memory one worker of ``backend`` adds: its batches in flight, and for a process
        what it holds of its own (0 where nothing was measured yet)."""
        return (flight_bytes or 0) + (0 if backend == "thread" else worker_bytes or 0)


@dataclass(frozen=True)
class Decision:
    """A change of setting and why (the loader logs it and keeps it in ``tuning_log``)."""

    setting: Setting
    reason: str


def pooled(first: Window, second: Window) -> Window:
    """Two windows at one setting as one: their batches, samples and times together, the per-batch
    figures weighted by batches (memory and the machine's state from the later one)."""
    batches = first.batches + second.batches

    def mean(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else (a * first.batches + b * second.batches) / batches

    def total(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a + b

    return dataclasses.replace(
        second, batches=batches, samples=first.samples + second.samples, wall_s=first.wall_s + second.wall_s,
        wait_s=first.wait_s + second.wait_s, step_s=first.step_s + second.step_s,
        produce_s=total(first.produce_s, second.produce_s), busy_cores=mean(first.busy_cores, second.busy_cores),
        period_s=mean(first.period_s, second.period_s),
        wait_per_batch_s=mean(first.wait_per_batch_s, second.wait_per_batch_s),
        step_median_s=mean(first.step_median_s, second.step_median_s))


def log_entry(batch: int, setting: Setting, window: Window | None, reason: str, *,
              elapsed_s: float | None = None) -> dict[str, Any]:
    """One row of ``loader.tuning_log``: after ``batch`` batches (``elapsed_s`` after the first
    ``next()``), the setting decided and why, with the window that decided it."""
    return {"batch": batch, "elapsed_s": None if elapsed_s is None else round(elapsed_s, 3),
            "backend": setting.backend, "num_workers": setting.num_workers, "prefetch": setting.prefetch,
            "samples_per_s": None if window is None else round(window.samples_per_s, 1),
            "wait_fraction": None if window is None else round(window.wait_fraction, 3),
            "reason": reason}
