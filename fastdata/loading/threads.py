"""The ``thread`` backend: ``num_workers`` threads, each computing whole batches
(``dataset[indices]``), with a bounded number of batches in flight, delivered in order.

Nothing crosses a process boundary: a batch is handed over by reference. Threads pay off where
the work releases the GIL (numpy gathers, image decoding in Pillow's C code, file reads) and
cost little where it does not; they share the main process's memory, start instantly, and need
no picklable dataset.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Iterator

from fastdata.loading.base import BatchLoader, WorkerError, describe_indices


class ThreadLoader(BatchLoader):
    """Batches computed by a pool of threads (see the module docstring)."""

    backend = "thread"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._pool: ThreadPoolExecutor | None = None
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self._live = 0  # epochs under way on the pool (two live iterators share it: the last one ends it)

    def _start(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="fastdata-loader",
                                            initializer=self._init_thread)
        return self._pool

    def _init_thread(self) -> None:
        with self._lock:
            number = next(self._numbers) % self.num_workers
        threading.current_thread().fastdata_worker = number
        if self.worker_init_fn is not None:
            self.worker_init_fn(number)

    def _compute(self, indices: Any) -> tuple[int, Any]:
        return getattr(threading.current_thread(), "fastdata_worker", 0), self.fetch(indices)

    def epoch_iter(self) -> Iterator[Any]:
        batches = self.epoch_batches()
        pool = self._start()
        pending: deque[tuple[int, Any, Future]] = deque()
        limit = max(1, self.num_workers * self.prefetch_factor)
        upcoming = iter(enumerate(batches))
        completed = False
        self._live += 1
        try:
            for number, indices in itertools.islice(upcoming, limit):
                pending.append((number, indices, pool.submit(self._compute, indices)))
            while pending:
                number, indices, future = pending.popleft()
                batch = self._result(number, indices, future)
                for more, more_indices in itertools.islice(upcoming, 1):
                    pending.append((more, more_indices, pool.submit(self._compute, more_indices)))
                yield self.pinned(batch)
            completed = True
        finally:
            for _, _, future in pending:
                future.cancel()
            self._live -= 1
            if not self.persistent_workers and not self._live:  # after an error (a timeout: a thread may hang) raise at once
                self.shutdown(wait=completed)

    def _result(self, number: int, indices: Any, future: Future) -> Any:
        try:
            _, batch = future.result(timeout=self.timeout or None)
        except FutureTimeout:
            raise WorkerError(
                f"thread backend: batch {number} (indices {describe_indices(indices)}) was not ready within "
                f"timeout={self.timeout} s."
            ) from None
        except Exception as exc:
            raise WorkerError(
                f"thread backend: batch {number} (indices {describe_indices(indices)}) failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return batch

    def shutdown(self, wait: bool = True) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None
            self._numbers = itertools.count()

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
