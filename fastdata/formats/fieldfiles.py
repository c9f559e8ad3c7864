"""The files of extra fields (:mod:`fastdata.fields`) in a directory: ``fields/<name>.npy``
(N, *shape) for fixed-shape fields; ``fields/<name>.bin`` + ``fields/<name>.offsets.npy``
(int64, N + 1) for variable ones. Written by the ``npy`` writer in place and by the ``hdf5``
writer as temporary files it copies into datasets; read back by :class:`FieldColumns`.

Every file is plain numpy: ``np.load("fields/boxes.offsets.npy", allow_pickle=False)`` and
``np.fromfile("fields/boxes.bin", "<f4")[o[i] // 4 : o[i + 1] // 4].reshape(-1, 4)`` give sample
``i``'s boxes without fastdata.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.errors import CorruptDataError
from fastdata.fields import Field
from fastdata.formats.npyfile import npy_header

FIELDS_DIR = "fields"


def descr(f: Field) -> str:
    return np.lib.format.dtype_to_descr(np.dtype(f.dtype).newbyteorder("<") if np.dtype(f.dtype).itemsize > 1
                                        else np.dtype(f.dtype))


def field_files(f: Field) -> list[str]:
    """The names (relative to the dataset directory) of one field's files, data file first."""
    if f.variable:
        return [f"{FIELDS_DIR}/{f.name}.bin", f"{FIELDS_DIR}/{f.name}.offsets.npy"]
    return [f"{FIELDS_DIR}/{f.name}.npy"]


class FieldFileWriter:
    """Appends one field's stored bytes; a checkpoint is the data size and sample count."""

    def __init__(self, directory: Path, f: Field, count: int, *, state: dict[str, Any] | None = None):
        self.field, self.directory = f, directory
        folder = directory / FIELDS_DIR
        folder.mkdir(exist_ok=True)
        self.planned = count
        names = field_files(f)
        self.data_path = directory / names[0]
        if f.variable:
            self.header = b""
            self.offsets_path = directory / (names[1].replace(".npy", ".partial"))
        else:
            self.header = npy_header((count, *f.shape), descr=descr(f))
            self.offsets_path = None
        self.offsets = None
        if state is None:
            self.count, self.position = 0, len(self.header)
            self.data = open(self.data_path, "wb")
            self.data.write(self.header)
        else:
            self.count, self.position = state["count"], state["bytes"]
            self.data = reopen(self.data_path, self.position)
        try:
            if self.offsets_path and state is None:
                self.offsets = open(self.offsets_path, "wb")
                self.offsets.write(np.zeros(1, dtype=np.int64).tobytes())
            elif self.offsets_path:
                self.offsets = reopen(self.offsets_path, 8 * (self.count + 1))
        except BaseException:
            self.data.close()
            raise

    def write(self, values: list[bytes]) -> None:
        if not values:
            return
        data = b"".join(values)
        if self.offsets is not None:
            sizes = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
            self.offsets.write((self.position - len(self.header) + np.cumsum(sizes)).tobytes())
        elif len(data) != len(values) * self.field.row_bytes:
            raise AssertionError(f"field {self.field.name!r}: rows of the wrong size")
        self.data.write(data)
        self.position += len(data)
        self.count += len(values)

    def checkpoint(self) -> dict[str, Any]:
        for handle in (self.data, self.offsets):
            if handle is not None:
                handle.flush()
                os.fsync(handle.fileno())
        return {"count": self.count, "bytes": self.position}

    def close(self) -> list[str]:
        """Finish the files; their names."""
        if self.offsets is None and self.count != self.planned:
            self.data.seek(0)
            self.data.write(npy_header((self.count, *self.field.shape), len(self.header), descr=descr(self.field)))
        self.checkpoint()
        self.data.close()
        if self.offsets is not None:
            self.offsets.close()
            final = self.directory / field_files(self.field)[1]
            np.save(final, np.fromfile(self.offsets_path, dtype=np.int64))
            self.offsets_path.unlink()
        return field_files(self.field)

    def abort(self) -> None:
        for handle in (self.data, self.offsets):
            if handle is not None:
                handle.close()


class FieldColumns:
    """One field's stored values in a dataset directory, memory-mapped: ``values(indices)``
    gives each sample's stored bytes (variable fields) or the rows (fixed fields)."""

    def __init__(self, directory: Path, f: Field, count: int):
        self.field, self.directory, self.count = f, directory, count
        names = field_files(f)
        self.data_path = directory / names[0]
        self.offsets = None
        if f.variable:
            offsets_path = directory / names[1]
            try:
                offsets = np.load(offsets_path, allow_pickle=False)
            except (OSError, ValueError, EOFError) as exc:
                raise CorruptDataError(f"{str(offsets_path)!r}: not a readable .npy array ({exc}). "
                                       "Run 'fastdata verify' or convert the source again.") from exc
            size = self.data_path.stat().st_size if self.data_path.is_file() else -1
            check_offsets(offsets, count, size, str(offsets_path), f"{names[0]}")
            self.offsets = offsets
        self._data = None
        self._pid = None

    @property
    def data(self) -> np.ndarray:
        if self._pid != os.getpid():
            try:
                if self.field.variable:
                    self._data = (np.memmap(self.data_path, dtype=np.uint8, mode="r").view(np.ndarray)
                                  if self.data_path.stat().st_size else np.empty(0, np.uint8))
                else:
                    self._data = np.load(self.data_path, mmap_mode="r", allow_pickle=False)
                    expected = (self.count, *self.field.shape)
                    if self._data.shape != expected or self._data.dtype != np.dtype(self.field.dtype):
                        raise CorruptDataError(
                            f"{str(self.data_path)!r} holds {self._data.dtype} {self._data.shape} but the manifest "
                            f"says {self.field.dtype} {expected}. Run 'fastdata verify' or convert the source again.")
            except (OSError, ValueError) as exc:
                raise CorruptDataError(f"{str(self.data_path)!r}: truncated or damaged ({exc}). "
                                       "Run 'fastdata verify' or convert the source again.") from exc
            self._pid = os.getpid()
        return self._data

    def values(self, indices: np.ndarray) -> Any:
        data = self.data
        if self.offsets is None:
            return data[indices]  # one read for the whole batch
        offsets = self.offsets
        return [data[offsets[i]:offsets[i + 1]].tobytes() for i in indices.tolist()]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_data"], state["_pid"] = None, None
        return state


def check_offsets(offsets: np.ndarray, count: int, size: int, where: str, data_name: str) -> None:
    if offsets.shape != (count + 1,) or offsets.dtype != np.int64 or (count + 1 and (
            offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != size)):
        first = int(offsets[0]) if offsets.size else None
        last = int(offsets[-1]) if offsets.size else None
        raise CorruptDataError(
            f"{where!r}: offsets must be {count + 1} int64 values rising from 0 to the size of {data_name} ({size}); "
            f"they are {offsets.dtype} {offsets.shape} from {first} to {last}. Run 'fastdata verify' or convert the "
            "source again."
        )


def reopen(file: Path, size: int):
    """A resumed conversion's partial file, open to append at ``size`` bytes (what its checkpoint
    recorded; anything written after that is cut off)."""
    handle = open(file, "r+b")
    handle.truncate(size)
    handle.seek(size)
    return handle
