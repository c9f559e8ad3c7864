"""``fastdata.tune``: recommend loader settings for any map-style Dataset, with the evidence.

Model first, then confirm, within a time budget:

1. Measure (a few seconds): the per-batch fetch at num_workers=0 (``fastdata.loader``'s one
   ``dataset[indices]`` call, and DataLoader's per-sample fetch + collate for comparison); the
   cost of handing one batch of this structure and size from a worker to the loop, per backend
   (a probe dataset that returns ready copies of a real batch, so only the hand-over remains);
   worker start-up per backend; whether 2 threads fetch faster than one (the GIL); the
   consumer's step (``step_ms`` sleeps, ``step`` runs the user's function on real batches); the
   cores this process may use (CPU affinity and the cgroup quota, not ``os.cpu_count()``).
2. Predict samples/s and data wait for every backend x num_workers (0 .. 2 x cores).
3. Confirm the best few predictions with short probes of the real dataset (persistent
   workers, start-up excluded), measuring samples/s, data wait and memory (PSS) per worker,
   and recommend the best measured one. With a training step that dominates, recommend the
   fewest workers that keep the loop's data wait under 5%.
4. Decide ``persistent_workers`` (worker start-up against the epoch), ``prefetch_factor`` and
   ``pin_memory`` (only where CUDA is present); for a folder or torchvision source, predict from
   a probe conversion of a sample whether converting would win and by how much.

Where worker processes start with spawn (Windows, macOS, or ``start_method="spawn"``) and the
dataset cannot be pickled, process backends are left out and the explanation names the fix.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch

from fastdata.errors import FastdataError, InvalidOptionError
from fastdata.explain import tune_paragraph
from fastdata.loading import BACKENDS
from fastdata.loading.fetch import BatchFetcher, accepts_index_arrays
from fastdata.machine import usable_cores

WAIT_TARGET = 0.05  # "the loop waits for data less than 5% of the time"
TIE = 0.05  # measured rates within 5% are a tie: the simpler setting wins
PROBE_BATCHES = 50  # a measuring probe (hand-over, num_workers=0) stops after this many batches or its time share
MIN_BUDGET_S = 2.0  # tune never spends less (worker start-up alone takes tens of ms per probe)
EPOCHS_WORTH = 4  # ... nor more than about this many num_workers=0 epochs (see _effective_budget)
CONVERSION_PROBE_S = 2.0  # added for a probe conversion of a folder or torchvision source
_PREFERENCE = {"torch": 0, "thread": 1, "process": 2}  # in a tie: the DataLoader users know, then threads


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

    @property
    def epoch_s(self) -> float:
        return self.batches_per_epoch * (self.loop_ms + self.step_ms) / 1000

    @property
    def overhead_ms(self) -> float:
        """The loop's own cost per batch at num_workers=0 beyond the fetch (sampler, iteration)."""
        return max(0.0, self.loop_ms - self.fetch_ms)


