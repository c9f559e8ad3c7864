"""Measuring what ``fastdata.tune`` predicts from: the fetch at num_workers=0, the hand-over of
a batch per backend (a probe dataset of ready copies of a real batch), worker start-up, the GIL,
the training step, pickling under spawn; and short probes of a real loader."""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from fastdata.bench.probes import ReadyBatches
from fastdata.bench.timing import batch_length
from fastdata.errors import FastdataError, InvalidOptionError
from fastdata.loading.backends import BACKENDS, DEFAULT_BACKEND
from fastdata.loading.fetch import BatchFetcher, accepts_index_arrays
from fastdata.machine import usable_cores
from fastdata.tuning.noise import IMPLAUSIBLE, REPEATS, Spread, below_noise, machine_noise, repeat, thread_limit

PROBE_BATCHES = 50  # a measuring probe (hand-over, num_workers=0) stops after this many batches or its time share


@dataclass
class Measurements:
    """What ``tune`` measured before predicting (every duration per batch, in ms)."""

    batch_size: int
    samples: int
    batches_per_epoch: int
    batch_bytes: int
    fetch_ms: float
    loop_ms: float
    standard_fetch_ms: float | None
    step_ms: float
    step_cpu_ms: float
    thread_speedup: float | None
    transfer_ms: dict[str, float]
    startup_s: dict[str, float]
    usable_cores: int
    cpu_count: int
    start_method: str
    pickle_error: str | None
    cuda: bool
    spreads: dict[str, Spread] = field(default_factory=dict)
    """The repeats behind the figures above (``fetch_ms``, ``transfer_ms.<backend>``,
    ``startup_s.<backend>``, ``thread_speedup``) and the machine's own ``noise`` (seconds of a
    fixed piece of work): :func:`fastdata.tuning.noise.doubts` says which cannot be trusted."""

    @property
    def epoch_s(self) -> float:
        return self.batches_per_epoch * (self.loop_ms + self.step_ms) / 1000

    @property
    def hand_over_below_noise(self) -> set[str]:
        """The backends whose hand-over per batch this machine could not tell from zero."""
        return {backend for backend in self.transfer_ms
                if f"transfer_ms.{backend}" in self.spreads and below_noise(self.spreads[f"transfer_ms.{backend}"])}

    @property
    def overhead_ms(self) -> float:
        """The loop's own cost per batch at num_workers=0 beyond the fetch (sampler, iteration)."""
        return max(0.0, self.loop_ms - self.fetch_ms)



def probe_batches(length: int, batch_size: int, count: int, seed: int = 0) -> list[np.ndarray]:
    order = np.random.default_rng(seed).permutation(length)
    starts = range(0, max(1, length - batch_size + 1) if length >= batch_size else 1, batch_size)
    chosen = [np.sort(order[s : s + batch_size]) for s in starts][: max(1, count)]
    return chosen


