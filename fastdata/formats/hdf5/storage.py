"""Reading an ``hdf5`` file safely: the manifest attribute, every dataset checked before use
(:func:`checked_dataset`: nothing stored outside the file, nothing the file's size does not
bound), and the two read strategies: a memory map of contiguous data, whole chunks kept in a
small per-process cache for chunked data."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from fastdata.errors import CorruptDataError, CorruptManifestError, FastdataError
from fastdata.formats.hdf5.layout import (
    FORMAT, H5_ERRORS, HDF5_SIGNATURE, LAYOUT_VERSION, MANIFEST_ATTR, MAX_MANIFEST_BYTES, USERBLOCK_BYTES, open_file,
)
from fastdata.manifest import check_layout_version, parse_manifest


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of an ``hdf5`` dataset, or None when ``path`` is not one.

    Every read is bounded by the file's size: the manifest is a contiguous uint8 dataset whose
    offset and length are checked against the file before its bytes are read with plain file
    I/O, and only fixed-size attributes are ever read (a variable-length one lives in HDF5's
    global heap, where one damaged object size makes h5py spin forever, beyond any signal).
    A layout-1 file (manifest in a variable-length attribute) is refused by its version, read
    from a fixed-size attribute, without touching that attribute.
    """
    if not path.is_file():
        return None
    with open(path, "rb") as handle:
        head = handle.read(USERBLOCK_BYTES + len(HDF5_SIGNATURE))
    if HDF5_SIGNATURE not in (head[: len(HDF5_SIGNATURE)], head[USERBLOCK_BYTES:]):
        return None
    origin = repr(str(path))
    with open_file(path) as file:
        try:
            if file.get(MANIFEST_ATTR, getlink=True) is None:
                return _older_layout(file, origin)
            offset, size = _manifest_extent(file, origin, path.stat().st_size)
        except FastdataError:
            raise
        except H5_ERRORS as exc:
            raise CorruptManifestError(
                f"{origin}: cannot read the {MANIFEST_ATTR!r} dataset ({type(exc).__name__}: {exc}). The file is "
                "damaged; convert the source again."
            ) from exc
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(size)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptManifestError(f"{origin}: the manifest is not valid UTF-8 (byte {exc.start}). The file is "
                                   "damaged; convert the source again.") from exc
    manifest = parse_manifest(text, origin)
    return manifest if manifest.get("format") == FORMAT else None


def _manifest_extent(file: h5py.File, origin: str, file_size: int) -> tuple[int, int]:
    """(offset, length) of the manifest's bytes, checked to lie inside the file."""
    dataset = checked_dataset(file, MANIFEST_ATTR, origin.strip("'"), file_size, shape=None, contiguous=True,
                              dtype=np.uint8)
    offset = memmap_offset(dataset)
    if dataset.ndim != 1 or offset is None or not 0 < dataset.size <= MAX_MANIFEST_BYTES:
        raise CorruptManifestError(f"{origin}: the {MANIFEST_ATTR!r} dataset holds {dataset.dtype} {dataset.shape}, "
                                   "not the manifest's bytes; the file is damaged. Convert the source again.")
    return offset, int(dataset.size)


def _older_layout(file: h5py.File, origin: str) -> None:
    """None for an HDF5 file fastdata did not write; a layout-1 dataset is refused by version."""
    if MANIFEST_ATTR not in file.attrs:  # names only: the attribute itself is never read
        return None
    version = read_attribute(file, "layout_version", origin)
    check_layout_version({"format": FORMAT, "layout_version": version}, LAYOUT_VERSION, origin)
    return None  # unreachable: no layout stores the manifest as an attribute any more


def read_attribute(node: h5py.HLObject, name: str, origin: str) -> Any:
    """Attribute ``name`` of ``node`` (None when absent), read only when its type has a fixed
    size: a variable-length value is in HDF5's global heap, whose damaged sizes can hang the
    read. Fixed-length strings come back as ``str``."""
    if name not in node.attrs:
        return None
    attribute = h5py.h5a.open(node.id, name.encode("utf-8"))
    kind = attribute.get_type()
    if kind.get_class() == h5py.h5t.VLEN or (isinstance(kind, h5py.h5t.TypeStringID) and kind.is_variable_str()):
        raise CorruptDataError(f"{origin}: attribute {name!r} has a variable-length type, which fastdata does not "
                               "write or read; the file is damaged or was not written by fastdata.")
    value = node.attrs[name]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.dtype.kind == "S":
        return [item.decode("utf-8", "replace") for item in value.tolist()]
    return value.item() if isinstance(value, np.generic) else value


# filters fastdata writes (and HDF5's own checksum filters); any other is refused
KNOWN_FILTERS = {1: "gzip", 2: "shuffle", 3: "fletcher32", 32000: "lzf", 32001: "blosc", 32004: "lz4", 32015: "zstd"}
_MAX_CHUNK_BYTES = (1 << 32) - 1  # HDF5's own limit on one chunk


def checked_dataset(file: h5py.File, name: str, origin: str, file_size: int, *, shape: tuple[int, ...] | None,
                    contiguous: bool = False, dtype: Any = None) -> h5py.Dataset:
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
    wrong_dtype = dataset.dtype.kind not in "iu" if dtype is None else dataset.dtype != np.dtype(dtype)
    if wrong_dtype or (shape is not None and dataset.shape != shape):
        expected = " ".join(part for part in (str(np.dtype(dtype)) if dtype is not None else "",
                                              f"shape {shape}" if shape is not None else "") if part) or "integers"
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


def read_small(dataset: h5py.Dataset) -> np.ndarray:
    """A checked, contiguous 1-D dataset (labels, offsets) as int64."""
    if dataset.ndim != 1:
        raise CorruptDataError(f"dataset {dataset.name!r} has shape {dataset.shape}, expected one dimension; "
                               "the file is damaged. Convert the source again.")
    return np.asarray(dataset[()], dtype=np.int64)


def memmap_offset(dataset: h5py.Dataset) -> int | None:
    """The file offset of a contiguous, unfiltered uint8 dataset, or None if it cannot be mapped."""
    plain = dataset.chunks is None and dataset.compression is None and not dataset._filters
    if not plain or dataset.external or dataset.dtype != np.uint8 or dataset.size == 0:
        return None
    return dataset.id.get_offset()


class ChunkCache:
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

    def read(self, indices: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Rows ``indices`` into ``out``, each chunk decompressed at most once."""
        numbers = indices // self.rows
        for number in np.unique(numbers).tolist():
            where = np.flatnonzero(numbers == number)
            out[where] = self.chunk(number)[indices[where] - number * self.rows]
        return out


class RowReader:
    """Contiguous data read through h5py (when it cannot be memory-mapped): one sorted,
    de-duplicated selection per batch -- a slice when the rows are consecutive."""

    def __init__(self, dataset: h5py.Dataset):
        self.dataset = dataset

    def read(self, indices: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Rows ``indices`` into ``out``."""
        unique, inverse = np.unique(indices, return_inverse=True)
        if not len(unique):
            return out
        if unique[-1] - unique[0] + 1 == len(unique):
            rows = self.dataset[int(unique[0]) : int(unique[-1]) + 1]
        else:
            rows = self.dataset[unique]
        return np.take(rows, inverse.reshape(-1), axis=0, out=out, mode="clip")  # "raise" would buffer
