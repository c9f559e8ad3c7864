"""The whole contract of a storage format, in one place.

A format is one package under ``fastdata/formats/<name>/`` (or a third-party package named by a
``fastdata.formats`` entry point) that ends by registering one :class:`FormatSpec`
(:func:`fastdata.formats.registry.register`). The spec names everything fastdata calls:

* :class:`Writer` (``spec.writer``): created with the path to write (a temporary name; the
  engine renames it when complete), the :class:`Plan` and the format's options; receives
  batches (:class:`Batch`) in sample order, then writes its manifest in :meth:`Writer.close`.
* :class:`Reader` (``spec.dataset``, and ``spec.map_reader`` when ``dataset`` is iterable):
  the torch Dataset; constructed as ``reader(path, **options)`` where the options are the
  fields of :class:`fastdata.reader.ReaderOptions` (shared by every reader) plus the reader's
  own (its ``Options`` dataclass).
* ``spec.verify(path, manifest, *, deep)``: the format's own checks for ``fastdata verify``.
* ``spec.read_manifest(path)``: for single-file formats, the manifest stored in a file.
* ``spec.options``: a frozen dataclass of format-specific conversion options (CLI flags).

Steps to add one: docs/formats.md, "Adding a format". Nothing here knows where samples come
from (no ``sources`` import).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastdata.errors import InvalidOptionError
from fastdata.images import Geometry
from fastdata.manifest import CHECKSUM_ALGORITHM


@dataclass(frozen=True)
class Plan:
    """Everything a writer needs to know before the first batch arrives.

    ``count`` is the number of samples attempted; with ``skip_bad`` fewer may arrive.
    ``shape`` is (H, W, C) for raw storage, None for encoded. ``encoding`` is ``"raw"``,
    ``"original"`` (source file bytes kept as they are), ``"png"`` or ``"jpeg"``.
    """

    count: int
    store: str
    mode: str
    channels: int
    shape: tuple[int, int, int] | None
    encoding: str
    class_to_idx: dict[str, int]
    geometry: Geometry = Geometry()
    jpeg_quality: int | None = None
    schema: Any = None
    """The :class:`fastdata.fields.Schema` of samples with fields beyond ``(image, label)``;
    None for the classic two-field sample (stored exactly as always)."""
    classes: list[Any] | None = None
    """The source's class list as it has it (:attr:`fastdata.sources.base.Source.classes`);
    None: the names of ``class_to_idx`` in index order."""

    @property
    def class_list(self) -> list[Any]:
        """The manifest's ``classes``: the source's list, else ``class_to_idx``'s names by index."""
        if self.classes is not None:
            return list(self.classes)
        return sorted(self.class_to_idx, key=self.class_to_idx.__getitem__)

    @property
    def extras(self) -> list:
        """The fields a writer stores beside the image and label files (``fields/<name>``)."""
        return self.schema.extras if self.schema is not None else []


@dataclass
class Batch:
    """Consecutive converted samples: raw pixels in ``images`` or encoded bytes in ``blobs``."""

    keys: list[str]
    labels: np.ndarray
    images: np.ndarray | None = None  # (B, H, W, C) uint8
    blobs: list[bytes] | None = None
    fields: dict[str, list[bytes]] | None = None  # extra field -> each sample's stored bytes (fastdata.fields)
    skipped: list[tuple[int, dict[str, str]]] = field(default_factory=list)  # (index, {key, reason})

    def __len__(self) -> int:
        return len(self.keys)


