"""Errors raised by fastdata.

Every error derives from :class:`FastdataError`; each leaf also inherits the standard
exception type that callers already catch (``FileNotFoundError``, ``ValueError``, ...).
"""

from __future__ import annotations


def fix_option(name: str, value: object = True) -> str:
    """An option as a message's fix names it, in both forms a caller uses (the CLI's flag, the
    keyword of ``fastdata.convert``): ``fix_option("skip_bad")`` is ``--skip-bad (skip_bad=True)``;
    an option that takes a value names it as each form is typed, ``fix_option("columns", "image,label")``
    is ``--columns image,label (columns='image,label')`` (a placeholder too: ``--split NAME (split='NAME')``)."""
    flag = f"--{name.replace('_', '-')}"
    return f"{flag} ({name}=True)" if value is True else f"{flag} {value} ({name}={value!r})"


class FastdataError(Exception):
    """Base class of every error fastdata raises on purpose."""


class InvalidOptionError(FastdataError, ValueError):
    """An option has a value fastdata cannot use."""


class UnknownFormatError(InvalidOptionError):
    """A format name that is not in the registry."""


class SourceNotFoundError(FastdataError, FileNotFoundError):
    """The source path or dataset does not exist."""


class EmptySourceError(FastdataError, ValueError):
    """The source exists but holds no usable samples."""


class SourceLayoutError(FastdataError, ValueError):
    """The source's files are not laid out as its kind needs (images beside class folders)."""


class BadSampleError(FastdataError, ValueError):
    """One sample cannot be read or decoded; the message names it."""


class ShapeMismatchError(FastdataError, ValueError):
    """Samples do not share the one image size that raw storage needs."""


class OutputExistsError(FastdataError, FileExistsError):
    """The output path exists and overwriting was not asked for."""


class OutputWriteError(FastdataError, OSError):
    """Writing the output failed (disk full, file-size limit, permissions)."""


class ManifestError(FastdataError, ValueError):
    """A converted dataset's manifest is missing, unreadable or inconsistent."""


class VersionMismatchError(ManifestError):
    """A dataset was written with a layout version this fastdata cannot read."""


class CorruptDataError(FastdataError, OSError):
    """Stored data is truncated or damaged; the message names the file (and sample)."""


class DependencyMissingError(FastdataError, ImportError):
    """An optional package that the requested feature needs is not installed."""


class DependencyMismatchError(FastdataError, ImportError):
    """Two installed packages that must be built together (torch and torchvision) are not: the
    second one's compiled code does not load."""


class OutputLockedError(FastdataError, BlockingIOError):
    """Another conversion is writing the same output right now."""


class CorruptManifestError(ManifestError, CorruptDataError):
    """A manifest or shard index holds a value that does not fit the files beside it."""


class NotIndexableError(FastdataError, NotImplementedError):
    """An iterable reader was indexed (``ds[0]``); the message names the map-style reader to use.
    A NotImplementedError, as torch's ``IterableDataset`` raises there."""


class SourceChangedError(FastdataError, ValueError):
    """The source changed since a partial or finished output was made from it."""


class UnknownDatasetFormatError(UnknownFormatError, ManifestError):
    """A dataset's manifest names a format this fastdata does not know."""


class EngineError(FastdataError, RuntimeError):
    """The engine that runs a conversion's units failed (a lost worker, node or cluster)."""


class SharedMemoryFullError(FastdataError, OSError):
    """/dev/shm has too little room for the batches of worker processes; the message gives its free
    space, what was needed and the fix (more shared memory, or threads)."""


class PartsError(FastdataError, ValueError):
    """The parts of a job-array conversion are missing, run twice or do not match each other."""


class UnsupportedURLError(InvalidOptionError):
    """A URL (``s3://``, ``https://``, ...) where fastdata takes only local paths."""


class UnknownOptionError(InvalidOptionError, TypeError):
    """A keyword argument that a reader (or another callable taking options) does not take."""


class RemoteError(FastdataError, OSError):
    """Reading or writing object storage (``s3://``, ``gs://``, ``https://``, ...) failed."""


class RemoteNotFoundError(RemoteError, FileNotFoundError):
    """The URL names no object (404)."""


class RemoteAccessError(RemoteError, PermissionError):
    """Access denied (403), or no credentials found."""


class RemoteUnavailableError(RemoteError, ConnectionError):
    """The server did not answer (after every retry), or answered with an error."""


class SourceReadError(FastdataError, OSError):
    """Reading the source's bytes failed (the network, the disk): no sample is at fault, so
    ``--skip-bad`` does not skip it; the message names the file and the cause."""


class CacheWriteError(FastdataError, OSError):
    """The local cache of remote files (``cache_dir``) cannot be written: its disk is full, or
    it is read-only or not writable; the message names the folder and the fix."""



class ConversionInterrupted(KeyboardInterrupt):
    """A conversion stopped by Ctrl-C or SIGTERM after a checkpoint: its partial output and
    journal are kept (as a killed process leaves them), and ``--resume`` continues from there.
    Still a :class:`KeyboardInterrupt`, so code that stops on Ctrl-C stops on it; its text says
    how many samples are kept and what to run."""

    def __init__(self, output: str, kept: int, total: int, partial: str):
        self.output, self.kept, self.total, self.partial = output, kept, total, partial
        super().__init__(f"{output!r} keeps {kept:,} of {total:,} samples in {partial!r}; run the same command "
                         f"with {fix_option('resume')} to continue from there")
