"""``num_workers="auto"``: a loader that measures the training loop while it runs and changes its
backend's workers between batches (the search: :mod:`fastdata.loading.autotune`).

The epoch's batches come from the one :class:`~fastdata.loading.samplers.BatchIndexSampler`, drawn
before any parallelism, exactly as for a fixed setting; the running setting only decides who
computes the next batches. A change closes the fixed loader of the old setting at a batch
boundary and opens one of the new setting on the batches not yet handed out (batches the old
workers had computed ahead are computed again), so the batches and their order never depend on
the tuning. Every decision is logged on the ``fastdata`` logger (INFO) and kept in
:attr:`AutoLoader.tuning_log`; :attr:`AutoLoader.tuned` gives the setting to pin.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from typing import Any, Callable, Iterator

import numpy as np

from fastdata.errors import SharedMemoryFullError
from fastdata.loading.autotune import Search, decide, start
from fastdata.loading.backends import get_backend
from fastdata.loading.measures import Budget, Setting, Window, log_entry
from fastdata.loading.base import Resumable, WorkerError
from fastdata.loading.samplers import BatchIndexSampler, Drawn
from fastdata.loading.shm import needed_bytes

logger = logging.getLogger("fastdata")

WINDOW_BATCHES = 8  # a window holds at least this many batches (and three chunks) ...
CHUNKS = 3  # a window's chunks: trimmed means of their time, wait and step per batch are the window's
TRIM = 0.2  # the share of chunks dropped at each end (the slowest and quickest) before the mean
WINDOW_S = 0.25  # ... and lasts at least this long
MEMORY_SHARE = 0.5  # the default memory budget: this share of the RAM available at the start
_BATCH_NUMBER = re.compile(r"\bbatch (\d+) \(indices")  # how a backend's WorkerError names the batch


class Segment:
    """What a fixed loader of the running setting iterates: the batches of the epoch not yet handed
    out (the sampler's index arrays, unchanged), as a sampler would yield them."""

    def __init__(self, sampler: BatchIndexSampler):
        self.batch_size = sampler.batch_size
        self.batches: list[np.ndarray] = []
        self.epoch = 0
        self.resume_at = 0
        self.stages: list = []  # the position a fixed loader reads (the auto loader keeps its own state)
        self.drawn: Drawn | None = None

    def __iter__(self) -> Iterator[np.ndarray]:
        batches = list(self.batches)
        self.drawn = Drawn(len(batches), ended=True)  # the pass is known whole (a sampler's ``drawn``)
        return iter(batches)

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class TimedFetch:
    """A fixed loader's ``fetch`` that adds the time of each call to ``meter`` (serial loop and
    threads: the producers' time per batch)."""

    def __init__(self, fetch: Callable[..., Any], meter: "Meter"):
        self.fetch, self.meter = fetch, meter

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        begun = time.perf_counter()
        try:
            return self.fetch(*args, **kwargs)
        finally:
            self.meter.produced(time.perf_counter() - begun)


class Meter:
    """The running window: batches, samples, the loop's wait and step, the producers' time; CPU
    and memory of the process tree at its ends (psutil)."""

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()
        self._lock = threading.Lock()
        self.processes = False  # whether the running setting has worker processes
        self._kids: list[Any] | None = None
        self.batch_bytes: int | None = None  # a batch's arrays, measured once per setting
        self.reset(skip=0, timed=False)

    def watch(self, *, processes: bool) -> None:
        """A new setting: its worker processes (if any) are found again, once, and a batch's
        memory measured again (:meth:`weigh`)."""
        self.processes, self._kids = processes, None
        self.batch_bytes = None

    def weigh(self, batch: Any) -> None:
        """The memory of a batch's arrays, from the first batch of a setting."""
        if self.batch_bytes is None:
            self.batch_bytes = needed_bytes(batch)

    def reset(self, *, skip: int, timed: bool) -> None:
        self.skip, self.timed = skip, timed
        self.batches = self.samples = 0
        self.wait_s = self.step_s = self.produce_s = 0.0
        self.begun = self.cpu_begun = None
        self.stamps: list[float] = []  # when each batch was handed out
        self.waits: list[float] = []
        self.steps: list[float] = []

    def produced(self, seconds: float) -> None:
        with self._lock:
            self.produce_s += seconds

    def tree_cpu_s(self) -> float:
        """CPU seconds of this process and its children (user + system)."""
        total = 0.0
        for process in [self._process, *self._children()]:
            try:
                times = process.cpu_times()
            except Exception:  # a child that just ended
                continue
            total += times.user + times.system
        return total

    def _children(self) -> list[Any]:
        """The running setting's worker processes: none for the serial loop and threads; for
        processes, listed once per setting (a scan of /proc is slow on a busy machine)."""
        if not self.processes:
            return []
        if not self._kids:
            try:
                self._kids = self._process.children(recursive=True)
            except Exception:
                self._kids = []
        return self._kids

    def batch(self, samples: int, wait_s: float) -> None:
        """A batch reached the loop after ``wait_s`` in ``next()``."""
        if self.skip > 0:  # warm-up after a change: not counted
            self.skip -= 1
            if self.skip == 0:
                self._begin(time.perf_counter())
                with self._lock:
                    self.produce_s = 0.0
            return
        now = time.perf_counter()
        if self.begun is None:
            self._begin(now - wait_s)
        self.stamps.append(now)
        self.batches += 1
        self.samples += samples
        self.wait_s += wait_s
        self.waits.append(wait_s)

    def _begin(self, now: float) -> None:
        self.begun = now
        self.stamps = [now]
        self.cpu_begun = self.tree_cpu_s()

    def step(self, seconds: float) -> None:
        if self.begun is not None:
            self.step_s += seconds
            self.steps.append(seconds)

    def window(self, num_workers: int, prefetch: int = 2) -> Window | None:
        """The finished window, or None while it is too short."""
        chunk = max(2, num_workers * prefetch + 1)  # longer than the batches in flight
        if self.begun is None or self.batches < max(WINDOW_BATCHES, CHUNKS * chunk):
            return None
        wall = time.perf_counter() - self.begun
        if wall < WINDOW_S:
            return None
        import psutil

        added = self.worker_bytes()
        with self._lock:
            produce = self.produce_s if self.timed else None
        return Window(batches=self.batches, samples=self.samples, wall_s=wall, wait_s=self.wait_s,
                      step_s=self.step_s, produce_s=produce,
                      busy_cores=(self.tree_cpu_s() - self.cpu_begun) / wall,
                      worker_bytes=added, flight_bytes=prefetch * self.batch_bytes if self.batch_bytes else None,
                      available_bytes=psutil.virtual_memory().available,
                      **self._medians(chunk))

    def worker_bytes(self) -> int | None:
        """The memory a worker process adds, on average: its unique set (USS: pages no other
        process maps). Not its RSS: a forked worker maps this process's whole heap, copy-on-write,
        and only what it writes becomes its own."""
        added = []
        for child in self._children():
            try:
                added.append(child.memory_full_info().uss)
            except Exception:  # a child that just ended, or no smaps to read: its RSS
                try:
                    added.append(child.memory_info().rss)
                except Exception:
                    pass
        return int(sum(added) / len(added)) if added else None

    def _medians(self, chunk: int) -> dict[str, float]:
        """Per batch, the trimmed mean over the window's chunks of ``chunk`` batches: time, wait,
        step. A median would drop every slow batch, and so flatter a loop whose batches are slow
        now and then (the serial loop's); the trim only drops the few that waited for a core."""
        periods, waits, steps = [], [], []
        for start in range(0, self.batches - chunk + 1, chunk):
            periods.append((self.stamps[start + chunk] - self.stamps[start]) / chunk)
            waits.append(sum(self.waits[start:start + chunk]) / chunk)
            steps.append(sum(self.steps[start:start + chunk]) / chunk)
        if not periods:
            return {}
        return {"period_s": trimmed_mean(periods), "wait_per_batch_s": trimmed_mean(waits),
                "step_median_s": trimmed_mean(steps)}


def _numbered(error: WorkerError, first: int) -> WorkerError:
    """``error`` as the epoch's fixed loader would word it: the backend numbers the batches of the
    segment it was given, which starts at the epoch's batch ``first``."""
    if not first:
        return error
    text = _BATCH_NUMBER.sub(lambda match: f"batch {int(match.group(1)) + first} (indices", str(error), count=1)
    return WorkerError(text)


def trimmed_mean(values: list[float], *, trim: float = TRIM) -> float:
    """The mean of ``values`` without the ``trim`` share of them at each end (none of 1-4 values)."""
    ordered = sorted(values)
    cut = int(len(ordered) * trim)
    kept = ordered[cut:len(ordered) - cut]
    return sum(kept) / len(kept)


class AutoLoader(Resumable):
    """``fastdata.loader(..., num_workers="auto")`` (module docstring). ``build(setting, segment)``
    makes the fixed loader of a setting over a :class:`Segment`."""

    num_workers = "auto"

    def __init__(self, dataset: Any, sampler: BatchIndexSampler, *, build: Callable[[Setting, Segment], Any],
                 backend: str, budget: Budget, prefetch: int = 2):
        self.dataset = dataset
        self.sampler = self.index_sampler = self.batch_sampler = sampler
        self.batch_size = sampler.batch_size
        self.backend = backend
        self.budget = budget
        self._build = build
        self._segment = Segment(sampler)
        self._meter = Meter()
        self._inner: Any = None
        self._inner_setting: Setting | None = None
        self._tuning: object | None = None  # the iterator mid-epoch on self._inner, which it measures
        self._others: list[Any] = []  # the fixed loaders older iterators read from (close() stops them too)
        self._batches = 0  # batches handed out in this loader's life
        self._began: float | None = None  # when the first epoch started
        self.tuning_log: list[dict[str, Any]] = []
        self.prefetch = prefetch  # the user's prefetch_factor: the search changes workers, not the depth
        self._restart(Setting(budget.backends[0], 0, prefetch))

    def _restart(self, setting: Setting) -> None:
        self._search: Search = start(setting)
        self._setting = setting

    @property
    def setting(self) -> Setting:
        """The setting running now."""
        return self._setting

    @property
    def tuned(self) -> dict[str, Any]:
        """The best setting found so far as ``fastdata.loader`` keywords (paste them to pin it)."""
        best = self._search.best
        kwargs: dict[str, Any] = {"backend": best.backend, "num_workers": best.num_workers}
        if best.num_workers:
            kwargs.update(prefetch_factor=best.prefetch, persistent_workers=True)
        return kwargs

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        return self.tracked(self.epoch_iter)

    def epoch_iter(self) -> Iterator[Any]:
        batches = list(self.sampler)
        epoch = self.sampler.epoch - 1
        if self._began is None:
            self._began = time.perf_counter()
        run = object()  # this iterator: it tunes while it is the newest (self._tuning)
        self._leave_inner()
        self._tuning = run
        done = 0
        try:
            while done < len(batches):
                setting = self._setting
                inner, first = self._loader_for(run, setting, batches[done:], epoch), done
                iterator = iter(inner)
                try:
                    while True:
                        begun = time.perf_counter()
                        try:
                            batch = next(iterator)
                        except StopIteration:
                            break
                        except Exception as exc:
                            if self._fall_back(setting, exc):
                                break  # the rest of the epoch on the setting fallen back to
                            if isinstance(exc, WorkerError):
                                raise _numbered(exc, first) from exc.__cause__
                            raise
                        handed = time.perf_counter()
                        tuning = self._tuning is run
                        if tuning:
                            self._meter.batch(len(batches[done]), handed - begun)
                            self._meter.weigh(batch)
                        done += 1
                        self._batches += 1
                        yield batch
                        del batch
                        if tuning and self._tuning is run:
                            self._meter.step(time.perf_counter() - handed)
                            if self._measured() and self._setting != setting:
                                break
                finally:
                    self._let_go(inner, iterator)
        finally:
            if self._tuning is run:
                self._tuning = None

    def _loader_for(self, run: object, setting: Setting, batches: list[np.ndarray], epoch: int) -> Any:
        """The fixed loader iterator ``run`` reads ``batches`` with: the running setting's while it
        tunes, else one of its own (a newer iterator took the tuning: :meth:`_leave_inner`)."""
        if self._tuning is run:
            return self._open(setting, batches, epoch)
        own = Segment(self.sampler)
        own.batches, own.epoch = batches, epoch
        self._others.append(self._build(setting, own))
        return self._others[-1]

    def _let_go(self, inner: Any, iterator: Any) -> None:
        """An iterator's pass over ``inner`` ended: ``inner`` stops unless it is the running one."""
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
        if inner is not self._inner:  # left to this iterator (_leave_inner), or its own
            _close(inner)
            self._others = [other for other in self._others if other is not inner]

    def _leave_inner(self) -> None:
        """A new iterator starts while another is mid-epoch on the running setting's fixed loader
        ("peek, then train", ``zip(loader, loader)``): that one keeps the loader (it closes it when it
        ends) and reads on, no longer measured; the new one tunes, on a fixed loader of its own. Each
        reads every batch of its epoch once, as with a fixed setting."""
        if self._tuning is None or self._inner is None:
            return
        fetch = getattr(self._inner, "fetch", None)
        if isinstance(fetch, TimedFetch):  # its time no longer counts
            self._inner.fetch = fetch.fetch
        self._others.append(self._inner)
        self._inner = self._inner_setting = None
        self._segment = Segment(self.sampler)  # the old one stays with the loader left behind

    def _open(self, setting: Setting, batches: list[np.ndarray], epoch: int) -> Any:
        """The fixed loader of ``setting`` over ``batches`` (kept while the setting stays)."""
        if self._inner_setting != setting:
            self._close_inner()
            self._inner = self._build(setting, self._segment)
            self._inner_setting = setting
            self._meter.watch(processes=setting.num_workers > 0 and setting.backend != "thread")
            fetch = getattr(self._inner, "fetch", None)
            if fetch is not None and (setting.backend != "process" or not setting.num_workers):
                self._inner.fetch = TimedFetch(fetch, self._meter)
            # a window goes on across epochs while the setting stays (an epoch may be shorter than a window)
            self._meter.reset(skip=1 + setting.num_workers, timed=isinstance(self._inner.fetch, TimedFetch)
                              if hasattr(self._inner, "fetch") else False)
        self._segment.batches, self._segment.epoch = batches, epoch
        return self._inner

    def _measured(self) -> bool:
        """Between two batches: when a window is complete, decide (and log). True after a decision."""
        window = self._meter.window(self._setting.num_workers, self._setting.prefetch)
        if window is None:
            return False
        self._meter.reset(skip=0, timed=self._meter.timed)
        before = self._setting
        self._search, decision = decide(self._search, window, self.budget)
        if decision is None:
            return False
        self._setting = decision.setting
        if decision.setting != before:
            message = f"num_workers {before.num_workers} -> {decision.setting.num_workers} " \
                      f"({decision.setting.backend}): {decision.reason}"
        else:
            message = f"num_workers {before.num_workers} ({before.backend}): {decision.reason}"
        logger.info(message)
        self.tuning_log.append(log_entry(self._batches, decision.setting, window, message,
                                         elapsed_s=time.perf_counter() - (self._began or 0.0)))
        return True

    def _fall_back(self, setting: Setting, error: Exception) -> bool:
        """Where /dev/shm has no room for worker processes' batches (Docker's default 64 MB): on to
        threads (or, without them among the backends, ``num_workers=0``) for good, logged; False for
        any other error (the loop gets it)."""
        full = error if isinstance(error, SharedMemoryFullError) else error.__cause__
        if not isinstance(full, SharedMemoryFullError):
            return False
        if not setting.num_workers or not get_backend(setting.backend).crosses_process:
            return False  # no worker processes (the dataset's own error): nothing to fall back from
        if self._setting != setting:  # fallen back already (another iterator): the rest on that setting
            return True
        left = tuple(name for name in self.budget.backends if not get_backend(name).crosses_process)
        self.budget = dataclasses.replace(self.budget, backends=left or self.budget.backends,
                                          max_workers=self.budget.max_workers if left else 0)
        fallen = Setting(left[0], min(setting.num_workers, self.budget.limit(left[0]))) if left \
            else setting.with_workers(0)
        why = str(full).strip().splitlines()[-1].split("SharedMemoryFullError: ", 1)[-1]
        message = f"num_workers {setting.num_workers} -> {fallen.num_workers} ({fallen.backend}): {why}"
        logger.warning(message)
        self.tuning_log.append(log_entry(self._batches, fallen, None, message,
                                         elapsed_s=time.perf_counter() - (self._began or 0.0)))
        self._restart(fallen)
        return True

    def _close_inner(self) -> None:
        inner, self._inner, self._inner_setting = self._inner, None, None
        if inner is not None:
            _close(inner)

    def close(self) -> None:
        """Stop the workers of the running setting and those older iterators still read from."""
        self._close_inner()
        while self._others:
            _close(self._others.pop())

    def __del__(self) -> None:
        try:
            self._close_inner()
        except Exception:
            pass

    def state_dict(self) -> dict[str, Any]:
        """The position (:meth:`Resumable.state_dict`) and ``tuned``: the best setting so far, which a
        loader that loads this state starts from."""
        state = super().state_dict()
        best = self._search.best
        state["tuned"] = {"backend": best.backend, "num_workers": best.num_workers, "prefetch": best.prefetch}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        tuned = state.get("tuned") if isinstance(state, dict) else None  # a list of ranks' states: the position only
        if isinstance(tuned, dict) and tuned.get("backend") in self.budget.backends:
            workers = min(int(tuned.get("num_workers", 0)), self.budget.limit(tuned["backend"]))
            self._restart(Setting(tuned["backend"], max(0, workers), self.prefetch))

    def __repr__(self) -> str:
        return (f"AutoLoader(backend={self.backend!r}, running={self._setting.backend!r} x "
                f"{self._setting.num_workers}, batch_size={self.batch_size}, batches={len(self)})")


def _close(inner: Any) -> None:
    """Stop the workers of a fixed loader."""
    for name in ("close", "shutdown"):
        method = getattr(inner, name, None)
        if method is not None:
            method()
            return
    iterator = getattr(inner, "_iterator", None)  # a DataLoader with persistent workers
    if iterator is not None:
        inner._iterator = None
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
