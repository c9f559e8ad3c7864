"""The ``hdf5`` format: one ``.h5`` file, readable with plain ``h5py``.

raw:      ``images`` (N, H, W, C) uint8 -- contiguous when uncompressed, chunked along N
          when compressed (or ``chunk_images`` is given)
encoded:  ``blob`` (total bytes,) uint8 -- every sample's encoded bytes, concatenated, contiguous
          ``offsets`` (N + 1,) int64 -- sample ``i`` is ``blob[offsets[i]:offsets[i + 1]]``
both:     ``labels`` (N,) int64; root attributes ``classes`` (class names, index = label) and
          ``fastdata_manifest`` (the manifest, JSON). Every dataset carries a ``blake2b``
          attribute: the checksum of its contents. The file starts with a 512-byte HDF5 user block
          (skipped by h5py and every HDF5 tool) holding the checksum of every byte after it, so
          ``fastdata verify`` finds a flipped byte anywhere, metadata included.

Reading: contiguous, unfiltered datasets are memory-mapped at their file offset (as fast as
``npy``); chunked ones are read a whole chunk at a time, decompressed once and kept in a small
per-process cache. :class:`fastdata.samplers.ChunkShuffleSampler` orders an epoch so each chunk
is needed once.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np

from fastdata.errors import (
    CorruptDataError,
    CorruptManifestError,
    DependencyMissingError,
    FastdataError,
    InvalidOptionError,
    ManifestError,
    SourceNotFoundError,
)
from fastdata.formats import FormatSpec, register
from fastdata.images import decode
from fastdata.manifest import CHECKSUM_ALGORITHM, open_manifest, parse_manifest, seal_manifest
from fastdata.outputs import unique_sibling
from fastdata.plan import Batch, Plan, Writer
from fastdata.reader import MapDataset

LAYOUT_VERSION = 1
FORMAT = "hdf5"
MANIFEST_ATTR = "fastdata_manifest"
USERBLOCK_BYTES = 512  # before the HDF5 data: holds the checksum of everything after it
_USERBLOCK_MAGIC = b"fastdata hdf5 blake2b "
CHUNK_TARGET_BYTES = 1 << 20  # the chunk-size rule: ~1 MiB of pixels per chunk
DEFAULT_CACHE_BYTES = 8 << 20  # decompressed chunks kept per process by HDF5Dataset (2 windows)
_COPY_BYTES = 16 << 20
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
# what h5py raises on damaged metadata, besides OSError (found by flipping every metadata byte)
_H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError)
_PLUGIN_CODECS = ("blosc", "lz4", "zstd")  # need the hdf5plugin package
_LEVELS = {"gzip": (0, 9, 4), "blosc": (0, 9, 5), "zstd": (1, 22, 3)}  # min, max, default


# --- options ----------------------------------------------------------------------------


def parse_compression(value: str | None) -> str | None:
    """``"gzip"`` -> ``"gzip:4"``, ``"lzf"``, ``"zstd:9"``, ``"none"`` -> None (validated)."""
    if value is None:
        return None
    text = str(value).strip().lower()
    if text in ("", "none"):
        return None
    match = re.fullmatch(r"(gzip|lzf|blosc|lz4|zstd)(?::(\d+))?", text)
    allowed = "'none', 'gzip[:0-9]', 'lzf', and with hdf5plugin 'blosc[:0-9]', 'lz4', 'zstd[:1-22]'"
    if not match:
        raise InvalidOptionError(f"Unknown compression {value!r}. Allowed: {allowed}.")
    codec, level = match.group(1), match.group(2)
    if codec in _PLUGIN_CODECS:
        _import_hdf5plugin(f"compression {value!r}")
    if codec not in _LEVELS:
        if level is not None:
            raise InvalidOptionError(f"Compression {codec!r} takes no level, got {value!r}. Use {codec!r}.")
        return codec
    low, high, default = _LEVELS[codec]
    level_value = default if level is None else int(level)
    if not low <= level_value <= high:
        raise InvalidOptionError(f"Invalid {codec} level in compression {value!r}. Use {low}..{high}.")
    return f"{codec}:{level_value}"


def _import_hdf5plugin(what: str) -> Any:
    try:
        import hdf5plugin
    except ImportError as exc:
        raise DependencyMissingError(
            f"{what} needs the 'hdf5plugin' package, which is not installed. "
            "Install it with 'pip install hdf5plugin', or use 'gzip' or 'lzf'."
        ) from exc
    return hdf5plugin


@dataclass(frozen=True)
class HDF5Options:
    """Options of ``--format hdf5``; ``compression`` applies to ``--store raw`` only."""

    compression: str | None = field(
        default=None,
        metadata={
            "help": "hdf5, raw store: none (default, contiguous), gzip[:LEVEL], lzf; with hdf5plugin "
            "blosc[:LEVEL], lz4, zstd[:LEVEL]",
            "parse": str,  # validated by HDF5Options, so the CLI reports it like any option error
        },
    )
    chunk_images: int | None = field(
        default=None,
        metadata={
            "help": "hdf5, raw store: images per chunk (default: about 1 MiB of pixels per chunk)",
            "parse": int,
        },
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "compression", parse_compression(self.compression))
        chunk = self.chunk_images
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0):
            raise InvalidOptionError(f"Invalid chunk_images {chunk!r}. Use a positive integer.")


def default_chunk_images(image_shape: tuple[int, ...], count: int) -> int:
    """The chunk-size rule: as many images as fit in 1 MiB, at least 1, at most ``count``."""
    image_bytes = int(np.prod(image_shape))
    return max(1, min(max(count, 1), CHUNK_TARGET_BYTES // max(image_bytes, 1)))


def _filter_kwargs(compression: str | None) -> dict[str, Any]:
    """h5py ``create_dataset`` keyword arguments for a normalised compression name."""
    if compression is None:
        return {}
    codec, _, level = compression.partition(":")
    if codec == "gzip":
        return {"compression": "gzip", "compression_opts": int(level)}
    if codec == "lzf":
        return {"compression": "lzf"}
    plugin = _import_hdf5plugin(f"compression {compression!r}")
    if codec == "blosc":
        return dict(plugin.Blosc(cname="lz4", clevel=int(level), shuffle=plugin.Blosc.SHUFFLE))
    if codec == "lz4":
        return dict(plugin.LZ4())
    return dict(plugin.Zstd(clevel=int(level)))


# --- writer -----------------------------------------------------------------------------


class _ContentHash:
    """Checksum of a dataset's contents, fed in write order."""

    def __init__(self) -> None:
        self.digest = hashlib.blake2b(digest_size=32)
        self.bytes = 0

    def update(self, array: np.ndarray) -> None:
        data = memoryview(np.ascontiguousarray(array)).cast("B")
        self.digest.update(data)
        self.bytes += data.nbytes

    def describe(self, name: str) -> dict[str, Any]:
        return {"dataset": name, "bytes": self.bytes, CHECKSUM_ALGORITHM: self.digest.hexdigest()}