def _timed_calls(function: Callable[[], Any], seconds: float, *, at_least: int = 3, at_most: int = 50) -> list[float]:
    """Durations (s) of repeated calls: at least ``at_least``, until ``seconds`` have passed."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < at_least or (time.perf_counter() - start < seconds and len(times) < at_most):
        before = time.perf_counter()
        function()
        times.append(time.perf_counter() - before)
    return times


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return 0


def probe_loader(dataset: Any, backend: str, workers: int, batch_size: int, *, prefetch_factor: int = 2,
            context: str | None = None, pin_memory: bool = False, seed: int = 0) -> Any:
    from fastdata.loading import loader

    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=prefetch_factor)
        if context and BACKENDS[backend].crosses_process:
            kwargs["multiprocessing_context"] = context
    return loader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers, backend=backend,
                  pin_memory=pin_memory, seed=seed, **kwargs)


@dataclass
class ProbeResult:
    samples_per_s: float
    wait_fraction: float
    first_batch_s: float
    batches: int
    pss_mb_per_worker: float | None = None


def probe(loader: Any, seconds: float, *, step: Callable[[Any], Any] | None = None, step_s: float = 0.0,
          warm_batches: int = 2, memory: bool = False, max_batches: int | None = None) -> ProbeResult:
    """Iterate ``loader`` (across epochs if needed) for about ``seconds`` after ``warm_batches``
    (which include worker start-up, reported as ``first_batch_s``): samples/s and data wait."""
    def run_step(batch: Any) -> None:
        if step is not None:
            step(batch)
        elif step_s:
            time.sleep(step_s)

    start = time.perf_counter()
    iterator = iter(loader)
    first_batch_s = None
    warm = 0
    samples = batches = 0
    waited = 0.0
    timed_start = None
    pss = None
    while True:
        before = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            if first_batch_s is None:
                break  # an empty loader
            iterator = iter(loader)  # the next epoch (persistent workers stay)
            continue
        now = time.perf_counter()
        if first_batch_s is None:
            first_batch_s = now - start
        if warm < warm_batches:
            warm += 1
            run_step(batch)
            del batch
            if warm == warm_batches:
                timed_start = time.perf_counter()
            continue
        waited += now - before
        samples += batch_length(batch)
        batches += 1
        run_step(batch)
        del batch
        if timed_start is None:
            timed_start = before
        if (time.perf_counter() - timed_start >= seconds or (max_batches is not None and batches >= max_batches)) \
                and batches >= 2:
            break
    if memory:
        pss = _worker_pss_mb()
    elapsed = time.perf_counter() - timed_start if timed_start is not None else 0.0
    del iterator
    getattr(loader, "close", lambda: None)()
    rate = samples / elapsed if elapsed > 0 else 0.0
    return ProbeResult(rate, min(1.0, waited / elapsed) if elapsed > 0 else 0.0, first_batch_s or 0.0, batches, pss)


def _worker_pss_mb() -> float | None:
    """Mean PSS of this process's worker children (MiB), or None without any."""
    import psutil

    values = []
    for child in psutil.Process().children(recursive=False):
        try:
            info = child.memory_full_info()
        except (psutil.Error, OSError):
            continue
        values.append(getattr(info, "pss", info.uss) / 2**20)
    return round(statistics.mean(values), 1) if values else None


def resolve_start_method(requested: str | None) -> str:
    if requested is not None:
        if requested not in multiprocessing.get_all_start_methods():
            raise InvalidOptionError(
                f"Unknown start method {requested!r}. Allowed here: {', '.join(map(repr, multiprocessing.get_all_start_methods()))}."
            )
        return requested
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context().get_start_method()


def _pickle_problem(dataset: Any) -> str | None:
    try:
        pickle.dumps(dataset)
    except Exception as exc:  # noqa: BLE001 - any failure to pickle is the answer
        return f"{type(exc).__name__}: {exc}"
    return None


def _step_cost(step: Callable[[Any], Any], batches: list[Any]) -> tuple[float, float]:
    """Wall and CPU ms of the user's step per batch (median of a few real batches, after one)."""
    step(batches[0])
    walls, cpus = [], []
    for batch in batches[1:] or batches:
        wall, cpu = time.perf_counter(), time.process_time()
        step(batch)
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    return statistics.median(walls), statistics.median(cpus)