class RunningDigest:
    """A file's manifest checksum (:data:`~fastdata.manifest.CHECKSUM_ALGORITHM`) kept while the
    file is written: fed every byte in write order, it gives the manifest entry when the file is
    closed instead of reading gigabytes back (a writer waits on its decoders anyway). ``bytes``
    counts what was fed. A writer that resumes a file at a checkpoint starts it again from the
    bytes already there (:meth:`of_file`)."""

    def __init__(self, initial: bytes = b""):
        self._hash = hashlib.blake2b(initial, digest_size=32)
        self.bytes = len(initial)

    @classmethod
    def of_file(cls, handle: Any, block_bytes: int = 1024 * 1024) -> "RunningDigest":
        """The digest of what ``handle`` (open for reading, at its start) holds, to write on after it."""
        digest = cls()
        for block in iter(lambda: handle.read(block_bytes), b""):
            digest.update(block)
        return digest

    def update(self, data: bytes | memoryview) -> None:
        self._hash.update(data)
        self.bytes += memoryview(data).nbytes

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def entry(self) -> dict[str, Any]:
        """The manifest's entry for the file: ``{"bytes": ..., "blake2b": ...}`` (what
        :func:`fastdata.manifest.describe_file` would compute from the finished file)."""
        return {"bytes": self.bytes, CHECKSUM_ALGORITHM: self.hexdigest()}


class Writer:
    """Interface of a format writer (subclass it in ``fastdata/formats/<name>/writer.py``).
    A writer that checksums a file as it writes it uses :class:`RunningDigest`."""

    def __init__(self, path: Path, plan: Plan, options: Any):
        self.path = path
        self.plan = plan
        self.options = options

    def write(self, batch: Batch) -> None:
        """Append a batch (samples arrive in order; ``batch`` may be empty)."""
        raise NotImplementedError

    def close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Finish the files, add ``files`` (checksums) and layout details to ``manifest``,
        store it, and return it. Called once, after the last batch."""
        raise NotImplementedError

    def abort(self) -> None:
        """Release open handles after a failure (the engine removes the temporary output)."""

    # --- optional: resumable writers (``fastdata convert --resume``) ---------------------

    supports_resume = False

    def checkpoint(self) -> dict[str, Any]:
        """Make everything written so far durable; return JSON-able state for :meth:`resume`."""
        raise NotImplementedError

    @classmethod
    def resume(cls, path: Path, plan: Plan, options: Any, state: dict[str, Any]) -> "Writer":
        """Reopen a partial output at a checkpoint's ``state`` and continue after it."""
        raise NotImplementedError

    # --- optional: writers whose finished files may leave the disk (a conversion to a URL) ---

    streams_files = False
    """True for a writer (and its :meth:`resume`) that takes ``sink=``, a :class:`FileSink`, and
    hands it each file of the output as soon as that file is final (tar: each shard), so a
    conversion to a URL uploads it and removes it from the local disk while the next is written.
    The files of other writers are uploaded once the writer is closed."""


class FileSink:
    """Where a streaming writer's finished files go (``fastdata convert SOURCE URL``: uploaded,
    then removed from the local disk). Called from the writer's threads."""

    def closed(self, path: Path) -> None:
        """``path`` is a file of the output that will not change again; it may be removed."""
        raise NotImplementedError

    def restore(self, path: Path) -> None:
        """Bring back ``path``, a file given to :meth:`closed` before (a resumed writer reopens
        a shard that was finished after its checkpoint)."""
        raise NotImplementedError