@dataclass
class Recommendation:
    """The recommended loader settings, what they are predicted and measured to reach, and why.

    ``loader_kwargs`` go to ``fastdata.loader(dataset, **kwargs)``; when ``backend`` is
    ``"torch"`` they are DataLoader keywords too. ``dataloader_kwargs`` are the best settings for
    a plain ``DataLoader`` (``batch_size=None`` plus a sampler is what ``fastdata.loader`` adds)."""

    backend: str
    num_workers: int
    batch_size: int
    persistent_workers: bool
    prefetch_factor: int | None
    pin_memory: bool
    predicted_samples_per_s: float
    measured_samples_per_s: float | None
    predicted_wait_fraction: float
    wait_fraction: float | None
    pss_mb_per_worker: float | None
    measurements: Measurements
    candidates: list[dict[str, Any]] = field(default_factory=list)
    conversion: dict[str, Any] | None = None
    multiprocessing_context: str | None = None
    elapsed_s: float = 0.0
    budget_s: float = 0.0
    effective_budget_s: float = 0.0  # less than budget_s for a small dataset (see _effective_budget)
    dataloader_settings: dict[str, Any] = field(default_factory=dict)

    @property
    def step_ms_effective(self) -> float:
        return self.measurements.step_ms

    @property
    def loader_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"batch_size": self.batch_size, "shuffle": True, "num_workers": self.num_workers,
                                  "pin_memory": self.pin_memory}
        if self.backend != "torch":
            kwargs["backend"] = self.backend
        if self.num_workers > 0:
            kwargs["persistent_workers"] = self.persistent_workers
            kwargs["prefetch_factor"] = self.prefetch_factor
            if self.multiprocessing_context and self.backend != "thread":
                kwargs["multiprocessing_context"] = self.multiprocessing_context
        return kwargs

    @property
    def dataloader_kwargs(self) -> dict[str, Any]:
        return dict(self.dataloader_settings)

    def make_loader(self, dataset: Any, **overrides: Any) -> Any:
        """``fastdata.loader(dataset, **self.loader_kwargs, **overrides)``."""
        from fastdata.loading import loader

        return loader(dataset, **{**self.loader_kwargs, **overrides})

    def explain(self) -> str:
        return tune_paragraph(self.measurements, self)

    def to_dict(self) -> dict[str, Any]:
        m = asdict(self.measurements)
        m["epoch_s"] = self.measurements.epoch_s
        return {
            "backend": self.backend, "num_workers": self.num_workers, "batch_size": self.batch_size,
            "persistent_workers": self.persistent_workers, "prefetch_factor": self.prefetch_factor,
            "pin_memory": self.pin_memory, "multiprocessing_context": self.multiprocessing_context,
            "predicted_samples_per_s": round(self.predicted_samples_per_s, 1),
            "measured_samples_per_s": None if self.measured_samples_per_s is None else round(self.measured_samples_per_s, 1),
            "predicted_wait_fraction": round(self.predicted_wait_fraction, 4),
            "wait_fraction": None if self.wait_fraction is None else round(self.wait_fraction, 4),
            "pss_mb_per_worker": self.pss_mb_per_worker,
            "loader_kwargs": self.loader_kwargs, "dataloader_kwargs": self.dataloader_kwargs,
            "measurements": m, "candidates": self.candidates, "conversion": self.conversion,
            "explanation": self.explain(), "elapsed_s": round(self.elapsed_s, 2), "budget_s": self.budget_s,
            "effective_budget_s": round(self.effective_budget_s, 2),
        }


# --- measuring --------------------------------------------------------------------------------


def _batches(length: int, batch_size: int, count: int, seed: int = 0) -> list[np.ndarray]:
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


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, tuple):
        return tuple(_clone(v) for v in value)
    if isinstance(value, list):
        return [_clone(v) for v in value]
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


class ReadyBatches(torch.utils.data.Dataset):
    """A probe: every index array returns a fresh copy of one real batch, so a loader over it
    measures only what it costs to hand such a batch from a worker to the loop."""

    supports_index_arrays = True

    def __init__(self, batch: Any, length: int):
        self.batch = batch
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, indices: Any) -> Any:
        return _clone(self.batch)


class ReadyBatchesOf(ReadyBatches):
    """:class:`ReadyBatches` whose batch is read from ``dataset`` by :meth:`prepare`, in the
    process that measures (``fastdata.sweep`` forks one per configuration from a parent that
    must not read: a parent that ran torch's intra-op threads can leave a forked child hung)."""

    def __init__(self, dataset: Any, batch_size: int, length: int):
        super().__init__(None, length)
        self.dataset, self.batch_size = dataset, batch_size

    def prepare(self) -> None:
        if self.batch is None:
            indices = np.arange(min(self.batch_size, len(self.dataset)), dtype=np.int64)
            self.batch = BatchFetcher(self.dataset)(indices)

    def __getitem__(self, indices: Any) -> Any:
        self.prepare()
        return _clone(self.batch)


