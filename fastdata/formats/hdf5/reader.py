"""The ``hdf5`` reader: :class:`HDF5Dataset` (map-style, random access, batched reads)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np

from fastdata.errors import CorruptDataError, FastdataError, InvalidOptionError, ManifestError
from fastdata.fields import Schema
from fastdata.formats.hdf5.layout import FORMAT, H5_ERRORS, MANIFEST_ATTR, field_datasets, open_file
from fastdata.formats.hdf5.options import PLUGIN_CODECS, import_hdf5plugin
from fastdata.formats.hdf5.storage import ChunkCache, RowReader, checked_dataset, memmap_offset, read_manifest, read_small
from fastdata.formats.fieldfiles import check_offsets
from fastdata.reader.options import ReaderOptions, allocated
from fastdata.formats.dataset import StoredDataset
from fastdata.urls import is_url

DEFAULT_CACHE_BYTES = 8 << 20  # decompressed chunks kept per process by HDF5Dataset (2 windows)


@dataclass
class _Handles:
    file: h5py.File | None
    data: Any  # an ndarray view of an np.memmap, ChunkCache, RowReader or h5py.Dataset (encoded blob)


@dataclass(frozen=True)
class HDF5ReaderOptions(ReaderOptions):
    """:class:`~fastdata.reader.ReaderOptions` and the HDF5 reader's own: ``cache_bytes`` bounds
    the decompressed chunks kept per process; ``use_memmap=False`` reads contiguous data through
    h5py instead of memory-mapping it."""

    cache_bytes: int = DEFAULT_CACHE_BYTES
    use_memmap: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.cache_bytes, bool) or not isinstance(self.cache_bytes, int) or self.cache_bytes < 0:
            raise InvalidOptionError(f"Invalid cache_bytes {self.cache_bytes!r}. Use a byte count >= 0.")


class HDF5Dataset(StoredDataset):
    """Reader of the ``hdf5`` format (map-style; random access; batched reads).

    >>> ds = HDF5Dataset("out/cifar.h5")
    >>> image, label = ds[0]            # uint8 tensor (C, H, W), int
    >>> images, labels = ds[[3, 1, 2]]  # uint8 (3, C, H, W), int64 (3,)

    The file is opened lazily in each process (never shared across fork). ``cache_bytes``
    bounds the decompressed chunks kept per process; ``use_memmap=False`` reads contiguous
    data through h5py instead of memory-mapping it. ``batch_transform`` takes image tensors
    [B, C, H, W] on every path: each batch from ``ds[indices]``/``fastdata.loader``, each image as
    a batch of one from ``ds[i]`` and a plain ``DataLoader`` (see :class:`fastdata.reader.ReaderOptions`).
    """

    format_name = FORMAT
    required_files = {"raw": ("images", "labels"), "encoded": ("blob", "offsets", "labels")}

    Options = HDF5ReaderOptions

    def __init__(self, path: str | os.PathLike, transform: Callable | None = None,
                 target_transform: Callable | None = None, **options: Any):
        if not is_url(path):  # a URL is fetched into the cache by StoredDataset
            path = Path(path)
        if isinstance(path, Path) and path.is_file() and read_manifest(path) is None:
            open_file(path).close()  # a damaged file fails here with CorruptDataError
            raise ManifestError(
                f"{str(path)!r} is not an HDF5 dataset written by 'fastdata convert' (no "
                f"{MANIFEST_ATTR!r} attribute of format {FORMAT!r}). Use fastdata.open_dataset(path)."
            )
        super().__init__(path, transform, target_transform, **options)

    @property
    def cache_bytes(self) -> int:
        return self.options.cache_bytes

    @property
    def use_memmap(self) -> bool:
        return self.options.use_memmap

    def _load(self) -> None:
        self.chunk_images: int | None = None
        self._offset: int | None = None
        with open_file(self.path) as file:
            try:
                self._describe(file)
            except FastdataError:
                raise
            except H5_ERRORS as exc:
                raise CorruptDataError(
                    f"{str(self.path)!r}: damaged HDF5 metadata ({type(exc).__name__}: {exc}). "
                    f"Run 'fastdata verify {self.path}' or convert the source again."
                ) from exc

    def _describe(self, file: h5py.File) -> None:
        """Every dataset is checked (:func:`checked_dataset`) and its shape compared with the
        manifest before anything is read from it."""
        count, origin, size = self.manifest["count"], str(self.path), self.path.stat().st_size
        self.labels = read_small(checked_dataset(file, "labels", origin, size, shape=(count,), contiguous=True))
        if self.store == "raw":
            shape = (count, *self.manifest["image"]["shape"])
            data = checked_dataset(file, "images", origin, size, shape=shape, dtype=np.uint8)
            self.chunk_images = data.chunks[0] if data.chunks else None
            self._check_plugin()
        else:
            offsets = checked_dataset(file, "offsets", origin, size, shape=(count + 1,), contiguous=True)
            self.offsets = read_small(offsets)
            data = checked_dataset(file, "blob", origin, size, shape=None, contiguous=True, dtype=np.uint8)
            if len(data.shape) != 1 or self.offsets[0] != 0 or np.any(np.diff(self.offsets) < 0) \
                    or self.offsets[-1] != data.shape[0]:
                raise CorruptDataError(
                    f"{origin!r}: offsets must rise from 0 to the blob's size ({data.shape}); they run from "
                    f"{int(self.offsets[0])} to {int(self.offsets[-1])}. The file is damaged; "
                    f"run 'fastdata verify {self.path}' or convert the source again."
                )
        self.shape = tuple(data.shape)
        self._offset = memmap_offset(data) if self.use_memmap else None
        self._field_layout = {}
        extras = Schema.from_json(self.manifest["fields"]).extras if "fields" in self.manifest else []
        for f in extras:  # the image and label fields are stored as always
            names = field_datasets(f)
            expected = [(None, np.uint8), ((count + 1,), np.int64)] if f.variable else \
                [((count, *f.shape), np.dtype(f.dtype))]
            for dataset_name, (want_shape, want_dtype) in zip(names, expected):
                if dataset_name not in self.manifest["files"]:
                    raise CorruptDataError(f"{origin!r}: the manifest lists no dataset {dataset_name!r} of field "
                                           f"{f.name!r}. Run 'fastdata verify {self.path}' or convert the source again.")
                found = checked_dataset(file, dataset_name, origin, size, shape=want_shape, contiguous=True,
                                        dtype=want_dtype)
                offset = found.id.get_offset() if found.size else None
                self._field_layout[dataset_name] = (offset, tuple(found.shape), found.dtype.str)
                if dataset_name.endswith(".offsets"):
                    offsets = read_small(found)
                    data_shape = self._field_layout[names[0]][1]
                    check_offsets(offsets, count, data_shape[0] if data_shape else -1, origin, names[0])
                    self._field_layout[dataset_name] = offsets

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_field_maps", None)  # this process's mappings of the field data: never pickled (workers map their own)
        return state

    def _field_values(self, f: Any, indices: np.ndarray) -> Any:
        maps = self.__dict__.get("_field_maps")
        if maps is None or maps[0] != os.getpid():
            maps = self._field_maps = (os.getpid(), {})
        name = field_datasets(f)[0]
        data = maps[1].get(name)
        if data is None:
            offset, shape, dtype = self._field_layout[name]
            data = np.memmap(self.path, dtype=dtype, mode="r", offset=offset, shape=shape).view(np.ndarray) \
                if offset is not None else np.empty(shape, dtype)
            maps[1][name] = data
        if not f.variable:
            return data[indices]
        offsets = self._field_layout[field_datasets(f)[1]]
        return [data[offsets[i]:offsets[i + 1]].tobytes() for i in indices.tolist()]

    def _check_plugin(self) -> None:
        compression = (self.manifest.get("hdf5") or {}).get("compression") or ""
        if compression.partition(":")[0] in PLUGIN_CODECS:
            import_hdf5plugin(f"reading {str(self.path)!r} (compression {compression!r})")

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
            return _Handles(None, data.view(np.ndarray))  # the mapping stays open through the view
        # Whole chunks are read and kept decompressed in ChunkCache, so HDF5's own chunk cache
        # would only hold a second copy of the same pixels: sized 0 (whole-chunk reads measured
        # as fast with it as with a 1- or 4-chunk cache).
        file = open_file(self.path, rdcc_nbytes=0)
        if self.store == "encoded":
            return _Handles(file, file["blob"])
        data = file["images"]
        if self.chunk_images is None:
            return _Handles(file, RowReader(data))
        return _Handles(file, ChunkCache(data, self.chunk_images, self.cache_bytes))

    def encoded_sizes(self) -> np.ndarray | None:
        return np.diff(self.offsets) if self.store == "encoded" else None

    def _encoded(self, indices: np.ndarray) -> list[bytes]:
        data = self.handles.data
        try:
            return [np.asarray(data[self.offsets[i] : self.offsets[i + 1]]).tobytes() for i in indices.tolist()]
        except OSError as exc:
            raise CorruptDataError(
                f"{str(self.path)!r}: cannot read samples ({exc}). The file is damaged; convert the source again."
            ) from exc

    def _read(self, indices: np.ndarray, allocate: Callable | None = None, *, pil: bool = False,
              draws: list | None = None) -> Any:
        data = self.handles.data
        try:
            if self.store == "raw":
                out = allocated(allocate, (len(indices), *self.shape[1:]))
                if isinstance(data, np.ndarray):  # memory-mapped
                    return data.take(indices, axis=0, out=out, mode="clip")  # in range: checked
                return data.read(indices, out)
            rows = indices.tolist()
            blobs = [data[self.offsets[i] : self.offsets[i + 1]] for i in rows]
        except OSError as exc:
            raise CorruptDataError(
                f"{str(self.path)!r}: cannot read samples ({exc}). The file is damaged; convert the source again."
            ) from exc
        where = repr(str(self.path))
        return self.decoder.decode_all(blobs, lambda row: f"{where} sample {rows[row]}", self.path, pil=pil,
                                       allocate=allocate, indices=rows, epoch=self.epoch_of(indices), draws=draws)