def _thread_speedup(fetch: BatchFetcher, indices: list[np.ndarray], seconds: float) -> float:
    """Batches/s of 2 threads fetching at once over 1 thread: ~2 where the fetch releases the GIL
    (at most 2: a higher ratio is noise, which :func:`measure` repeats and flags)."""
    def count_in(threads: int) -> float:
        done = [0] * threads
        stop = time.perf_counter() + seconds

        def work(slot: int) -> None:
            position = slot
            while (time.perf_counter() < stop and done[slot] < 40) or done[slot] == 0:
                fetch(indices[position % len(indices)])
                done[slot] += 1
                position += threads

        started = time.perf_counter()
        pool = [threading.Thread(target=work, args=(slot,)) for slot in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        return sum(done) / (time.perf_counter() - started)

    one = count_in(1)
    return round(count_in(2) / one, 2) if one > 0 else 1.0


def measure(dataset: Any, *, batch_size: int, step: Callable[[Any], Any] | None, step_ms: float,
            backends: tuple[str, ...], start_method: str, seconds: float) -> tuple[Measurements, list[Any]]:
    """Phase 1 (see the module docstring), spending about ``seconds``."""
    length = len(dataset)
    if length == 0:
        raise InvalidOptionError("The dataset is empty: nothing to tune.")
    fetch = BatchFetcher(dataset)
    indices = probe_batches(length, batch_size, 64)
    share = max(0.2, seconds / 8)
    try:
        sample_batches = [fetch(indices[i % len(indices)]) for i in range(3)]
    except Exception as exc:
        raise FastdataError(
            f"Reading a batch of {batch_size} from the dataset failed: {type(exc).__name__}: {exc}. "
            "Every sample must be readable and samples of one batch must collate (same shapes): for images "
            "of different sizes, resize them (fastdata tune --resize HxW, or a transform)."
        ) from exc
    position = iter(range(10**9))
    fetch_times = _timed_calls(lambda: fetch(indices[next(position) % len(indices)]), share)
    fetch_ms = statistics.median(fetch_times) * 1000
    serial = probe(probe_loader(dataset, DEFAULT_BACKEND, 0, batch_size), share / 2, warm_batches=1, max_batches=PROBE_BATCHES)
    loop_ms = max(fetch_ms, 1000 / (serial.samples_per_s / batch_size)) if serial.samples_per_s else fetch_ms
    standard_ms = None
    if accepts_index_arrays(dataset):
        per_sample = BatchFetcher(dataset, collate_fn=torch.utils.data.default_collate)
        try:  # what DataLoader(dataset, batch_size) does: only for comparison
            standard_ms = statistics.median(_timed_calls(lambda: per_sample(indices[0]), share / 2, at_least=1,
                                                         at_most=50)) * 1000
        except Exception:  # noqa: BLE001 - a dataset that only takes index arrays
            standard_ms = None
    step_cpu = 0.0
    if step is not None:
        step_ms, step_cpu = _step_cost(step, sample_batches)
    cores = usable_cores()
    spreads = {"noise": machine_noise(), "fetch_ms": Spread(tuple(t * 1000 for t in fetch_times))}
    speedup = None
    if cores >= 2 and any(BACKENDS[b].shares_gil for b in backends):  # repeated while noisy, or above what 2 threads can reach
        limit = thread_limit(cores)
        spreads["thread_speedup"] = repeat(lambda: _thread_speedup(fetch, indices, share / 2 / REPEATS),
                                           plausible=lambda ratio: ratio <= IMPLAUSIBLE * limit)
        speedup = min(spreads["thread_speedup"].median, limit)
    pickle_error = _pickle_problem(dataset) if start_method != "fork" else None
    template = sample_batches[0]
    transfer: dict[str, float] = {}
    startup: dict[str, float] = {}
    ready = ReadyBatches(template, length)
    for backend in backends:
        if BACKENDS[backend].needs_picklable and pickle_error:
            continue
        starts: list[float] = []
        hand_over = repeat(lambda: _hand_over_ms(ready, backend, batch_size, start_method, share / REPEATS, starts))
        spreads[f"transfer_ms.{backend}"] = hand_over
        spreads[f"startup_s.{backend}"] = Spread(tuple(starts))
        transfer[backend] = max(0.0, hand_over.median)
        startup[backend] = statistics.median(starts)
    batches_per_epoch = math.ceil(length / batch_size)
    return Measurements(
        batch_size=batch_size, samples=length, batches_per_epoch=batches_per_epoch, batch_bytes=_nbytes(template),
        fetch_ms=fetch_ms, loop_ms=loop_ms, standard_fetch_ms=standard_ms, step_ms=step_ms, step_cpu_ms=step_cpu,
        thread_speedup=speedup, transfer_ms=transfer, startup_s=startup, usable_cores=cores,
        cpu_count=os.cpu_count() or 1, start_method=start_method, pickle_error=pickle_error,
        cuda=torch.cuda.is_available(), spreads=spreads,
    ), sample_batches


def _hand_over_ms(ready: ReadyBatches, backend: str, batch_size: int, start_method: str, seconds: float,
                  starts: list[float]) -> float:
    """One measurement of what handing a batch from one ``backend`` worker to the loop adds per
    batch (ms): ready batches through one worker minus the same batches at num_workers=0, probed
    back to back so that both see the same load. May be negative (noise); appends the worker's
    start-up (the first batch, s) to ``starts``."""
    base = probe(probe_loader(ready, DEFAULT_BACKEND, 0, batch_size), seconds / 3, warm_batches=1, max_batches=PROBE_BATCHES)
    result = probe(probe_loader(ready, backend, 1, batch_size, context=start_method), seconds * 2 / 3,
                   warm_batches=2, max_batches=PROBE_BATCHES)
    starts.append(result.first_batch_s)
    base_ms = 1000 * batch_size / base.samples_per_s if base.samples_per_s else 0.0
    per_batch = 1000 * batch_size / result.samples_per_s if result.samples_per_s else float("inf")
    return per_batch - base_ms