def _loader(dataset: Any, backend: str, workers: int, batch_size: int, *, prefetch_factor: int = 2,
            context: str | None = None, pin_memory: bool = False, seed: int = 0) -> Any:
    from fastdata.loading import loader

    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=prefetch_factor)
        if context and backend != "thread":
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
    from fastdata.bench.timing import batch_length

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


def _start_method(requested: str | None) -> str:
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
    """Batches/s of 2 threads fetching at once over 1 thread: ~2 where the fetch releases the GIL."""
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
    indices = _batches(length, batch_size, 64)
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
    serial = probe(_loader(dataset, "torch", 0, batch_size), share / 2, warm_batches=1, max_batches=PROBE_BATCHES)
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
    speedup = _thread_speedup(fetch, indices, share / 2) if cores >= 2 and "thread" in backends else None
    pickle_error = _pickle_problem(dataset) if start_method != "fork" else None
    template = sample_batches[0]
    transfer: dict[str, float] = {}
    startup: dict[str, float] = {}
    ready = ReadyBatches(template, length)
    base = probe(_loader(ready, "torch", 0, batch_size), share / 4, warm_batches=1, max_batches=PROBE_BATCHES)
    base_ms = 1000 / (base.samples_per_s / batch_size) if base.samples_per_s else 0.0
    for backend in backends:
        if backend != "thread" and pickle_error:
            continue
        result = probe(_loader(ready, backend, 1, batch_size, context=start_method), share / 2, warm_batches=2,
                       max_batches=PROBE_BATCHES)
        per_batch = 1000 / (result.samples_per_s / batch_size) if result.samples_per_s else float("inf")
        transfer[backend] = max(0.0, per_batch - base_ms)
        startup[backend] = result.first_batch_s
    batches_per_epoch = math.ceil(length / batch_size)
    return Measurements(
        batch_size=batch_size, samples=length, batches_per_epoch=batches_per_epoch, batch_bytes=_nbytes(template),
        fetch_ms=fetch_ms, loop_ms=loop_ms, standard_fetch_ms=standard_ms, step_ms=step_ms, step_cpu_ms=step_cpu,
        thread_speedup=speedup, transfer_ms=transfer, startup_s=startup, usable_cores=cores,
        cpu_count=os.cpu_count() or 1, start_method=start_method, pickle_error=pickle_error,
        cuda=torch.cuda.is_available(),
    ), sample_batches


# --- predicting -------------------------------------------------------------------------------


def predict(m: Measurements, backend: str, workers: int) -> tuple[float, float]:
    """Predicted (samples/s, data-wait fraction) of ``backend`` with ``workers`` workers.

    Per batch: the loop runs ``overhead + transfer + step``; workers produce ``min(workers, cores) /
    (fetch + transfer)`` batches per ms (threads: only the share of the fetch that releases
    the GIL runs in parallel); all of it shares the usable cores."""
    f, s, cores = max(m.fetch_ms, 1e-6), m.step_ms, m.usable_cores
    if workers == 0:
        per_batch = max(m.loop_ms, f) + s
        return m.batch_size / per_batch * 1000, max(m.loop_ms, f) / per_batch
    c = m.transfer_ms[backend] + m.overhead_ms  # the loop's side of every batch
    if backend == "thread":
        speedup = m.thread_speedup if m.thread_speedup is not None else 1.0
        serial = min(1.0, max(0.0, 2 / max(speedup, 1e-6) - 1))  # Amdahl: the GIL-held share of a fetch
        parallel = 1 / (serial + (1 - serial) / min(workers, cores))
        producer = parallel / (f + c)
        cpu = cores / (f + c + m.step_cpu_ms)
    else:
        producer = min(workers, max(1, cores)) / (f + c)
        cpu = cores / (f + 2 * c + m.step_cpu_ms)
    consumer = 1 / (c + s) if c + s > 0 else math.inf
    rate = min(producer, consumer, cpu)  # batches per ms
    loop = 1 / rate
    return m.batch_size * rate * 1000, max(0.0, loop - s) / loop


