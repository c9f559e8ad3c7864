"""The cache's folder: its own, and nothing else's.

The cache deletes files to stay within ``cache_limit``, so it works only in a folder of its own
(:func:`claim_directory`): one it made or found empty, which it marks with a ``.fastdata-cache``
file, or one an earlier fastdata's cache made (recognised by that layout: ``.tmp/`` and
``.locks/`` holding only the cache's own files, dataset folders, ``.uploads/``), marked then. A
folder holding anything else is refused, naming what it holds, and nothing in it is touched.
A write into the folder that fails for want of room or rights is one line naming the folder,
the cause and the fix (:func:`writing_to`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path
from typing import Iterator

from fastdata.errors import CacheWriteError, FastdataError, InvalidOptionError

TMP, LOCKS, GLOBAL_LOCK, UPLOADS = ".tmp", ".locks", ".lock", ".uploads"
MARKER = ".fastdata-cache"
_MARKER_TEXT = (b"This folder is fastdata's cache of remote files (docs/remote.md). fastdata evicts the files "
                b"in it to stay within cache_limit: keep nothing else here.\n")
# what the cache makes in its folder: a dataset's folder (a readable name, then 16 hex digits:
# fastdata.remote.dataset's keys), a download in progress, an entry's lock file
_ENTRY = re.compile(r"[^./\\][^/\\]{0,59}-[0-9a-f]{16}")
PART_NAME = re.compile(r"[0-9a-f]{24}\.\d+\.[0-9a-f]{8}\.\d+\.part")
_LOCK_NAME = re.compile(r"[0-9a-f]{24}\.lock")
# a write that failed for want of room or rights: what it means for the cache's folder
_WRITE_CAUSES = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


def is_entry(name: str) -> bool:
    """Whether ``name`` is one the cache gives a dataset's folder (``<name>-<16 hex digits>``)."""
    return bool(_ENTRY.fullmatch(name))


def claim_directory(directory: str | os.PathLike) -> Path:
    """``directory`` as the cache's own folder, made (and marked) if need be; a folder that holds
    anything the cache did not make is refused (:class:`InvalidOptionError` naming it), never
    touched. A folder without the marker is taken (and marked) when it is empty, or when it holds
    only what an earlier fastdata's cache made there (its ``.tmp`` and ``.locks`` folders with
    their own files, dataset folders, ``.uploads``)."""
    directory = Path(directory).expanduser()
    with writing_to(directory, "preparing it"):
        if (directory.exists() or directory.is_symlink()) and not directory.is_dir():
            raise InvalidOptionError(f"cache_dir {str(directory)!r} is not a folder. Set FASTDATA_CACHE_DIR (or "
                                     "cache_dir=) to a folder of the cache's own, e.g. '~/.cache/fastdata'.")
        directory.mkdir(parents=True, exist_ok=True)
        names = sorted(os.listdir(directory))
        foreign = [name for name in names if not _is_own(directory, name)]
        if foreign:
            _refuse(directory, foreign)
        if MARKER not in names:
            _mark(directory)
        for sub in (TMP, LOCKS):
            (directory / sub).mkdir(exist_ok=True)
    return directory


def _is_own(directory: Path, name: str) -> bool:
    """Whether the top-level entry ``name`` of the cache's folder is one the cache makes."""
    path = directory / name
    if path.is_symlink():
        return False
    if name in (MARKER, GLOBAL_LOCK):
        return path.is_file()
    if name in (TMP, LOCKS):  # holding only the cache's own files (a user's '.tmp' is not)
        pattern = PART_NAME if name == TMP else _LOCK_NAME
        return path.is_dir() and all(pattern.fullmatch(inner) for inner in os.listdir(path))
    return path.is_dir() and (name == UPLOADS or is_entry(name))


def _mark(directory: Path) -> None:
    with contextlib.suppress(FileExistsError):  # another process marked it first
        descriptor = os.open(directory / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(descriptor, _MARKER_TEXT)
        finally:
            os.close(descriptor)


def _refuse(directory: Path, names: list[str]) -> None:
    shown = ", ".join(repr(name) for name in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise InvalidOptionError(
        f"cache_dir {str(directory)!r} holds {shown}, which the fastdata cache did not make. The cache deletes "
        f"files in its folder to stay within cache_limit, so it uses only a folder of its own (new or empty; it "
        f"marks it with a {MARKER!r} file). Set FASTDATA_CACHE_DIR (or cache_dir=) to a new folder, e.g. "
        "'~/.cache/fastdata', or move those out.")


def write_error(directory: Path, code: int | None, doing: str) -> CacheWriteError | None:
    """The one-line error for a write into the cache's folder that failed with ``errno`` ``code``
    for want of room or rights (None for any other failure): the folder, the cause and the fix."""
    cause = _WRITE_CAUSES.get(code)
    if cause is None:
        return None
    fix = ("free space on that disk, or set FASTDATA_CACHE_DIR (cache_dir=) to a folder on a disk with room"
           if code in (errno.ENOSPC, errno.EDQUOT) else
           "set FASTDATA_CACHE_DIR (cache_dir=) to a folder you can write to")
    error = CacheWriteError(f"Cannot write to the cache folder {str(directory)!r} while {doing}: {cause}. To fix: "
                            f"{fix}; then run the same command again.")
    error.errno = code
    return error


@contextlib.contextmanager
def writing_to(directory: Path, doing: str) -> Iterator[None]:
    """Around writes into the cache's folder: a full disk (or a read-only one) is one clear error."""
    try:
        yield
    except OSError as exc:
        error = None if isinstance(exc, FastdataError) else write_error(directory, exc.errno, doing)
        if error is None:
            raise
        raise error from None
