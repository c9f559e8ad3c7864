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

from fastdata.errors import CorruptDataError, CorruptManifestError
from fastdata.formats.hdf5.layout import (
    FORMAT, H5_ERRORS, HDF5_SIGNATURE, MANIFEST_ATTR, USERBLOCK_BYTES, open_file,
)
from fastdata.manifest import parse_manifest


def read_manifest(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    with open(path, "rb") as handle:
        head = handle.read(USERBLOCK_BYTES + len(HDF5_SIGNATURE))
    if HDF5_SIGNATURE not in (head[: len(HDF5_SIGNATURE)], head[USERBLOCK_BYTES:]):
        return None
    with open_file(path) as file:
        try:
            text = file.attrs.get(MANIFEST_ATTR)
            if text is not None:
                text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
                text.encode("utf-8")  # a damaged attribute may decode to unpaired surrogates
        except (*H5_ERRORS, UnicodeError) as exc:
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
