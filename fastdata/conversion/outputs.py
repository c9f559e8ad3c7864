"""Where a conversion writes, and the rules that keep it from touching anything else.

* ``OUTPUT`` is written under ``OUTPUT.partial`` and renamed into place only when complete.
  ``OUTPUT.partial.json`` (the journal) records that fastdata made that partial output, and
  ``OUTPUT.partial.lock`` lets one conversion at a time write it (an ``flock``, released by
  the kernel when its process dies, so a stale lock is simply taken over; :mod:`fastdata.conversion.locks`).
* An OUTPUT equal to a source, inside it or containing it is refused before anything happens,
  with or without ``--overwrite``.
* ``--overwrite`` replaces only a dataset fastdata wrote: a manifest it can read, and no file
  that manifest does not list. The old dataset is moved aside under a unique name and removed
  only after the new one is in place.
* A partial output without a journal of ours is refused, never removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from fastdata.conversion import journal
from fastdata.files import remove_path, sync_folder, unique_sibling
from fastdata.errors import (ConversionInterrupted, FastdataError, InvalidOptionError, OutputExistsError, OutputWriteError,
                             fix_option)
from fastdata.conversion.locks import os_error
from fastdata.formats import find_manifest
from fastdata.manifest import MANIFEST_NAME
from fastdata.sources.base import Protected

PARTIAL_SUFFIX = ".partial"
_OLD_INFIX = ".fastdata-old-"
# room for the longest name fastdata puts next to OUTPUT (e.g. OUTPUT.partial.json.1a2b3c4d.tmp)
_LONGEST_SUFFIX = 32


def partial_path(output: Path) -> Path:
    return output.with_name(output.name + PARTIAL_SUFFIX)


@dataclass
class Target:
    """Where and how one conversion writes: the output, its format, the conversion key, the
    source's fingerprint, the progress callback and, for a conversion to a URL, the sink that
    uploads each finished file of a streaming writer (``fastdata.formats.base.FileSink``)."""

    output: Path
    spec: Any  # a fastdata.formats.FormatSpec
    key: str
    fingerprint: dict[str, Any]
    progress: Callable[[int, int], None] | None = None
    sink: Any = None

    @property
    def partial(self) -> Path:
        return partial_path(self.output)

    def report(self, count: int, total: int) -> None:
        if self.progress is not None and count:
            self.progress(count, total)


# --- the output path ----------------------------------------------------------------------


def check_output_path(output: Path) -> None:
    """Refuse an output path that cannot be a new dataset, before anything is written."""
    shown = str(output)
    if output.name in ("", ".", ".."):
        raise InvalidOptionError(
            f"Invalid output {shown!r}: give the path of the dataset to create, e.g. 'out/data.npy'."
        )
    if output.is_symlink():
        target = os.readlink(output)
        raise OutputExistsError(
            f"Output {shown!r} is a symbolic link (to {target!r}); fastdata does not write through or "
            "replace links. Give the real path, or another output path."
        )
    ancestor = output.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        if ancestor.is_symlink():  # a dangling link among the parents
            raise InvalidOptionError(
                f"Cannot create output {shown!r}: {str(ancestor)!r} is a broken symbolic link. "
                "Fix the link or choose another output path."
            )
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InvalidOptionError(
            f"Cannot create output {shown!r}: {str(ancestor)!r} is a file, not a folder. "
            "Choose an output path in a folder."
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise os_error(
            OutputWriteError, errno.EACCES, f"Cannot create output {shown!r}: no permission to write in folder "
            f"{str(ancestor)!r}. Choose a folder you can write to."
        )
    limit = _name_max(ancestor)
    if len(os.fsencode(output.name)) + _LONGEST_SUFFIX > limit:
        raise InvalidOptionError(
            f"Output name {output.name[:40]!r}... is {len(os.fsencode(output.name))} bytes long; this "
            f"file system allows {limit}, and fastdata adds up to {_LONGEST_SUFFIX} for its temporary "
            f"names. Use a name of at most {limit - _LONGEST_SUFFIX} bytes."
        )


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def check_not_source(output: Path, protected: list[Protected]) -> None:
    """Refuse an OUTPUT that is a source, lies inside one, or contains one."""
    out = output.resolve()
    for item in protected:
        source = item.path.resolve()
        shown = (str(output), str(item.path))
        if out == source:
            raise InvalidOptionError(
                f"Output {shown[0]!r} is the {item.what} itself; fastdata never writes over what it reads. "
                "Choose an output path outside it."
            )
        if source in out.parents and not item.inside_ok:
            raise InvalidOptionError(
                f"Output {shown[0]!r} is inside the {item.what} {shown[1]!r}; it would be read as part of "
                "the source next time. Choose an output path outside it."
            )
        if out in source.parents:
            raise InvalidOptionError(
                f"Output {shown[0]!r} contains the {item.what} {shown[1]!r}; replacing it would delete the "
                "source. Choose an output path outside it."
            )


def unlisted_files(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """Entries of a dataset directory that its manifest does not list (someone else's files)."""
    listed = set(manifest.get("files") or {}) | {MANIFEST_NAME}
    found = []
    for entry in sorted(directory.rglob("*")):
        relative = entry.relative_to(directory).as_posix()
        if entry.is_dir() and not entry.is_symlink():
            if not any(name.startswith(relative + "/") for name in listed):
                found.append(relative + "/")
        elif relative not in listed:
            found.append(relative)
    return found


def replaceable_manifest(output: Path) -> dict[str, Any]:
    """The manifest of the fastdata dataset at ``output``, which ``--overwrite`` may replace;
    anything else is refused with a message that suggests no destructive flag."""
    shown = str(output)
    try:
        manifest = find_manifest(output, checked=False)  # one another fastdata wrote may be replaced
    except FastdataError as exc:
        raise OutputExistsError(
            f"Output {shown!r} already exists and fastdata cannot read its manifest ({exc}); fastdata "
            "replaces only datasets it can identify. Move it away yourself, or choose another output path."
        ) from exc
    if manifest is None:
        raise OutputExistsError(
            f"Output {shown!r} already exists and is not a fastdata dataset; fastdata never replaces it. "
            "Choose another output path (or move it away yourself)."
        )
    if output.is_dir():
        extra = unlisted_files(output, manifest)
        if extra:
            names = ", ".join(repr(name) for name in extra[:3]) + (f" and {len(extra) - 3} more" if len(extra) > 3 else "")
            raise OutputExistsError(
                f"Output {shown!r} is a fastdata dataset but also holds {names}, which its manifest does not "
                "list; fastdata replaces only what it wrote. Move those out, or choose another output path."
            )
    return manifest


def check_existing(output: Path, *, overwrite: bool, resume: bool) -> dict[str, Any] | None:
    """None when OUTPUT does not exist; the manifest of a fastdata dataset that ``--overwrite``
    may replace (or ``--resume`` may keep); otherwise a refusal."""
    if not (output.exists() or output.is_symlink()):
        return None
    if not (overwrite or resume):
        replaceable_manifest(output)  # says so when it is not a fastdata dataset
        raise OutputExistsError(f"Output {str(output)!r} already exists. Pass {fix_option('overwrite')} to replace it.")
    return replaceable_manifest(output)


# --- one writer per output ------------------------------------------------------------------


def publish(partial: Path, output: Path, *, replace: bool) -> None:
    """Rename the complete partial output into place.

    With ``replace``, an existing fastdata dataset at OUTPUT is moved aside under a unique name,
    and removed only once the new one is in place (on failure it is moved back). An output that
    appeared during the conversion and that fastdata may not replace is left alone.
    """
    if output.exists() or output.is_symlink():
        if not replace:
            remove_path(partial)
            raise OutputExistsError(f"Output {str(output)!r} appeared during conversion; not replaced.")
        replaceable_manifest(output)  # it may have changed since the conversion began
        old = unique_sibling(output, _OLD_INFIX)
        os.rename(output, old)
        try:
            os.rename(partial, output)
        except BaseException:
            os.rename(old, output)
            raise
        sync_folder(output.parent)
        remove_path(old)
    else:
        os.rename(partial, output)
    sync_folder(output.parent)


# --- write errors ---------------------------------------------------------------------------

_CAUSES = {
    errno.ENOSPC: "no space left on the device. Free disk space and convert again",
    errno.EDQUOT: "disk quota exceeded. Free space within your quota and convert again",
    errno.EFBIG: "file too large for the file-size limit ('ulimit -f') or the file system. Raise the limit, "
                 f"or use {fix_option('format', 'tar')}, which splits the output into shards",
    errno.EACCES: "permission denied. Check that you can write to that folder",
    errno.EPERM: "operation not permitted. Check that you can write to that folder",
    errno.EROFS: "the file system is read-only. Choose an output path on a writable disk",
    errno.ENOENT: "a folder disappeared during the conversion (was it moved or deleted?). Convert again",
    errno.EEXIST: "a path that fastdata creates already exists. Move it away and convert again",
    errno.ENAMETOOLONG: "a file name is too long for this file system. Use a shorter output name",
    errno.ENOTDIR: "a part of the output path is a file, not a folder. Choose another output path",
    errno.EIO: "an input/output error on the device. Check the disk, then convert again",
    errno.EMFILE: "too many open files: this process may open {open_files} (its 'ulimit -n'), and the npy and hdf5 "
                  "writers keep one or two files open per field. Raise the limit ('ulimit -n 65536') and convert "
                  f"again, or convert to {fix_option('format', 'tar')}, which keeps one shard open",
    errno.ENFILE: "too many open files on this machine (the system's limit). Close other programs, or convert to "
                  f"{fix_option('format', 'tar')}, which keeps one shard open",
}


def _open_files_limit() -> str:
    try:
        import resource

        return str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError, ValueError):
        return "a limited number"


