"""Downloads into the cache: several at once, each file in ranged GETs that run concurrently.

- :class:`Downloads` (one per process, its threads made again after a fork): a file is read as
  byte ranges of :data:`PART_BYTES`, up to ``connections`` GETs in flight for the whole process,
  each range handed to the cache's writer in order as soon as it and the ones before it are in
  (the writer hashes as it writes, so nothing is read twice; at most ``connections + 1`` ranges
  are held in memory);
- :class:`Prefetcher`: the file a tar reader reads now and the ``prefetch`` after it, fetched at
  the same time in background threads, each leased in the cache until the reader takes it. A
  prefetch only takes room the cache has free (never evicting a file in use); when the file the
  reader needs now finds none, the files fetched ahead are let go first, so the cache stays
  within ``cache_limit`` plus that one file.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

logger = logging.getLogger(__name__)
PART_BYTES = 8 * 1024 * 1024
CONNECTIONS = 8


class Downloads:
    """This process's download threads (``connections`` ranged GETs in flight at most)."""

    def __init__(self, connections: int = CONNECTIONS):
        self.connections = connections
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1
        self._lock = threading.Lock()

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():  # a forked child: its own threads
                self._pool = ThreadPoolExecutor(self.connections, thread_name_prefix="fastdata-download")
                self._pid = os.getpid()
            return self._pool

    def read(self, get: Callable[[int, int], bytes], size: int, write: Callable[[bytes], None]) -> None:
        """Hand ``write`` the bytes ``[0, size)`` in order, ``get(start, end)`` fetching each part
        of :data:`PART_BYTES` (up to ``connections`` at once, the next ones while this one is
        written)."""
        if size <= PART_BYTES:
            if size:
                write(get(0, size))
            return
        starts = iter(range(0, size, PART_BYTES))
        pending: collections.deque[Future] = collections.deque()
        pool = self.pool()

        def more() -> None:
            start = next(starts, None)
            if start is not None:
                pending.append(pool.submit(get, start, min(start + PART_BYTES, size)))

        for _ in range(self.connections):
            more()
        try:
            while pending:
                data = pending.popleft().result()
                more()
                write(data)
        finally:
            for future in pending:  # a failed part: the others are not waited for
                future.cancel()


class Prefetcher:
    """Fetches the files a reader reads next in background threads, all of its window at once:
    ``fetch(name)`` returns a lease on the cached file, or None when the cache has no room for it
    now (the reader then fetches it itself, :meth:`make_room` first). A file ``cached(name)``
    finds in the cache already is leased at once, without a thread (a warm epoch starts none)."""

    def __init__(self, fetch: Callable[[str], Any], window: int, cached: Callable[[str], Any] = lambda name: None):
        self.fetch, self.size = fetch, window
        self.cached = cached  # a lease on a file already in the cache, or None: no thread for a warm read
        self.ahead: dict[str, Any] = {}  # name -> its lease, fetched and waiting for the reader
        self.window: list[str] = []  # the names wanted now, in the order they will be read
        self.inflight: set[str] = set()
        self.failed: dict[str, BaseException] = {}  # the first wanted file's fetch failed: the reader's error
        self._lock = threading.Condition()

    def want(self, names: list[str]) -> None:
        """The reader's next files, in order (the one it reads now first): the first ``window``
        are fetched (those already there are kept), leases on any others released."""
        with self._lock:
            self.window = names[: self.size]
            self.failed = {}
            for name in [n for n in self.ahead if n not in self.window]:
                _release(self.ahead.pop(name))
            self._start()

    def _start(self) -> None:
        """Start fetching every wanted file not there yet, in the order they are read (under the lock)."""
        for name in self.window:
            if name not in self.ahead and name not in self.inflight:
                lease = self.cached(name)  # a lock and a stat: cheaper than a thread
                if lease is not None:
                    self.ahead[name] = lease
                    continue
                self.inflight.add(name)
                threading.Thread(target=self._fetch_one, args=(name,), daemon=True, name="fastdata-prefetch").start()

    def _fetch_one(self, name: str) -> None:
        lease = None
        try:
            lease = self.fetch(name)
        except Exception as exc:  # noqa: BLE001 - raised to the reader if it waits for this file now
            with self._lock:
                if self.window[:1] == [name]:
                    self.failed[name] = exc
                logger.debug("prefetch of %s failed: %s", name, exc)
        with self._lock:
            self.inflight.discard(name)
            self._lock.notify_all()
            if lease is not None and name in self.window:
                self.ahead[name] = lease
            else:  # not wanted any more, or no room now: the reader fetches it itself
                _release(lease)

    def take(self, name: str) -> Any:
        """The lease on ``name`` if it was fetched ahead (waiting for a fetch of it in progress:
        one download of it, never two), else None; its fetch's error if it failed."""
        with self._lock:
            self._lock.wait_for(lambda: name not in self.inflight)
            if name in self.window:
                self.window.remove(name)
            if name in self.failed:
                raise self.failed.pop(name)
            return self.ahead.pop(name, None)

    def make_room(self) -> None:
        """Release the files fetched ahead (the cache may evict them): the file the reader needs
        now goes before them."""
        with self._lock:
            for lease in self.ahead.values():
                _release(lease)
            self.ahead = {}

    def stop(self) -> None:
        """Release every lease fetched ahead; fetches in progress release theirs when done."""
        with self._lock:
            self.window = []
            self.failed = {}
        self.make_room()


DOWNLOADS = Downloads()  # every dataset of the process shares its download threads


def _release(lease: Any) -> None:
    if lease is not None:
        lease.release()