class Reader:
    """Interface of a format's map-style reader: what a subclass of
    :class:`fastdata.formats.StoredDataset` (the base that opens and checks the manifest, holds
    the options and serves indexing, batches, pickling and per-process files) implements.

    The reader of a converted dataset is built as ``Reader(path, transform=None,
    target_transform=None, **options)``; every reader returns ``(image, label)``, a collated
    batch for a list of indices, and opens its files lazily in each process.
    """

    format_name: str = ""
    """The registered format this reader reads (its manifest's ``format``)."""

    required_files: dict[str, tuple[str, ...]] = {}
    """store -> the names the manifest's ``files`` must list."""

    def _load(self) -> None:
        """Check and load this format's own small files (labels, offsets, an index) after the
        manifest was checked; raise :class:`~fastdata.errors.CorruptDataError` naming the file."""

    def _open(self) -> Any:
        """This process's handles (files, memory maps), opened on first use after a fork; never
        pickled."""
        return None

    def _read(self, indices: np.ndarray, allocate: Callable | None = None, *, pil: bool = False,
              draws: list | None = None) -> Any:
        """Pixels of ``indices``: one (B, H, W, C) uint8 array or a list of (H, W, C) arrays (with
        ``pil``, a reader of encoded images may return the decoded PIL images instead). Where a
        reader can, it writes the pixels into ``allocate(shape, dtype)`` (which may return None:
        no room) instead of new memory. Readers of formats with fields take ``draws``: a list that
        a fused decode appends each row's ``(height, width, Draw)`` to (:mod:`fastdata.reader.records`)."""
        raise NotImplementedError

    def _encoded(self, indices: np.ndarray) -> list[bytes]:
        """Optional, for ``--store encoded`` datasets: each image's bytes of ``indices`` as stored
        (a conversion from this dataset keeps them, as it keeps an image folder's files; without
        this hook it decodes and encodes them again)."""
        raise NotImplementedError

    def encoded_sizes(self) -> np.ndarray | None:
        """Optional, for ``--store encoded`` datasets: every stored image's size in bytes, in
        index order, from the reader's own index (never by reading the images). With
        :meth:`_encoded` it gives the sizes ``fastdata info`` shows (bytes, and width and height
        from a sample of image headers); None (the default): info shows none."""
        return None

    def _field_values(self, field: Any, indices: np.ndarray) -> Any:
        """For formats that store fields (``FormatSpec.fields``): one extra field's stored values
        of ``indices`` (:mod:`fastdata.fields`), the (B, *shape) rows of a fixed-shape field or
        each sample's stored bytes; :mod:`fastdata.reader.records` builds the samples from them."""
        raise NotImplementedError


_READER_FIELDS = frozenset({"dataset", "map_reader"})


