"""The one bounded cache of remote files, shared by every process on the machine.

Layout under ``cache_dir``: ``<dataset key>/<file name>`` for each cached file (a name may lie in
the dataset's own sub-folders, ``fields/x.bin``), ``.tmp/`` for downloads in progress,
``.locks/`` for one lock file per entry, ``.uploads/`` for conversions to a URL, and the marker
file ``.fastdata-cache``. The cache evicts files, so it works only in a folder of its own
(:mod:`fastdata.remote.cachedir`), and eviction only ever looks inside the dataset folders it
made (``<name>-<16 hex digits>``) and at its own downloads. Coordination is the file system
alone, so ranks, DataLoader workers and later runs share it with nothing to set up or clean:

- a reader holds a shared ``flock`` on each file it uses (a :class:`Lease`); eviction takes an
  exclusive, non-blocking one first, so a file in use is never removed;
- one process downloads an entry while the others wait on its lock file, then use its copy;
- a download goes to ``.tmp/`` under an exclusive lock, is checked, and is renamed into place
  (atomic), so a half-written file is never seen under its name (HDF5's own read locks are
  shared ones, so they mix with these); a killed process's locks
  vanish with it and its temporary file is removed by the next process that needs room;
- room is made under ``.lock``, evicting least recently used files first (a file's mtime is
  set each time it is leased); downloads in progress count at their final size.

Unlike Mosaic Streaming's shared-memory registry, nothing survives a killed process except
files whose state the file system itself tells (locked or not), hence no stale state to reset.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from fastdata.errors import CorruptDataError, InvalidOptionError
from fastdata.remote.cachedir import GLOBAL_LOCK, LOCKS, PART_NAME, TMP, claim_directory, is_entry, writing_to

logger = logging.getLogger(__name__)

DEFAULT_LIMIT = 20 * 1024**3
_WAIT_FOR_ROOM_S = 10.0  # a needed file waits this long for leases elsewhere to end, then goes over the limit


def default_cache_dir() -> Path:
    """``$FASTDATA_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastdata``, else ``~/.cache/fastdata``."""
    if os.environ.get("FASTDATA_CACHE_DIR"):
        return Path(os.environ["FASTDATA_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastdata"


def default_cache_limit() -> int:
    """``$FASTDATA_CACHE_LIMIT`` (bytes; ``20GB``-style sizes too), else 20 GiB."""
    text = os.environ.get("FASTDATA_CACHE_LIMIT")
    if not text:
        return DEFAULT_LIMIT
    from fastdata.quantities import parse_bytes  # the CLI's size parser; only when the variable is set

    return parse_bytes(text, flag="FASTDATA_CACHE_LIMIT")


@dataclass
class CacheStats:
    """What this process's cache did: files found, downloaded (bytes, seconds), evicted."""

    hits: int = 0
    downloads: int = 0
    bytes_downloaded: int = 0
    download_seconds: float = 0.0
    evictions: int = 0
    refetched: list[str] = field(default_factory=list)


_HELD: dict[str, int] = {}  # path -> leases this process holds on it (no use waiting for those to end)


class Lease:
    """A shared lock on one cached file, held while it is read: it is not evicted meanwhile."""

    def __init__(self, descriptor: int, path: Path):
        self.descriptor, self.path = descriptor, path
        _HELD[str(path)] = _HELD.get(str(path), 0) + 1

    def release(self) -> None:
        if self.descriptor >= 0:
            os.close(self.descriptor)  # closing drops the lock
            self.descriptor = -1
            count = _HELD.get(str(self.path), 1) - 1
            if count > 0:
                _HELD[str(self.path)] = count
            else:
                _HELD.pop(str(self.path), None)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.release()


def _entry_id(key: str, name: str) -> str:
    return hashlib.blake2b(f"{key}/{name}".encode(), digest_size=12).hexdigest()


