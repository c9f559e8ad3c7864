"""The one-writer-per-output lock, ``OUTPUT.partial.lock``: an ``flock`` that the kernel releases
when its holder dies, naming the holding process for whoever is refused.

A whole conversion, the Ray driver and ``fastdata merge`` hold it exclusively; the parts of a job
array share it (:class:`fastdata.conversion.scale.staging.PartLock`). Without ``flock`` (Windows) an
exclusively created file stands in, taken over when its process is gone.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from fastdata.errors import OutputExistsError, OutputLockedError

LOCK_SUFFIX = ".partial.lock"
_LOCK_MARK = "fastdata conversion lock"

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows: an exclusive lock file instead
    fcntl = None


def os_error(cls: type, code: int, message: str) -> OSError:
    """``cls(message)`` carrying ``errno`` (``OSError(code, message)`` would prefix "[Errno N]")."""
    error = cls(message)
    error.errno = code
    return error


class ConversionLock:
    """An exclusive lock on ``OUTPUT.partial.lock`` for the whole conversion.

    A second conversion of the same output is refused at once, naming the process that holds
    the lock. The lock is an ``flock``: when its holder dies (even by SIGKILL) the kernel
    releases it and the next conversion takes it over. The file is removed on release.
    """

    def __init__(self, output: Path):
        self.output = output
        self.path = output.with_name(output.name + LOCK_SUFFIX)
        self.descriptor: int | None = None

    def __enter__(self) -> "ConversionLock":
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def acquire(self) -> None:
        for _ in range(20):
            if self._try_once():
                return
        raise os_error(  # pragma: no cover - the lock file kept changing under us
            OutputLockedError, errno.EAGAIN, f"Cannot lock {str(self.path)!r}: it keeps being replaced. Is another program using it?"
        )

    shared = False  # an exclusive flock; parts of a job array share theirs (fastdata.conversion.scale.staging.PartLock)

    def _busy(self, holder: str) -> str:
        """Why the lock is refused while ``holder`` has it."""
        return (f"Another conversion is writing {str(self.output)!r} ({holder}). Wait for it to finish, or stop it; "
                "two conversions of one output would corrupt it.")

    def _describe_self(self, descriptor: int, text: bytes) -> None:
        """Say in the lock file who holds it (``text``: what it said before)."""
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, json.dumps(holder_record()).encode(), 0)

    def _try_once(self) -> bool:
        if fcntl is None:  # pragma: no cover
            return self._try_exclusive_create()
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(descriptor)
            os.close(descriptor)
            raise os_error(OutputLockedError, errno.EAGAIN, self._busy(holder)) from None
        try:
            same = os.path.samestat(os.fstat(descriptor), os.stat(self.path))
        except FileNotFoundError:
            same = False
        if not same:  # the previous holder removed the file as we opened it: lock the new one
            os.close(descriptor)
            return False
        text = os.pread(descriptor, 4096, 0)
        if text and _LOCK_MARK.encode() not in text:
            os.close(descriptor)
            raise OutputExistsError(
                f"{str(self.path)!r} exists and was not written by fastdata; it is not replaced. "
                "Move it away, or choose another output path."
            )
        self._describe_self(descriptor, text)
        self.descriptor = descriptor
        return True

    def _try_exclusive_create(self) -> bool:  # pragma: no cover - platforms without flock
        try:
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            record = _parse_holder(self.path.read_bytes())
            if record and not _alive(record):
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                return False
            raise os_error(
                OutputLockedError, errno.EAGAIN, f"Another conversion is writing {str(self.output)!r} ({_describe(record)})."
            ) from None
        os.write(descriptor, json.dumps(holder_record()).encode())
        self.descriptor = descriptor
        return True

    def release(self) -> None:
        if self.descriptor is None:
            return
        try:
            if os.path.samestat(os.fstat(self.descriptor), os.stat(self.path)):
                self.path.unlink()
        except FileNotFoundError:
            pass
        finally:
            os.close(self.descriptor)  # releases the flock
            self.descriptor = None


def holder_record() -> dict[str, Any]:
    """What a lock file says about its holder (this process): shown to whoever finds the lock taken."""
    return {"lock": _LOCK_MARK, "pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv)[:300]}


def _parse_holder(text: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("lock") == _LOCK_MARK else None


def _read_holder(descriptor: int) -> str:
    return _describe(_parse_holder(os.pread(descriptor, 4096, 0)))


def _describe(record: dict[str, Any] | None) -> str:
    if not record:
        return "process unknown"
    return f"process {record.get('pid')} on {record.get('host')}, started {record.get('started')}"


def _alive(record: dict[str, Any]) -> bool:  # pragma: no cover - platforms without flock
    if record.get("host") != socket.gethostname():
        return True  # cannot tell: assume it is
    import psutil

    return psutil.pid_exists(int(record.get("pid", -1)))


# --- the partial output ---------------------------------------------------------------------