def load_reference(reference: str) -> Any:
    """The object a ``"package.module:Name"`` reference names (imported now)."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def lazy_exports(table: dict[str, str]) -> Callable[[str], Any]:
    """A format package's module ``__getattr__`` (PEP 562): ``table`` maps a public name to the
    module defining it, imported on first use, so discovering the format does not import its
    reader (and torch). ``from fastdata.formats.npy import MemmapDataset`` works as before."""
    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module has no attribute {name!r}")
        return getattr(importlib.import_module(table[name]), name)

    return __getattr__


@dataclass(frozen=True)
class FormatSpec:
    """What the rest of fastdata needs to know about one storage format (see the module
    docstring for the contract each hook keeps)."""

    name: str
    """The format's name: ``--format NAME`` and the manifest's ``format``."""
    dataset: type | str
    """The reader :func:`fastdata.open_dataset` returns (a :class:`Reader`, or an iterable one).
    It may be given as ``"module:Class"``, imported on first use (readers import torch; the
    registry, ``fastdata info`` and ``fastdata verify`` do not need it)."""
    writer: type | None = None
    """The :class:`Writer`; None for read-only formats."""
    stores: tuple[str, ...] = ("raw", "encoded")
    """The storage modes the format writes."""
    suffix: str = ""
    """The extension fastdata gives outputs it names itself (bench, tests)."""
    suffixes: tuple[str, ...] = ()
    """Output-name extensions (lower case) that select this format when ``--format`` is not given."""
    layout_version: int = 1
    """The on-disk layout version its readers read (others are refused)."""
    options: type | None = None
    """A frozen dataclass of conversion options; a field's ``metadata`` may hold ``help`` and
    ``metavar`` for the CLI."""
    read_manifest: Callable[[Path], dict[str, Any] | None] | None = None
    """Single-file formats only (directories carry ``manifest.json``): the manifest dict when the
    file holds a dataset of this format, else None. Reads of untrusted metadata are bounded."""
    description: str = ""
    """One line for ``--help`` and the docs."""
    verify: Callable[..., list[str]] | None = None
    """``verify(path, manifest, *, deep)``: the problems (one message each, naming the file and
    sample) this format's own checks find, beyond what :func:`fastdata.verify` checks for all."""
    map_reader: type | str | None = None
    """When ``dataset`` is iterable: its random-access counterpart (``fastdata.loader``, a
    shuffling DataLoader and a conversion from this format use it); ``"module:Class"`` as for
    ``dataset``."""
    self_batching: bool = False
    """The reader collates whole batches itself (``dataset(path, batch_size=...)``)."""
    baseline: bool = False
    """What the bench compares against (the source as it is)."""
    fields: bool = False
    """The writer stores every field of samples beyond ``(image, label)`` (``Batch.fields``) and
    the reader gives them back (docs/fields.md); a format without it converts only
    ``(image, label)`` sources."""
    stored_names: Callable[[Plan], list[tuple[str, str]]] | None = None
    """For formats with ``fields``: ``stored_names(plan)`` gives, for every field of the plan's
    schema (the image and label included), each name it takes on disk as ``(field name, stored
    name)``: files, HDF5 datasets, tar members (``<key>.`` left out). Two fields that would share
    one are refused before anything is written (:func:`check_stored_names`)."""

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if type(value) is str and name in _READER_FIELDS:  # "module:Class": imported on first use, then kept
            value = load_reference(value)
            object.__setattr__(self, name, value)
        return value

    @property
    def writable(self) -> bool:
        return self.writer is not None

    @property
    def iterable(self) -> bool:
        """Whether ``dataset`` is an iterable (streaming) reader."""
        from torch.utils.data import IterableDataset  # torch only when a caller asks: keeps the CLI start light

        return issubclass(self.dataset, IterableDataset)

    @property
    def map_dataset(self) -> type | None:
        """The map-style (random access) reader: ``dataset`` itself unless it is iterable."""
        return self.map_reader if self.iterable else self.dataset

    def make_options(self, values: dict[str, Any]) -> Any:
        """Build this format's options dataclass, refusing options it does not know."""
        known = {field.name for field in dataclasses.fields(self.options)} if self.options else set()
        unknown = sorted(set(values) - known)
        if unknown:
            allowed = ", ".join(repr(name) for name in sorted(known)) or "none"
            raise InvalidOptionError(
                f"Option {unknown[0]!r} does not apply to format {self.name!r}. "
                f"Its options: {allowed}."
            )
        return self.options(**values) if self.options else None


def check_stored_names(spec: FormatSpec, plan: Plan) -> None:
    """Refuse a plan in which two fields (or a field and the image or label) would be stored
    under one name in format ``spec`` (``spec.stored_names``): the second would overwrite the
    first, or stock readers (webdataset: "duplicate file name") would refuse the output."""
    if plan.schema is None or spec.stored_names is None:
        return
    owners: dict[str, str] = {}
    for owner, name in spec.stored_names(plan):
        first = owners.setdefault(name, owner)
        if first != owner:
            raise InvalidOptionError(
                f"Fields {first!r} and {owner!r} would both be stored as {name!r} in the {spec.name} format, where "
                "only one of them could be read back. Rename one in the source (a dict key, names=[...] for a tuple, "
                "a WebDataset member's suffix), or convert to another format."
            )


@dataclass(frozen=True)
class MissingFormat:
    """A format whose optional dependency is not installed: listed (with the install command)
    instead of failing at import; using it raises :class:`~fastdata.errors.DependencyMissingError`."""

    name: str
    requires: tuple[str, ...]
    install: str
    suffixes: tuple[str, ...] = ()
    description: str = ""

    @property
    def message(self) -> str:
        packages = " and ".join(repr(module.partition(".")[0]) for module in self.requires)
        noun = "packages" if len(self.requires) > 1 else "package"
        return f"Format {self.name!r} needs the {packages} {noun}: {self.install}"