class Cache:
    """``cache_dir`` bounded by ``cache_limit`` bytes (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike | None = None, limit: int | None = None):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
            raise InvalidOptionError(f"Invalid cache_limit {limit!r}. Use a positive number of bytes.")
        self.limit = limit if limit is not None else default_cache_limit()
        self.directory = claim_directory(directory if directory is not None else default_cache_dir())
        self.stats = CacheStats()

    def path(self, key: str, name: str) -> Path:
        if not is_entry(key):
            raise InvalidOptionError(f"Invalid cache key {key!r}: a dataset's folder in the cache is named "
                                     "'<name>-<16 hex digits>'.")
        return self.directory / key / name

    # --- using a cached file -------------------------------------------------------------

    def lease(self, key: str, name: str) -> Lease | None:
        """A lease on the cached file, or None when it is not in the cache."""
        path = self.path(key, name)
        while True:
            try:
                descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except FileNotFoundError:
                return None
            fcntl.flock(descriptor, fcntl.LOCK_SH)
            try:
                same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(descriptor).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # evicted (or replaced) while this process waited for the lock
                os.close(descriptor)
                continue
            with contextlib.suppress(OSError):
                os.utime(path)  # the LRU clock
            return Lease(descriptor, path)

    def fetch(self, key: str, name: str, *, size: int, download: Callable[[Callable[[bytes], None], Callable[[], None]], None],
              check: Callable[[str, Path], str | None], optional: bool = False) -> Lease | None:
        """A lease on ``key/name``, downloaded first if absent: ``download(write, restart)`` writes
        the bytes (calling ``restart()`` before it writes them again after a failed attempt), ``check(blake2b hex digest, file)`` says what is wrong with them (or None); a file
        that fails is fetched once more, then :class:`CorruptDataError`. With ``optional`` (a
        prefetch) nothing is evicted that is in use and None is returned when there is no room."""
        lease = self.lease(key, name)
        if lease is not None:
            self.stats.hits += 1
            return lease
        with writing_to(self.directory, f"fetching {name!r} ({size:,} bytes)"), \
                self._locked(self.directory / LOCKS / f"{_entry_id(key, name)}.lock"):
            lease = self.lease(key, name)  # another process fetched it while this one waited
            if lease is not None:
                self.stats.hits += 1
                return lease
            temporary = self._reserve(key, name, size, optional)
            if temporary is None:
                return None
            return self._download(key, name, temporary, download, check)

    def _download(self, key: str, name: str, temporary: tuple[int, Path], download: Callable[..., None],
                  check: Callable[[str, Path], str | None]) -> Lease:
        descriptor, tmp = temporary
        try:
            digest = [hashlib.blake2b(digest_size=32)]

            def restart() -> None:  # each attempt (a retried download, too) starts from an empty file
                os.ftruncate(descriptor, 0)
                os.lseek(descriptor, 0, os.SEEK_SET)
                digest[0] = hashlib.blake2b(digest_size=32)

            def write(block: bytes) -> None:
                digest[0].update(block)
                view = memoryview(block)
                while view:
                    view = view[os.write(descriptor, view):]

            for attempt in (1, 2):
                started = time.perf_counter()
                restart()
                download(write, restart)
                self.stats.download_seconds += time.perf_counter() - started
                self.stats.downloads += 1
                self.stats.bytes_downloaded += os.fstat(descriptor).st_size
                problem = check(digest[0].hexdigest(), tmp)
                if problem is None:
                    break
                if attempt == 1:
                    logger.warning("%s; fetching it again", problem)
                    self.stats.refetched.append(name)
                    continue
                raise CorruptDataError(f"{problem} (the same after fetching it again). The file on the server "
                                       "differs from the dataset's manifest: convert the source again, or restore it.")
            target = self.path(key, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            with self._locked(self.directory / GLOBAL_LOCK):  # counted once by _usage: in .tmp or in place
                os.rename(tmp, target)  # the shared lock taken in _reserve is the lease: held across the rename
            with contextlib.suppress(OSError):
                os.chmod(target, 0o644)
            return Lease(descriptor, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            os.close(descriptor)
            raise

    # --- room ----------------------------------------------------------------------------

    def _reserve(self, key: str, name: str, size: int, optional: bool) -> tuple[int, Path] | None:
        """Make room for ``size`` bytes and create the temporary file that holds the place
        (locked, its final size in its name), or None for an ``optional`` fetch
        that has no room."""
        deadline = time.monotonic() + _WAIT_FOR_ROOM_S
        while True:
            with self._locked(self.directory / GLOBAL_LOCK):
                used, entries = self._usage()
                used, kept = self._evict(entries, used, size)
                # what is left is in use: wait (a needed file) for another process to finish with
                # some of it, unless all of it is this process's own
                hopeless = all(str(path) in _HELD for path in kept) and not self._others_downloading
                if used + size <= self.limit or used == 0 or (not optional and (hopeless or time.monotonic() > deadline)):
                    if used + size > self.limit:
                        logger.warning("cache %s: %s needs %d bytes but only %d of cache_limit %d are free (the "
                                       "rest is in use); going over the limit", self.directory, name, size,
                                       max(self.limit - used, 0), self.limit)
                    tmp = self.directory / TMP / f"{_entry_id(key, name)}.{os.getpid()}.{secrets.token_hex(4)}.{size}.part"
                    descriptor = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                    # shared, so a checker may open it (HDF5 takes its own shared lock); any lock
                    # tells the scan in _usage that its writer is alive
                    fcntl.flock(descriptor, fcntl.LOCK_SH)
                    return descriptor, tmp
            if optional:
                return None
            time.sleep(0.05)

    def _usage(self) -> tuple[int, list[tuple[float, int, Path]]]:
        """Bytes held (cached files, and downloads in progress at their final size) and the
        cached files as ``(mtime, size, path)``; removes a dead process's temporary files."""
        used, entries = 0, []
        self._others_downloading = False
        for tmp in (self.directory / TMP).iterdir():
            if not PART_NAME.fullmatch(tmp.name):
                continue  # not a download of the cache's: never counted, never removed
            try:
                descriptor = os.open(tmp, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                parts = tmp.name.split(".")
                used += int(parts[-2]) if len(parts) >= 5 and parts[-2].isdigit() else os.fstat(descriptor).st_size
                self._others_downloading |= len(parts) >= 5 and parts[1] != str(os.getpid())
            else:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()  # its writer died: nothing holds it
            finally:
                os.close(descriptor)
        for directory in self.directory.iterdir():
            if is_entry(directory.name) and not directory.is_symlink() and directory.is_dir():
                for stat, path in _files_under(directory):
                    used += stat.st_size
                    entries.append((stat.st_mtime, stat.st_size, path))
        return used, sorted(entries, key=lambda item: item[0])

    def _evict(self, entries: list[tuple[float, int, Path]], used: int, size: int) -> tuple[int, list[Path]]:
        """Remove least recently used files not in use until ``size`` more bytes fit; the bytes
        used then, and the files that were in use."""
        kept: list[Path] = []
        for _, bytes_, path in entries:
            if used + size <= self.limit:
                break
            try:
                descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except OSError:
                continue
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.stat(path, follow_symlinks=False).st_ino == os.fstat(descriptor).st_ino:
                    path.unlink()
                    used -= bytes_
                    self.stats.evictions += 1
                    logger.debug("cache %s: evicted %s", self.directory, path.name)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.ENOENT):
                    raise
                if exc.errno != errno.ENOENT:
                    kept.append(path)
            finally:
                os.close(descriptor)
        return used, kept

    def discard(self, key: str, names: list[str]) -> None:
        """Remove the cached files ``names`` of ``key`` that are not in use."""
        with self._locked(self.directory / GLOBAL_LOCK):
            entries = [(0.0, 0, self.path(key, name)) for name in names if self.path(key, name).exists()]
            self._evict(entries, self.limit + 1, 0)  # "over the limit" until every entry is tried

    def usage(self) -> int:
        """Bytes the cache holds now (downloads in progress at their final size)."""
        with self._locked(self.directory / GLOBAL_LOCK):
            return self._usage()[0]

    @staticmethod
    @contextlib.contextmanager
    def _locked(path: Path) -> Iterator[None]:
        with _LOCKING:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            _LOCK_DESCRIPTORS.add(descriptor)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            with _LOCKING:
                _LOCK_DESCRIPTORS.discard(descriptor)
                os.close(descriptor)


def _files_under(directory: Path) -> Iterator[tuple[os.stat_result, Path]]:
    """Every file in a dataset's folder of the cache and its sub-folders (``fields/x.bin``),
    without following links."""
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            yield from _files_under(Path(entry.path))
        elif entry.is_file(follow_symlinks=False):
            yield entry.stat(follow_symlinks=False), Path(entry.path)


# The descriptors of the exclusive locks this process's threads hold (or wait for) now. A flock
# belongs to the open file, which a forked child shares: a DataLoader worker forked while another
# thread holds one would keep it held as long as it lives, and wait for it forever at its own
# next lock. So the child closes its copies at the fork (the parent's thread still releases the
# lock when it closes its own); _LOCKING keeps a fork from falling between open and record, or
# between forget and close.
_LOCKING = threading.Lock()
_LOCK_DESCRIPTORS: set[int] = set()


def _close_inherited_locks() -> None:
    for descriptor in _LOCK_DESCRIPTORS:
        os.close(descriptor)
    _LOCK_DESCRIPTORS.clear()
    _LOCKING.release()  # taken before the fork, by the thread that is the child's only one


os.register_at_fork(before=_LOCKING.acquire, after_in_parent=_LOCKING.release, after_in_child=_close_inherited_locks)