class HDF5Writer(Writer):
    """Writes one ``.h5`` file (see the module docstring for its layout)."""

    def __init__(self, path: Path, plan: Plan, options: HDF5Options | None):
        options = options or HDF5Options()
        super().__init__(path, plan, options)
        given = [f"{name}={value!r}" for name, value in vars(options).items() if value is not None]
        if plan.store == "encoded" and given:
            raise InvalidOptionError(
                f"Option {' and '.join(given)} applies to --store raw only (encoded images are already "
                "compressed, and stored contiguous). Drop it, or use --store raw."
            )
        self.chunk_images = None
        if plan.store == "raw" and (options.compression or options.chunk_images):
            self.chunk_images = options.chunk_images or default_chunk_images(plan.shape, plan.count)
            if self.chunk_images * int(np.prod(plan.shape)) >= 1 << 32:
                raise InvalidOptionError(
                    f"chunk_images={self.chunk_images} makes chunks of 4 GiB or more (HDF5's limit). "
                    "Use a smaller --chunk-images."
                )
        self.count = 0
        self.labels: list[np.ndarray] = []
        self.hashes = {"labels": _ContentHash(), **{name: _ContentHash() for name in self._names()}}
        # temporary files beside the partial output, under names no one else uses; only the
        # ones this writer created are ever removed
        self.blob_path = unique_sibling(path, ".blob-")
        self.temporary: list[Path] = []
        self.file: h5py.File | None = None
        self.blob = None
        # options are all checked; the engine only cleans up after a writer exists, so a failure
        # while creating the files removes them here
        try:
            self._create_files()
        except BaseException:
            self.abort()
            path.unlink(missing_ok=True)
            raise

    def _names(self) -> tuple[str, ...]:
        return ("images",) if self.plan.store == "raw" else ("blob", "offsets")

    def _create_files(self) -> None:
        self.file = h5py.File(self.path, "w", userblock_size=USERBLOCK_BYTES)
        if self.plan.store == "encoded":
            self.blob = open(self.blob_path, "xb")
            self.temporary.append(self.blob_path)
            self.offsets = [np.zeros(1, dtype=np.int64)]
            self.position = 0
            return
        shape = self.plan.shape
        kwargs: dict[str, Any] = {}
        if self.chunk_images is not None:
            kwargs = dict(chunks=(self.chunk_images, *shape), maxshape=(None, *shape),
                          **_filter_kwargs(self.options.compression))
        self.images = self.file.create_dataset("images", shape=(self.plan.count, *shape), dtype=np.uint8, **kwargs)
        self.pending: list[np.ndarray] = []  # chunked: images waiting for a whole chunk
        self.written = 0

    def write(self, batch: Batch) -> None:
        if not len(batch):
            return
        if self.plan.store == "raw":
            self.hashes["images"].update(batch.images)
            if self.chunk_images is None:
                self.images[self.count : self.count + len(batch)] = batch.images
            else:
                self.pending.append(batch.images)
                self._flush_chunks(final=False)
        else:
            sizes = np.fromiter((len(b) for b in batch.blobs), dtype=np.int64, count=len(batch))
            data = b"".join(batch.blobs)
            self.blob.write(data)
            self.hashes["blob"].update(np.frombuffer(data, dtype=np.uint8))
            self.offsets.append(self.position + np.cumsum(sizes))
            self.position += int(sizes.sum())
        self.labels.append(batch.labels.astype(np.int64, copy=False))
        self.count += len(batch)

    def _flush_chunks(self, *, final: bool) -> None:
        """Write whole chunks only (each chunk compressed once); the remainder when ``final``."""
        if not self.pending:
            return
        pending = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
        start = self.written
        end = start + len(pending)
        whole = (end if final else end // self.chunk_images * self.chunk_images) - start
        if whole > 0:
            self.images[start : start + whole] = pending[:whole]
            self.written = start + whole
        self.pending = [pending[whole:]] if whole < len(pending) else []

    def close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        file = self.file
        if self.plan.store == "raw":
            if self.chunk_images is not None:
                self._flush_chunks(final=True)
                self.images.resize(self.count, axis=0)
            elif self.count != self.plan.count:
                file = self._compact()
        else:
            self._write_blob(file)
        labels = np.concatenate(self.labels) if self.labels else np.empty(0, dtype=np.int64)
        self.hashes["labels"].update(labels)
        file.create_dataset("labels", data=labels)
        manifest["files"] = {name: self.hashes[name].describe(name) for name in (*self._names(), "labels")}
        manifest["hdf5"] = self._layout(file)
        for name, entry in manifest["files"].items():
            file[name].attrs[CHECKSUM_ALGORITHM] = entry[CHECKSUM_ALGORITHM]
        classes = sorted(self.plan.class_to_idx, key=self.plan.class_to_idx.__getitem__)
        file.attrs.create("classes", np.array(classes, dtype=object), dtype=h5py.string_dtype())
        file.attrs["fastdata_format"] = FORMAT
        file.attrs["layout_version"] = LAYOUT_VERSION
        file.attrs[MANIFEST_ATTR] = json.dumps(seal_manifest(manifest), ensure_ascii=False)
        file.close()
        with open(self.path, "r+b") as handle:  # the whole-file checksum, in the user block
            handle.write(userblock(_hash_after_userblock(handle)))
            handle.flush()
            os.fsync(handle.fileno())  # on disk before the engine renames it
        return manifest

    def _write_blob(self, file: h5py.File) -> None:
        """Copy the temporary blob file into a contiguous ``blob`` dataset of its exact size."""
        self.blob.close()
        offsets = np.concatenate(self.offsets)
        self.hashes["offsets"].update(offsets)
        blob = file.create_dataset("blob", shape=(self.position,), dtype=np.uint8)
        with open(self.blob_path, "rb") as handle:
            for start in range(0, self.position, _COPY_BYTES):
                piece = np.frombuffer(handle.read(_COPY_BYTES), dtype=np.uint8)
                blob[start : start + len(piece)] = piece
        self.blob_path.unlink()
        file.create_dataset("offsets", data=offsets)

    def _compact(self) -> h5py.File:
        """Samples were skipped: copy the written rows into a new file (a contiguous dataset
        cannot shrink, and a smaller copy inside the same file would leave dead space)."""
        compact_path = unique_sibling(self.path, ".compact-")
        compact = h5py.File(compact_path, "w-", userblock_size=USERBLOCK_BYTES)
        self.temporary.append(compact_path)
        images = compact.create_dataset("images", shape=(self.count, *self.plan.shape), dtype=np.uint8)
        step = max(1, _COPY_BYTES // int(np.prod(self.plan.shape)))
        for start in range(0, self.count, step):
            images[start : start + step] = self.images[start : min(start + step, self.count)]
        self.file.close()
        os.replace(compact_path, self.path)
        self.file = compact
        return compact

    def _layout(self, file: h5py.File) -> dict[str, Any]:
        if self.plan.store == "encoded":
            return {"encoded_layout": "blob+offsets", "blob": "contiguous"}
        images = file["images"]
        return {
            "images": "chunked" if images.chunks else "contiguous",
            "chunk_images": images.chunks[0] if images.chunks else None,
            "compression": self.options.compression,
        }

    def abort(self) -> None:
        try:
            if self.file is not None:
                self.file.close()
        finally:
            if self.blob is not None:
                self.blob.close()
            for leftover in self.temporary:
                if leftover.exists():
                    leftover.unlink()


# --- reader -----------------------------------------------------------------------------


def _open_file(path: Path, **kwargs: Any) -> h5py.File:
    """Open read-only with h5py's default locking (so plain h5py opens of the same file agree)."""
    try:
        return h5py.File(path, "r", **kwargs)
    except (OSError, ValueError) as exc:
        raise CorruptDataError(
            f"{str(path)!r}: cannot open as HDF5 ({exc}). The file is truncated or damaged; "
            "convert the source again."
        ) from exc


def read_manifest(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    with open(path, "rb") as handle:
        head = handle.read(USERBLOCK_BYTES + len(_HDF5_SIGNATURE))
    if _HDF5_SIGNATURE not in (head[: len(_HDF5_SIGNATURE)], head[USERBLOCK_BYTES:]):
        return None
    with _open_file(path) as file:
        try:
            text = file.attrs.get(MANIFEST_ATTR)
            if text is not None:
                text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
                text.encode("utf-8")  # a damaged attribute may decode to unpaired surrogates
        except (*_H5_ERRORS, UnicodeError) as exc:
            raise CorruptManifestError(
                f"{str(path)!r}: cannot read the {MANIFEST_ATTR!r} attribute ({type(exc).__name__}: {exc}). The "
                "file is damaged; convert the source again."
            ) from exc
    if text is None:
        return None
    manifest = parse_manifest(text, repr(str(path)))
    return manifest if manifest.get("format") == FORMAT else None


# filters fastdata writes (and HDF5's own checksum filters); any other is refused
KNOWN_FILTERS = {1: "gzip", 2: "shuffle", 3: "fletcher32", 32000: "lzf", 32001: "blosc", 32004: "lz4", 32015: "zstd"}
_MAX_CHUNK_BYTES = (1 << 32) - 1  # HDF5's own limit on one chunk


def checked_dataset(file: h5py.File, name: str, origin: str, file_size: int, *, shape: tuple[int, ...] | None,
                    contiguous: bool = False) -> h5py.Dataset:
    """``file[name]`` when it is a dataset fastdata could have written, else CorruptDataError.

    It must be a hard link to a dataset stored inside this file: not a soft or external link,
    not a virtual dataset, no external storage (which can name any file on the machine), only
    filters fastdata knows, contiguous data lying within the file (or every chunk written), and
    the shape the manifest implies. So nothing is read from another file, and nothing is
    allocated that the file's size does not bound.
    """
    def corrupt(what: str) -> CorruptDataError:
        return CorruptDataError(f"{origin!r}: {what}; fastdata reads only data stored inside the file itself. "
                                "Run 'fastdata verify' on it, or convert the source again.")

    link = file.get(name, getlink=True)
    if link is None:
        raise CorruptDataError(f"{origin!r} has no {name!r} dataset; it is damaged. Convert the source again.")
    if not isinstance(link, h5py.HardLink):
        target = getattr(link, "filename", None) or getattr(link, "path", "")
        raise corrupt(f"{name!r} is a {type(link).__name__} (to {target!r}), not a dataset in the file")
    dataset = file[name]
    if not isinstance(dataset, h5py.Dataset):
        raise corrupt(f"{name!r} is a {type(dataset).__name__}, not a dataset")
    if dataset.is_virtual:
        raise corrupt(f"dataset {name!r} is a virtual dataset (its data lives in other files)")
    if dataset.external:
        raise corrupt(f"dataset {name!r} uses external storage ({dataset.external[0][0]!r})")
    plist = dataset.id.get_create_plist()
    for number in range(plist.get_nfilters()):
        code = plist.get_filter(number)[0]
        if code not in KNOWN_FILTERS:
            raise corrupt(f"dataset {name!r} uses HDF5 filter {code}, which fastdata does not know")
    if dataset.dtype.kind not in "iu" or (shape is not None and dataset.shape != shape):
        expected = f"shape {shape}" if shape is not None else "integers"
        raise CorruptDataError(f"{origin!r}: dataset {name!r} holds {dataset.dtype} {dataset.shape}, expected "
                               f"{expected}; the file is damaged. Convert the source again.")
    layout = plist.get_layout()
    if layout == h5py.h5d.CHUNKED and not contiguous:
        chunk_bytes = int(np.prod(dataset.chunks)) * dataset.dtype.itemsize
        expected_chunks = int(np.prod([-(-n // c) for n, c in zip(dataset.shape, dataset.chunks)]))
        if chunk_bytes > _MAX_CHUNK_BYTES or dataset.id.get_num_chunks() != expected_chunks:
            raise corrupt(f"dataset {name!r} has {dataset.id.get_num_chunks()} of {expected_chunks} chunks written "
                          f"({chunk_bytes} bytes each)")
        return dataset
    if layout != h5py.h5d.CONTIGUOUS:
        raise corrupt(f"dataset {name!r} has a storage layout fastdata does not write ({layout})")
    offset, stored = dataset.id.get_offset(), dataset.id.get_storage_size()
    if dataset.nbytes and (offset is None or stored != dataset.nbytes or offset + stored > file_size):
        raise corrupt(f"dataset {name!r} claims {dataset.nbytes} bytes at offset {offset}, {stored} stored, in a "
                      f"{file_size}-byte file")
    return dataset


def _read_small(dataset: h5py.Dataset) -> np.ndarray:
    """A checked, contiguous 1-D dataset (labels, offsets) as int64."""
    if dataset.ndim != 1:
        raise CorruptDataError(f"dataset {dataset.name!r} has shape {dataset.shape}, expected one dimension; "
                               "the file is damaged. Convert the source again.")
    return np.asarray(dataset[()], dtype=np.int64)


def _memmap_offset(dataset: h5py.Dataset) -> int | None:
    """The file offset of a contiguous, unfiltered uint8 dataset, or None if it cannot be mapped."""
    plain = dataset.chunks is None and dataset.compression is None and not dataset._filters
    if not plain or dataset.external or dataset.dtype != np.uint8 or dataset.size == 0:
        return None
    return dataset.id.get_offset()


class _ChunkCache:
    """Reads whole chunks (``rows`` images each) through h5py, keeping the latest in an LRU."""

    def __init__(self, dataset: h5py.Dataset, rows: int, capacity_bytes: int):
        self.dataset = dataset
        self.rows = rows
        row_bytes = int(np.prod(dataset.shape[1:]))
        self.capacity = max(2, capacity_bytes // max(rows * row_bytes, 1))
        self.chunks: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()

    def chunk(self, number: int) -> np.ndarray:
        cached = self.chunks.get(number)
        if cached is not None:
            self.chunks.move_to_end(number)
            return cached
        start = number * self.rows
        stop = min(start + self.rows, self.dataset.shape[0])
        shape = (stop - start, *self.dataset.shape[1:])
        array = None
        if len(self.chunks) >= self.capacity:
            _, array = self.chunks.popitem(last=False)  # reuse its memory: no fresh page faults
        if array is None or array.shape != shape:
            array = np.empty(shape, dtype=np.uint8)
        self.dataset.read_direct(array, np.s_[start:stop])
        self.chunks[number] = array
        return array

    def __getitem__(self, indices: np.ndarray) -> np.ndarray:
        out = np.empty((len(indices), *self.dataset.shape[1:]), dtype=np.uint8)
        numbers = indices // self.rows
        for number in np.unique(numbers).tolist():
            where = np.flatnonzero(numbers == number)
            out[where] = self.chunk(number)[indices[where] - number * self.rows]
        return out


class _RowReader:
    """Contiguous data read through h5py (when it cannot be memory-mapped): one sorted,
    de-duplicated selection per batch -- a slice when the rows are consecutive."""

    def __init__(self, dataset: h5py.Dataset):
        self.dataset = dataset

    def __getitem__(self, indices: np.ndarray) -> np.ndarray:
        unique, inverse = np.unique(indices, return_inverse=True)
        if not len(unique):
            return np.empty((0, *self.dataset.shape[1:]), dtype=np.uint8)
        if unique[-1] - unique[0] + 1 == len(unique):
            rows = self.dataset[int(unique[0]) : int(unique[-1]) + 1]
        else:
            rows = self.dataset[unique]
        return rows[inverse.reshape(-1)]


@dataclass
class _Handles:
    file: h5py.File | None
    data: Any  # np.memmap, _ChunkCache, _RowReader or h5py.Dataset (encoded blob)


class HDF5Dataset(MapDataset):
    """Reader of the ``hdf5`` format (map-style; random access; batched reads).

    >>> ds = HDF5Dataset("out/cifar.h5")
    >>> image, label = ds[0]            # uint8 tensor (C, H, W), int
    >>> images, labels = ds[[3, 1, 2]]  # uint8 (3, C, H, W), int64 (3,)

    The file is opened lazily in each process (never shared across fork). ``cache_bytes``
    bounds the decompressed chunks kept per process; ``use_memmap=False`` reads contiguous
    data through h5py instead of memory-mapping it.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        *,
        image_format: str = "tensor",
        batch_transform: Callable | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        use_memmap: bool = True,
    ):
        super().__init__(
            transform=transform, target_transform=target_transform,
            image_format=image_format, batch_transform=batch_transform,
        )
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise InvalidOptionError(f"Invalid cache_bytes {cache_bytes!r}. Use a byte count >= 0.")
        self.path = Path(path)
        self.cache_bytes = cache_bytes
        if self.path.is_file() and read_manifest(self.path) is None:
            _open_file(self.path).close()  # a damaged file fails here with CorruptDataError
            raise ManifestError(
                f"{str(self.path)!r} is not an HDF5 dataset written by 'fastdata convert' (no "
                f"{MANIFEST_ATTR!r} attribute of format {FORMAT!r}). Use fastdata.open_dataset(path)."
            )
        manifest = open_manifest(self.path, FORMAT)
        self.manifest = manifest
        self.store = manifest["store"]
        self.mode = manifest["image"]["mode"]
        self._set_classes(manifest)
        self.chunk_images: int | None = None
        self._offset: int | None = None
        with _open_file(self.path) as file:
            try:
                self._describe(file, use_memmap=use_memmap)
            except FastdataError:
                raise
            except _H5_ERRORS as exc:
                raise CorruptDataError(
                    f"{str(self.path)!r}: damaged HDF5 metadata ({type(exc).__name__}: {exc}). "
                    f"Run 'fastdata verify {self.path}' or convert the source again."
                ) from exc

    def _describe(self, file: h5py.File, *, use_memmap: bool) -> None:
        """Every dataset is checked (:func:`checked_dataset`) and its shape compared with the
        manifest before anything is read from it."""
        count, origin, size = self.manifest["count"], str(self.path), self.path.stat().st_size
        self.labels = _read_small(checked_dataset(file, "labels", origin, size, shape=(count,), contiguous=True))
        if self.store == "raw":
            shape = (count, *self.manifest["image"]["shape"])
            data = checked_dataset(file, "images", origin, size, shape=shape)
            self.chunk_images = data.chunks[0] if data.chunks else None
            self._check_plugin()
        else:
            offsets = checked_dataset(file, "offsets", origin, size, shape=(count + 1,), contiguous=True)
            self.offsets = _read_small(offsets)
            data = checked_dataset(file, "blob", origin, size, shape=None, contiguous=True)
            if len(data.shape) != 1 or self.offsets[0] != 0 or np.any(np.diff(self.offsets) < 0) \
                    or self.offsets[-1] != data.shape[0]:
                raise CorruptDataError(
                    f"{origin!r}: offsets must rise from 0 to the blob's size ({data.shape}); they run from "
                    f"{int(self.offsets[0])} to {int(self.offsets[-1])}. The file is damaged; "
                    f"run 'fastdata verify {self.path}' or convert the source again."
                )
        self.shape = tuple(data.shape)
        self._offset = _memmap_offset(data) if use_memmap else None

    def _check_plugin(self) -> None:
        compression = (self.manifest.get("hdf5") or {}).get("compression") or ""
        if compression.partition(":")[0] in _PLUGIN_CODECS:
            _import_hdf5plugin(f"reading {str(self.path)!r} (compression {compression!r})")

    def _open(self) -> _Handles:
        inherited = self._handles
        if isinstance(inherited, _Handles) and inherited.file is not None:
            # a handle opened by the parent before fork: close this process's copy, never use it
            try:
                inherited.file.close()
            except Exception:  # noqa: BLE001 - the inherited state may be half torn down
                pass
        if self._offset is not None:
            try:
                data = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self._offset, shape=self.shape)
            except (OSError, ValueError) as exc:
                raise CorruptDataError(
                    f"{str(self.path)!r}: truncated or damaged ({exc}). Convert the source again."
                ) from exc
            return _Handles(None, data)
        # Whole chunks are read and kept decompressed in _ChunkCache, so HDF5's own chunk cache
        # would only hold a second copy of the same pixels: sized 0 (whole-chunk reads measured
        # as fast with it as with a 1- or 4-chunk cache).
        file = _open_file(self.path, rdcc_nbytes=0)
        if self.store == "encoded":
            return _Handles(file, file["blob"])
        data = file["images"]
        if self.chunk_images is None:
            return _Handles(file, _RowReader(data))
        return _Handles(file, _ChunkCache(data, self.chunk_images, self.cache_bytes))

    def _read(self, indices: np.ndarray) -> np.ndarray | list[np.ndarray]:
        data = self.handles.data
        try:
            if self.store == "raw":
                return data[indices]
            blobs = [data[self.offsets[i] : self.offsets[i + 1]] for i in indices.tolist()]
        except OSError as exc:
            raise CorruptDataError(
                f"{str(self.path)!r}: cannot read samples ({exc}). The file is damaged; convert the source again."
            ) from exc
        pixels = []
        for index, blob in zip(indices.tolist(), blobs):
            try:
                pixels.append(decode(blob.tobytes(), self.mode))
            except Exception as exc:
                raise CorruptDataError(
                    f"{str(self.path)!r}: sample {index} cannot be decoded ({exc}). "
                    f"Run 'fastdata verify {self.path}'."
                ) from exc
        return pixels


# --- verify -----------------------------------------------------------------------------


def userblock(digest: str) -> bytes:
    """The user block: a magic line with the checksum of every byte after it, zero-padded."""
    return (_USERBLOCK_MAGIC + digest.encode("ascii") + b"\n").ljust(USERBLOCK_BYTES, b"\x00")


def _hash_after_userblock(handle) -> str:
    digest = hashlib.blake2b(digest_size=32)
    handle.seek(USERBLOCK_BYTES)
    for block in iter(lambda: handle.read(_COPY_BYTES), b""):
        digest.update(block)
    handle.seek(0)
    return digest.hexdigest()


def verify_file(path: Path, manifest: dict[str, Any], *, deep: bool = False) -> list[str]:
    """The ``hdf5`` checks of ``fastdata verify``: the whole-file checksum in the user block,
    root attributes, every dataset's shape and content checksum (attribute and manifest), and
    objects the manifest does not list."""
    origin = repr(str(path))
    with open(path, "rb") as handle:
        recorded, digest = handle.read(USERBLOCK_BYTES), _hash_after_userblock(handle)
    problems = []
    if recorded != userblock(digest):
        stored = recorded[len(_USERBLOCK_MAGIC) :][:16].decode("ascii", "replace")
        problems.append(f"{origin}: the file's {CHECKSUM_ALGORITHM} {digest[:16]}... does not match the one in "
                        f"its user block ({stored}...): the file is damaged.")
    try:
        with _open_file(path) as file:
            problems += _foreign_links(file, origin)
            problems += _check_attributes(file, manifest, origin)
            listed = manifest["files"]
            for name, entry in listed.items():
                problems += _check_dataset(file, name, entry, origin, path.stat().st_size)
            problems += _check_shapes(file, manifest, origin)
            extra: list[str] = []
            file.visit(lambda name: extra.append(name) if name not in listed else None)
            problems += [f"{origin}: object {name!r} is not listed in the manifest." for name in extra]
    except FastdataError as exc:
        problems.append(str(exc))
    except _H5_ERRORS as exc:
        problems.append(f"{origin}: damaged HDF5 metadata ({type(exc).__name__}: {exc}).")
    return problems


def _check_attributes(file: h5py.File, manifest: dict[str, Any], origin: str) -> list[str]:
    problems = []
    classes = [c.decode() if isinstance(c, bytes) else str(c) for c in file.attrs.get("classes", [])]
    if classes != manifest["classes"]:
        problems.append(f"{origin}: 'classes' attribute {classes!r} differs from the manifest's {manifest['classes']!r}.")
    for name, expected in (("fastdata_format", FORMAT), ("layout_version", manifest["layout_version"])):
        found = file.attrs.get(name)
        found = found.decode() if isinstance(found, bytes) else found
        if found != expected:
            problems.append(f"{origin}: attribute {name!r} is {found!r}, expected {expected!r}.")
    return problems


def _foreign_links(file: h5py.File, origin: str, limit: int = 10_000) -> list[str]:
    """Links that lead out of the file (external) or elsewhere in it (soft): fastdata writes
    neither. Walked without following them; at most ``limit`` entries (a crafted file may loop)."""
    problems, pending, seen = [], [(file, "")], 0
    while pending and seen < limit:
        group, prefix = pending.pop()
        for key in group:
            seen += 1
            link = group.get(key, getlink=True)
            if not isinstance(link, h5py.HardLink):
                target = getattr(link, "filename", None) or getattr(link, "path", "")
                problems.append(f"{origin}: {prefix + key!r} is a {type(link).__name__} (to {target!r}); fastdata "
                                "reads only data stored inside the file itself.")
                continue
            child = group.get(key)
            if isinstance(child, h5py.Group) and prefix.count("/") < 32:
                pending.append((child, f"{prefix}{key}/"))
    return problems


def _check_dataset(file: h5py.File, name: str, entry: dict[str, Any], origin: str, file_size: int) -> list[str]:
    if file.get(name, getlink=True) is None:
        return [f"{origin}: dataset {name!r} is listed in the manifest but missing."]
    try:
        dataset = checked_dataset(file, name, str(origin).strip("'"), file_size, shape=None,
                                  contiguous=name != "images")
    except CorruptDataError as exc:
        return [str(exc)]
    attribute = dataset.attrs.get(CHECKSUM_ALGORITHM)
    if attribute != entry[CHECKSUM_ALGORITHM]:
        return [f"{origin}: dataset {name!r} has {CHECKSUM_ALGORITHM} attribute {attribute!r}, the manifest says "
                f"{entry[CHECKSUM_ALGORITHM]!r}."]
    content = _ContentHash()
    rows = max(1, _COPY_BYTES // max(dataset.dtype.itemsize * int(np.prod(dataset.shape[1:])), 1))
    try:
        for start in range(0, dataset.shape[0] if dataset.shape else 0, rows):
            content.update(dataset[start : start + rows])
    except _H5_ERRORS as exc:
        return [f"{origin}: dataset {name!r} cannot be read ({exc}); the file is truncated or damaged."]
    digest = content.digest.hexdigest()
    if content.bytes != entry["bytes"] or digest != entry[CHECKSUM_ALGORITHM]:
        return [f"{origin}: dataset {name!r}: {CHECKSUM_ALGORITHM} {digest[:16]}... ({content.bytes} bytes) does "
                f"not match the manifest's {entry[CHECKSUM_ALGORITHM][:16]}... ({entry['bytes']} bytes): damaged."]
    return []


def _check_shapes(file: h5py.File, manifest: dict[str, Any], origin: str) -> list[str]:
    count = manifest["count"]
    expected = {"labels": ((count,), np.int64)}
    if manifest["store"] == "raw":
        expected["images"] = ((count, *manifest["image"]["shape"]), np.uint8)
    else:
        expected["offsets"] = ((count + 1,), np.int64)
    problems = []
    for name, (shape, dtype) in expected.items():
        dataset = file.get(name)
        if isinstance(dataset, h5py.Dataset) and (dataset.shape != shape or dataset.dtype != dtype):
            problems.append(f"{origin}: dataset {name!r} holds {dataset.dtype} {dataset.shape}, expected "
                            f"{np.dtype(dtype)} {shape}.")
    return problems


register(
    FormatSpec(
        name=FORMAT,
        dataset=HDF5Dataset,
        writer=HDF5Writer,
        suffix=".h5",
        layout_version=LAYOUT_VERSION,
        options=HDF5Options,
        read_manifest=read_manifest,
        description="one HDF5 file (contiguous or chunked/compressed images, or encoded bytes)",
        verify=verify_file,
    )
)
