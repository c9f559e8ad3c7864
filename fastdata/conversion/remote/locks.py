"""Locks in the bucket: one writer of a URL at a time, across machines that share only the bucket.

A conversion or merge writing ``s3://bucket/out.tar`` holds the object ``out.tar.partial.lock``
(beside the output, like a local output's ``OUTPUT.partial.lock``); a part of a job array holds
``out.tar.partial.units/part-IIII-of-NNNN.lock``. Each is a small JSON naming its holder
(operation, host, pid, start time, a random token) created with an exclusive write (fsspec's
``mode="create"``: S3's ``If-None-Match: *``, GCS's ``ifGenerationMatch=0``, Azure's
``overwrite=False``), so of two writers racing for it exactly one gets it. The holder rewrites it
every :data:`REFRESH_S` seconds while it works, and deletes it when done.

A whole conversion or a merge takes the output's lock and then looks for live part locks; a part
takes its own lock and then looks at the output's: whichever of two comes second sees the
first's lock (S3's reads after writes are consistent), so a part never joins a merge.

A lock is **stale**, and taken over with a warning, when its holder ran on this machine and its
process is gone, or when it was not rewritten for ``$FASTDATA_LOCK_STALE_S`` seconds (default
600: a killed holder elsewhere). On S3 the takeover is itself conditional (``If-Match`` on the
stale lock's ETag), so of two processes taking over one stale lock one wins. A store that
refuses conditional writes (answers 501) gets a warning and no lock; one that ignores them
cannot be detected (docs/remote.md).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import logging
import os
import secrets
import socket
import threading
from typing import Any, Callable, Iterator

from fastdata.conversion.locks import holder_record, os_error
from fastdata.errors import OutputLockedError, RemoteNotFoundError
from fastdata.remote.dataset import RemoteOptions
from fastdata.remote.filesystem import filesystem, naming_the_bucket, scrub, with_retry
from fastdata.remote.schemes import scheme_of_url
from fastdata.conversion.remote.units import units_url

logger = logging.getLogger(__name__)
LOCK_SUFFIX = ".partial.lock"
PART_LOCK = "part-{:04d}-of-{:04d}.lock"
REFRESH_S = 30.0
STALE_S = 600.0
_WRITTEN, _REFUSED, _UNSUPPORTED = "written", "refused", "unsupported"


def stale_after_s() -> float:
    """``$FASTDATA_LOCK_STALE_S``, else :data:`STALE_S`."""
    text = os.environ.get("FASTDATA_LOCK_STALE_S")
    return float(text) if text else STALE_S


class BucketLock:
    """The lock object at ``lock_url``, held by this process for ``operation`` (``"merge"``,
    ``"convert"``, ``"part 3/8"``) on ``output`` (the URL named in errors)."""

    def __init__(self, lock_url: str, operation: str, output: str, options: RemoteOptions):
        self.url, self.operation, self.output, self.options = lock_url, operation, output, options
        self.fs, self.path = filesystem(lock_url, options.storage_options)
        scheme = scheme_of_url(lock_url)
        self.conditional = scheme is not None and scheme.conditional_writes  # If-Match honoured: atomic take-over
        self.token = secrets.token_hex(8)
        self.etag: str | None = None
        self.held, self.lost = False, False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _call(self, function: Callable[[], Any]) -> Any:
        """``function()`` with retries; an error names the output the user gave (a missing bucket
        is first met here), not the lock object."""
        return with_retry(function, self.output, self.options.retry, self.options.storage_options)

    def _body(self) -> bytes:
        return json.dumps({**holder_record(), "operation": self.operation, "token": self.token}).encode()

    # --- taking it ---------------------------------------------------------------------------

    def try_acquire(self) -> dict[str, Any] | None:
        """Take the lock (a stale one taken over); None when taken (or when the store refuses
        conditional writes: no lock, with a warning), else the live holder's record."""
        for _ in range(5):  # the lock may vanish or change between the calls below
            outcome = self._put(mode="create")
            if outcome == _WRITTEN:
                return self._start()
            if outcome == _UNSUPPORTED:
                logger.warning("%s: this store refuses conditional writes; fastdata takes no lock there, so "
                               "concurrent writers of %s are not detected", scrub(self.url), scrub(self.output))
                return None
            found = self.holder()
            if found is None:
                continue  # released meanwhile: try again
            holder, etag = found
            if holder.get("token") == self.token:  # written by an attempt whose answer was lost
                self.etag = etag
                return self._start()
            if not is_stale(holder):
                return holder
            logger.warning("%s: taking over a stale lock (%s)", scrub(self.url), describe(holder))
            if self._take_over(etag):
                return self._start()
        found = self.holder()
        return found[0] if found else {}

    def _put(self, **condition: Any) -> str:
        """Write the lock (``condition``: ``mode="create"``, or S3's ``IfMatch=etag``): _WRITTEN,
        _REFUSED (the condition failed) or _UNSUPPORTED (the store answers 501 to it)."""
        def put() -> Any:
            try:
                return self.fs.pipe_file(self.path, self._body(), **condition)
            except FileExistsError:
                return _REFUSED
            except OSError as exc:
                if _precondition_failed(exc):
                    return _REFUSED
                if exc.errno == errno.ENOSYS or "NotImplemented" in str(exc):
                    return _UNSUPPORTED
                raise

        response = self._call(put)
        if isinstance(response, str):
            return response
        self.etag = response.get("ETag") if isinstance(response, dict) else None
        return _WRITTEN

    def _take_over(self, etag: str | None) -> bool:
        """Replace the stale lock whose ETag is ``etag`` (S3: only if it is still that one)."""
        if self.conditional and etag:
            return self._put(IfMatch=etag) == _WRITTEN
        try:
            self._call(lambda: self.fs.rm_file(self.path))
        except RemoteNotFoundError:
            pass
        return self._put(mode="create") == _WRITTEN

    def _start(self) -> None:
        self.held = True
        self._thread = threading.Thread(target=self._refresh, daemon=True, name="fastdata-bucket-lock")
        self._thread.start()

    def holder(self) -> tuple[dict[str, Any], str | None] | None:
        """The lock's holder record (with ``age_s``, seconds since it was last written) and its
        ETag; None when there is no lock."""
        self.fs.invalidate_cache(self.path)  # a listing cached by this filesystem may be older
        try:
            info = self._call(lambda: self.fs.info(self.path))
            text = self._call(lambda: self.fs.cat_file(self.path))
        except RemoteNotFoundError:
            return None
        try:
            record = json.loads(text)
        except ValueError:
            record = {}
        if not isinstance(record, dict):
            record = {}
        modified = info.get("LastModified") or info.get("last_modified") or info.get("mtime")
        if isinstance(modified, dt.datetime):
            now = dt.datetime.now(modified.tzinfo or dt.timezone.utc)
            record["age_s"] = max((now - modified).total_seconds(), 0.0)
        return record, info.get("ETag") or info.get("etag")

    # --- holding it ------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Rewrite the lock every REFRESH_S seconds (S3: only while it is still ours)."""
        while not self._stop.wait(REFRESH_S):
            condition = {"IfMatch": self.etag} if self.conditional and self.etag else {}
            try:
                if self._put(**condition) == _REFUSED:
                    self.lost = True  # taken over as stale: check() says so before anything is committed
                    return
            except Exception as exc:  # noqa: BLE001 - the next refresh tries again
                logger.warning("%s: could not refresh the lock: %s", scrub(self.url), exc)

    def check(self) -> None:
        """Raise when the lock was taken over while this process held it (it was not refreshed
        for ``$FASTDATA_LOCK_STALE_S``); called before anything is committed."""
        if not self.held:
            return
        found = self.holder()
        if self.lost or found is None or found[0].get("token") != self.token:
            raise os_error(OutputLockedError, errno.EAGAIN, (
                f"{scrub(self.output)!r}: this {self.operation}'s lock {scrub(self.url)!r} was taken over by another "
                f"process ({describe(found[0]) if found else 'now gone'}) while it ran, so nothing was committed. "
                "Make sure one process writes this output at a time, then run again."))

    def release(self) -> None:
        """Stop refreshing and delete the lock, if it is still this process's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if not self.held:
            return
        self.held = False
        found = self.holder()
        if found is not None and found[0].get("token") == self.token:
            try:
                self._call(lambda: self.fs.rm_file(self.path))
            except RemoteNotFoundError:
                pass


def is_stale(record: dict[str, Any]) -> bool:
    """A lock whose process ran on this machine and is gone, or not rewritten for the stale time."""
    if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
        try:
            os.kill(record["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # another user's process: alive
    age = record.get("age_s")
    return age is not None and age >= stale_after_s()


def describe(record: dict[str, Any]) -> str:
    """The holder, in words: its operation, process, host, start and when it was last seen."""
    seen = f", last refreshed {record['age_s']:.0f} s ago" if record.get("age_s") is not None else ""
    return (f"{record.get('operation', 'a conversion')}: process {record.get('pid')} on {record.get('host')}, "
            f"started {record.get('started')}{seen}")


def busy_error(output: str, operation: str, lock_url: str, holder: dict[str, Any], why: str) -> OutputLockedError:
    """The refusal of ``operation`` on ``output`` while ``holder`` holds ``lock_url``."""
    return os_error(OutputLockedError, errno.EAGAIN, (
        f"Cannot {operation} {scrub(output)!r}: {why} ({describe(holder)}; lock {scrub(lock_url)!r}). Wait for it "
        f"to finish. If that process is gone, run again: its lock is taken over at once on its own machine, and "
        f"elsewhere once it is {stale_after_s():.0f} s old ($FASTDATA_LOCK_STALE_S); or delete the lock object."))


def _precondition_failed(exc: OSError) -> bool:
    cause = exc.__cause__
    response = getattr(cause, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or "412" in str(exc)


@contextlib.contextmanager
def writing(url: str, operation: str, options: RemoteOptions) -> Iterator[BucketLock]:
    """The output lock of ``url`` for a whole conversion or a merge (``operation``), refused while
    another process holds it or a part of a job array converting into ``url`` runs."""
    url = url.rstrip("/")
    lock = BucketLock(url + LOCK_SUFFIX, operation, url, options)
    with naming_the_bucket(url, options.storage_options):
        holder = lock.try_acquire()
    if holder is not None:
        raise busy_error(url, operation, lock.url, holder, "another process is writing it")
    try:
        for part_url, record in live_parts(url, options):
            raise busy_error(url, operation, part_url, record, "a part of a job array is converting into it")
        yield lock
    finally:
        lock.release()


@contextlib.contextmanager
def part_writing(url: str, part: int, parts: int, options: RemoteOptions) -> Iterator[BucketLock]:
    """The lock of part ``part``/``parts`` of a job array converting into ``url``, refused while
    another process converts that part or a merge (or a whole conversion) writes ``url``."""
    url = url.rstrip("/")
    operation = f"convert part {part}/{parts} of"
    lock = BucketLock(f"{units_url(url)}/{PART_LOCK.format(part, parts)}", f"part {part}/{parts}", url, options)
    with naming_the_bucket(url, options.storage_options):
        holder = lock.try_acquire()
    if holder is not None:
        raise busy_error(url, operation, lock.url, holder, f"another process is converting part {part}/{parts}")
    try:
        output = BucketLock(url + LOCK_SUFFIX, "", url, options)
        found = output.holder()
        if found is not None and not is_stale(found[0]):
            raise busy_error(url, operation, output.url, found[0], "a merge or a whole conversion is writing it")
        yield lock
    finally:
        lock.release()


def live_parts(url: str, options: RemoteOptions) -> list[tuple[str, dict[str, Any]]]:
    """The part locks under ``url``'s shared units that are held (not stale): (lock URL, holder)."""
    fs, path = filesystem(units_url(url), options.storage_options)
    path = path.rstrip("/")
    fs.invalidate_cache(path)
    try:
        found = with_retry(lambda: fs.find(path, maxdepth=1, withdirs=False), units_url(url), options.retry,
                           options.storage_options)
    except RemoteNotFoundError:
        return []
    held = []
    for name in sorted(found):
        leaf = name.rsplit("/", 1)[-1]
        if not (leaf.startswith("part-") and leaf.endswith(".lock")):
            continue
        lock_url = f"{units_url(url)}/{leaf}"
        record = BucketLock(lock_url, "", url, options).holder()
        if record is not None and not is_stale(record[0]):
            held.append((lock_url, record[0]))
    return held