def _candidates(m: Measurements, backends: tuple[str, ...], max_workers: int) -> list[dict[str, Any]]:
    rows = [{"backend": "torch", "num_workers": 0}]
    for backend in backends:
        if backend not in m.transfer_ms:
            continue
        rows += [{"backend": backend, "num_workers": n} for n in range(1, max_workers + 1)]
    for row in rows:
        rate, wait = predict(m, row["backend"], row["num_workers"])
        row.update(predicted_samples_per_s=round(rate, 1), predicted_wait_fraction=round(wait, 4))
    return rows


def _simplest_first(row: dict[str, Any]) -> tuple:
    return (row["num_workers"], _PREFERENCE[row["backend"]])


def _to_confirm(rows: list[dict[str, Any]], m: Measurements, limit: int) -> list[dict[str, Any]]:
    """The best predictions (and num_workers=0, the reference), or with a dominating step the
    fewest workers predicted to keep the data wait under 5% and the next one up."""
    chosen: list[dict[str, Any]] = [rows[0]]
    if m.step_ms > 0:
        enough = sorted((r for r in rows if r["predicted_wait_fraction"] < WAIT_TARGET), key=_simplest_first)
        for row in enough[:1]:
            chosen.append(row)
            chosen += [r for r in rows if r["backend"] == row["backend"] and r["num_workers"] == row["num_workers"] + 1]
    best = sorted(rows, key=lambda r: (-r["predicted_samples_per_s"], _simplest_first(r)))
    seen_backends = set()
    for row in best:
        if len(chosen) >= limit:
            break
        if row in chosen:
            continue
        if row["backend"] in seen_backends and row["predicted_samples_per_s"] < 0.9 * best[0]["predicted_samples_per_s"]:
            continue
        if any(other["backend"] == row["backend"] and other["num_workers"] < row["num_workers"] and
               other["predicted_samples_per_s"] >= 0.99 * row["predicted_samples_per_s"] for other in chosen):
            continue  # more workers than cores: the same prediction, more memory
        seen_backends.add(row["backend"])
        chosen.append(row)
    unique = []
    for row in chosen:
        if row not in unique:
            unique.append(row)
    return unique[:limit]


def _pick(rows: list[dict[str, Any]], m: Measurements) -> dict[str, Any]:
    """The recommendation among measured rows (predictions where a row was not measured)."""
    def rate(row: dict[str, Any]) -> float:
        measured = row.get("measured_samples_per_s")
        return measured if measured is not None else row["predicted_samples_per_s"]

    def wait(row: dict[str, Any]) -> float:
        measured = row.get("wait_fraction")
        return measured if measured is not None else row["predicted_wait_fraction"]

    if m.step_ms > 0:
        calm = sorted((r for r in rows if wait(r) < WAIT_TARGET), key=_simplest_first)
        if calm:
            return calm[0]
    top = max(rate(r) for r in rows)
    return sorted((r for r in rows if rate(r) >= (1 - TIE) * top), key=_simplest_first)[0]


# --- the entry point --------------------------------------------------------------------------