def write_error(output: Path, exc: OSError) -> OutputWriteError:
    """A one-line error naming the real cause of a failed write (and that nothing was left)."""
    cause = _CAUSES.get(exc.errno)
    if cause is not None and "{open_files}" in cause:
        cause = cause.format(open_files=_open_files_limit())
    where = f" ({exc.filename})" if exc.filename and exc.errno in (errno.ENOENT, errno.EEXIST, errno.EACCES) else ""
    if cause is None:
        cause = f"{exc.strerror or exc}. Check the output folder and convert again"
    return os_error(
        OutputWriteError, exc.errno, f"Cannot write {str(output)!r}: {cause}{where}; no partial output was left behind."
    )


def prepare_output(output: Path, protected: list[Protected], *, overwrite: bool, resume: bool) -> None:
    """What every writer of OUTPUT (a conversion, a part, the Ray driver) checks before it reads
    the source: a usable path, not the source or inside it, an existing output refused at once
    unless ``overwrite``/``resume`` decide later; then OUTPUT's folder is made."""
    check_output_path(output)
    check_not_source(output, protected)
    if not (overwrite or resume):
        check_existing(output, overwrite=False, resume=False)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(output, exc) from exc


@contextlib.contextmanager
def partial_removed_on_failure(output: Path, partial: Path) -> Iterator[None]:
    """Around writing ``partial`` (ours: the lock is held and the journal names it): on any
    failure it and the journal are removed and an OSError is reported by its cause (except after
    a Ctrl-C that kept them for ``--resume``); on success the journal is removed (the output has
    been published)."""
    try:
        yield
    except ConversionInterrupted:  # kept, with its journal, for --resume
        raise
    except BaseException as exc:
        with contextlib.suppress(OSError):
            remove_path(partial)
        journal.remove(output)
        if isinstance(exc, OSError) and not isinstance(exc, FastdataError):
            raise write_error(output, exc) from exc
        raise
    journal.remove(output)
