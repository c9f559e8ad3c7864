"""Timing loaders: one epoch timer, and side-by-side comparisons for benchmark scripts.

:func:`time_epoch` is the one place an epoch is timed (``fastdata bench`` uses it too).
:func:`compare` times a list of :class:`Cell` (a reader at one ``num_workers``) with epochs
interleaved round-robin across cells, so load from other processes on a shared machine spreads
over every cell instead of a few, and ratios between cells of one run stay honest. It returns
rows; :func:`fastdata.bench.report.rates_table` renders them.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable


@dataclass
class EpochTiming:
    """One full pass: samples, seconds, time to the first batch, and the time spent waiting for
    data (the rest of the loop is the simulated step)."""

    samples: int
    batches: int
    seconds: float
    first_batch_s: float
    waited_s: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def batch_length(batch: Any) -> int:
    """Samples in a batch: ``(images, labels)`` (tensor or list of images), any tuple, list or
    dict of tensors (its first entry), or anything sized."""
    if isinstance(batch, dict) and batch:
        batch = next(iter(batch.values()))
    elif isinstance(batch, (tuple, list)) and batch and hasattr(batch[0], "__len__") and \
            not isinstance(batch[0], (str, bytes)):
        batch = batch[0]
    return len(batch)


def time_epoch(iterable: Iterable, *, step_s: float = 0.0, on_first: Callable[[], None] | None = None,
               step: Callable[[Any], Any] | None = None, max_batches: int | None = None,
               max_seconds: float | None = None) -> EpochTiming:
    """Iterate ``iterable`` once (starting it is part of the epoch: worker start-up counts),
    running the training step after each batch: ``step(batch)`` when given, else a sleep of
    ``step_s``. The time outside ``next()`` is the step's; the time inside it is data wait.
    ``max_batches``/``max_seconds`` stop early (a probe: the iterator is dropped, which stops
    its workers)."""
    samples = batches = 0
    first = None
    start = time.perf_counter()
    iterator = iter(iterable)
    waited = time.perf_counter() - start
    while True:
        before = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            waited += time.perf_counter() - before
            break
        now = time.perf_counter()
        waited += now - before
        if first is None:
            first = now - start
            if on_first is not None:
                on_first()
        samples += batch_length(batch)
        batches += 1
        if step is not None:
            step(batch)
        elif step_s:
            time.sleep(step_s)
        del batch
        if (max_batches is not None and batches >= max_batches) or \
                (max_seconds is not None and time.perf_counter() - start >= max_seconds):
            break
    seconds = time.perf_counter() - start
    del iterator
    return EpochTiming(samples, batches, seconds, first if first is not None else seconds, waited)


@dataclass
class Cell:
    """One measured configuration: ``make()`` returns what to iterate (a loader). With
    ``fresh=True`` it is called for every epoch (nothing cached carries over); otherwise once,
    and the same loader is iterated each epoch (persistent workers stay up)."""

    reader: str
    num_workers: int
    make: Callable[[], Iterable]
    fresh: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def compare(cells: list[Cell], *, epochs: int = 3, warmup: int = 1, min_seconds: float = 1.0,
            max_epochs: int = 20, slow_s: float = 5.0, log: bool = True) -> list[dict[str, Any]]:
    """Time every cell: ``warmup`` epochs each, then timed epochs round-robin across cells.

    A fast cell gets more epochs (at least ``min_seconds`` of timing, at most ``max_epochs``); a
    cell slower than ``slow_s`` per epoch is timed by its last warm-up epoch alone. Each row
    holds the median samples/s, the spread (min/max epoch seconds) and ``os.cpu_count()``.
    """
    loaders: list[Iterable | None] = [None] * len(cells)

    def run(position: int) -> EpochTiming:
        cell = cells[position]
        if cell.fresh or loaders[position] is None:
            loaders[position] = cell.make()
        timing = time_epoch(loaders[position])
        if cell.fresh:
            loaders[position] = None
        return timing

    warm = []
    for position, cell in enumerate(cells):
        timings = [run(position) for _ in range(max(warmup, 1))]
        warm.append(timings[-1])
        if log:
            print(f"warm-up {cell.reader} nw={cell.num_workers}: {warm[-1].seconds:.3f} s", file=sys.stderr, flush=True)
    needed = [0 if w.seconds > slow_s else max(epochs, min(max_epochs, int(min_seconds / max(w.seconds, 1e-3))))
              for w in warm]
    runs: list[list[EpochTiming]] = [[] for _ in cells]
    for repeat in range(max(needed, default=0)):
        for position in range(len(cells)):
            if repeat < needed[position]:
                runs[position].append(run(position))
    loaders.clear()
    return [_row(cell, cell_runs or [warm_run]) for cell, cell_runs, warm_run in zip(cells, runs, warm)]


def _row(cell: Cell, runs: list[EpochTiming]) -> dict[str, Any]:
    seconds = statistics.median(r.seconds for r in runs)
    samples = runs[0].samples
    return {
        "reader": cell.reader,
        "num_workers": cell.num_workers,
        "samples": samples,
        "samples_per_s": round(samples / seconds, 1) if seconds > 0 else 0.0,
        "epoch_s": round(seconds, 4),
        "epoch_s_min_max": [round(min(r.seconds for r in runs), 4), round(max(r.seconds for r in runs), 4)],
        "first_batch_s": round(statistics.median(r.first_batch_s for r in runs), 4),
        "epochs_timed": len(runs),
        "cpu_count": os.cpu_count(),
        **cell.extra,
    }