def tune(
    dataset: Any,
    batch_size: int = 256,
    step: float | Callable[[Any], Any] | str | None = None,
    budget_s: float = 60.0,
    *,
    backends: Iterable[str] = BACKENDS,
    start_method: str | None = None,
    max_workers: int | None = None,
    convert_source: Any = None,
    convert_options: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Recommendation:
    """Recommend ``fastdata.loader`` settings for ``dataset`` (see the module docstring).

    ``step`` is the training step after each batch: milliseconds to sleep, a function called
    with the batch, or ``"module:function"``. ``budget_s`` bounds the whole run. ``start_method``
    (default: this platform's) decides whether worker processes need a picklable dataset.
    ``convert_source`` (a folder path or ``torchvision:NAME``, with ``convert_options``) adds a
    prediction of what converting it to a fastdata format would give."""
    started = time.perf_counter()
    say = progress or (lambda message: None)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidOptionError(f"Invalid batch_size {batch_size!r}. Use a positive integer.")
    if not (budget_s > 0):
        raise InvalidOptionError(f"Invalid budget_s {budget_s!r}. Use a number of seconds > 0.")
    backends = tuple(backends)
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        raise InvalidOptionError(f"Unknown backend {unknown[0] if unknown else ''!r}. Allowed: {', '.join(map(repr, BACKENDS))}.")
    from fastdata.bench.sweep import step_options

    options = step_options(step)
    step_fn = options.get("step")
    if isinstance(step_fn, str):
        from fastdata.importing import load_callable

        step_fn = load_callable(step_fn, what="step")
    step_ms = options.get("step_ms", 0.0)
    if step_ms < 0:
        raise InvalidOptionError(f"Invalid step {step!r}: milliseconds must be >= 0.")
    method = _start_method(start_method)
    requested_budget = budget_s
    budget_s = min(budget_s, _effective_budget(dataset, batch_size, step_fn, step_ms, budget_s)
                   + (CONVERSION_PROBE_S if convert_source is not None else 0.0))
    say("measuring the fetch, the hand-over per backend, worker start-up, the GIL")
    m, sample_batches = measure(dataset, batch_size=batch_size, step=step_fn, step_ms=step_ms, backends=backends,
                                start_method=method, seconds=min(budget_s * 0.25, 8.0))
    limit_workers = max_workers if max_workers is not None else max(2, 2 * m.usable_cores)
    rows = _candidates(m, backends, limit_workers)
    confirm = _to_confirm(rows, m, limit=5)
    conversion_share = 0.2 if convert_source is not None else 0.0
    remaining = budget_s - (time.perf_counter() - started)
    per_probe = max(0.25, min(3.0, remaining * (1 - conversion_share) / (len(confirm) + 0.5) - 0.05))
    for position, row in enumerate(confirm):
        # the reference and the best prediction are always probed; the rest while the budget lasts
        if position >= 2 and budget_s - (time.perf_counter() - started) < per_probe + 0.2 + conversion_share * budget_s:
            row["skipped"] = "budget"
            continue
        say(f"probing backend={row['backend']} num_workers={row['num_workers']}")
        loader = _loader(dataset, row["backend"], row["num_workers"], batch_size, context=method)
        result = probe(loader, per_probe, step=step_fn, step_s=step_ms / 1000, memory=row["num_workers"] > 0
                       and row["backend"] != "thread")
        row.update(measured_samples_per_s=round(result.samples_per_s, 1), wait_fraction=round(result.wait_fraction, 4),
                   first_batch_s=round(result.first_batch_s, 4), pss_mb_per_worker=result.pss_mb_per_worker)
    measured = [r for r in confirm if "measured_samples_per_s" in r]
    best = _pick(measured or rows, m)
    recommendation = Recommendation(
        backend=best["backend"], num_workers=best["num_workers"], batch_size=batch_size,
        persistent_workers=best["num_workers"] > 0,  # start-up paid once; explain() compares it with the epoch
        prefetch_factor=2 if best["num_workers"] > 0 else None,
        pin_memory=m.cuda, predicted_samples_per_s=best["predicted_samples_per_s"],
        measured_samples_per_s=best.get("measured_samples_per_s"),
        predicted_wait_fraction=best["predicted_wait_fraction"], wait_fraction=best.get("wait_fraction"),
        pss_mb_per_worker=best.get("pss_mb_per_worker"), measurements=m, candidates=rows,
        multiprocessing_context=start_method if best["backend"] != "thread" and best["num_workers"] > 0 else None,
        budget_s=requested_budget, effective_budget_s=budget_s,
    )
    recommendation.dataloader_settings = _dataloader_settings(rows, m, batch_size)
    if convert_source is not None:
        left = budget_s - (time.perf_counter() - started)
        if left > 1.0:
            say("probe conversion of a sample")
            recommendation.conversion = predict_conversion(
                dataset, m, recommendation, backends, limit_workers, seconds=left - 0.5,
            )
    recommendation.elapsed_s = time.perf_counter() - started
    return recommendation


def _effective_budget(dataset: Any, batch_size: int, step: Callable[[Any], Any] | None, step_ms: float,
                      budget_s: float) -> float:
    """``budget_s``, or less for a small dataset: about ``EPOCHS_WORTH`` epochs at num_workers=0
    (at least ``MIN_BUDGET_S``). Telling settings apart takes a fixed number of batches, not
    epochs; an exhaustive sweep of a small dataset is itself quick, and tune should stay far
    below it."""
    if len(dataset) == 0:
        return budget_s
    fetch = BatchFetcher(dataset)
    indices = _batches(len(dataset), batch_size, 3)
    try:
        times = []
        for batch_indices in (indices * 2)[:2]:  # the first call pays one-off costs (opening files, imports)
            start = time.perf_counter()
            batch = fetch(batch_indices)
            if step is not None:
                step(batch)
            times.append(time.perf_counter() - start)
        per_batch = min(times) + step_ms / 1000
    except Exception:  # noqa: BLE001 - measure() reports a dataset that cannot be read
        return budget_s
    epoch_s = per_batch * math.ceil(len(dataset) / batch_size)
    return min(budget_s, max(MIN_BUDGET_S, EPOCHS_WORTH * epoch_s))


def _dataloader_settings(rows: list[dict[str, Any]], m: Measurements, batch_size: int) -> dict[str, Any]:
    """The best plain-DataLoader (backend torch) row as DataLoader keywords."""
    torch_rows = [r for r in rows if r["backend"] == "torch"]
    measured = [r for r in torch_rows if "measured_samples_per_s" in r]
    best = _pick(measured if len(measured) > 1 else torch_rows, m)  # never a guess against a measurement
    kwargs: dict[str, Any] = {"batch_size": batch_size, "shuffle": True, "num_workers": best["num_workers"],
                              "pin_memory": m.cuda}
    if best["num_workers"] > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=2)
    return kwargs


def predict_conversion(dataset: Any, m: Measurements, current: Recommendation, backends: tuple[str, ...],
                       max_workers: int, *, seconds: float, probe_samples: int = 512) -> dict[str, Any] | None:
    """Convert a sample of ``dataset`` (what the source reads as) to npy, time its fetch, and
    predict the best rate after a full conversion (same hand-over costs: same batch)."""
    from torch.utils.data import Subset

    from fastdata.api import open_dataset
    from fastdata.conversion import convert

    count = min(len(dataset), max(probe_samples, m.batch_size))
    with tempfile.TemporaryDirectory(prefix="fastdata-tune-") as scratch:
        out = Path(scratch) / "probe.npy"
        start = time.perf_counter()
        try:
            convert(Subset(dataset, range(count)), out, format="npy", store="raw", workers=0)
        except FastdataError as exc:
            return {"format": "npy", "store": "raw", "error": str(exc)}
        conversion_s = time.perf_counter() - start
        converted = open_dataset(out)
        fetch = BatchFetcher(converted)
        indices = _batches(count, min(m.batch_size, count), 16)
        position = iter(range(10**9))
        fetch_ms = statistics.median(_timed_calls(lambda: fetch(indices[next(position) % len(indices)]),
                                                  min(1.0, seconds / 2))) * 1000
    scaled = dict(asdict(m), fetch_ms=fetch_ms, loop_ms=fetch_ms + m.overhead_ms)
    after = Measurements(**scaled)
    best = max(_candidates(after, backends, max_workers), key=lambda r: r["predicted_samples_per_s"])
    here = current.measured_samples_per_s or current.predicted_samples_per_s
    return {
        "format": "npy", "store": "raw", "probe_samples": count, "fetch_ms": round(fetch_ms, 4),
        "predicted_samples_per_s": best["predicted_samples_per_s"], "backend": best["backend"],
        "num_workers": best["num_workers"], "speedup": round(best["predicted_samples_per_s"] / here, 2) if here else None,
        "predicted_conversion_s": round(conversion_s / count * m.samples, 3),
    }
