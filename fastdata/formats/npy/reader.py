"""The ``npy`` reader: :class:`MemmapDataset` (map-style, random access, batched reads)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fastdata.errors import CorruptDataError
from fastdata.formats.fieldfiles import FieldColumns
from fastdata.manifest import check_file_sizes, load_small_array
from fastdata.reader.options import allocated
from fastdata.formats.dataset import StoredDataset


class MemmapDataset(StoredDataset):
    """Reader of the ``npy`` format (map-style; random access; batched reads).

    >>> ds = MemmapDataset("out/cifar.npy")
    >>> image, label = ds[0]            # uint8 tensor (C, H, W), int
    >>> images, labels = ds[[3, 1, 2]]  # uint8 (3, C, H, W), int64 (3,)

    ``transform``/``target_transform`` apply per sample; ``batch_transform`` to image tensors
    [B, C, H, W] on every path: each batch from ``ds[indices]``/``fastdata.loader``, each image as
    a batch of one from ``ds[i]`` and a plain ``DataLoader`` (see :class:`fastdata.reader.ReaderOptions`).
    """

    format_name = "npy"
    required_files = {"raw": ("images.npy", "labels.npy"), "encoded": ("data.bin", "offsets.npy", "labels.npy")}

    def _load(self) -> None:
        check_file_sizes(self.path, self.manifest)
        count = self.manifest["count"]
        self.labels = load_small_array(self.path / "labels.npy", dtype=np.int64, length=count)
        self.offsets = None
        if self.store == "encoded":
            self.offsets = load_small_array(self.path / "offsets.npy", dtype=np.int64, length=count + 1)
            size = self.manifest["files"]["data.bin"]["bytes"]
            if self.offsets[0] != 0 or np.any(np.diff(self.offsets) < 0) or self.offsets[-1] != size:
                raise CorruptDataError(
                    f"{str(self.path / 'offsets.npy')!r}: offsets must rise from 0 to the size of data.bin "
                    f"({size}); they run from {int(self.offsets[0])} to {int(self.offsets[-1])}. "
                    f"Run 'fastdata verify {self.path}' or convert the source again."
                )

    def _field_values(self, f: Any, indices: np.ndarray) -> Any:
        columns = self.__dict__.setdefault("_columns", {})
        if f.name not in columns:
            columns[f.name] = FieldColumns(self.path, f, self.manifest["count"])
        return columns[f.name].values(indices)

    def _open(self) -> np.ndarray:
        name = "images.npy" if self.store == "raw" else "data.bin"
        file = self.path / name
        check_file_sizes(self.path, {"files": {name: self.manifest["files"][name]}})  # again, in this process
        try:
            if self.store == "raw":
                array = np.load(file, mmap_mode="r", allow_pickle=False)
                expected = (self.manifest["count"], *self.manifest["image"]["shape"])
            else:
                array = np.memmap(file, dtype=np.uint8, mode="r") if file.stat().st_size else np.empty(0, np.uint8)
                expected = (int(self.offsets[-1]),)
        except (OSError, ValueError) as exc:
            raise CorruptDataError(
                f"{str(file)!r}: truncated or damaged ({exc}). Run 'fastdata verify {self.path}' "
                "or convert the source again."
            ) from exc
        if tuple(array.shape) != tuple(expected) or array.dtype != np.uint8:
            raise CorruptDataError(
                f"{str(file)!r} holds {array.dtype} {tuple(array.shape)} but the manifest says uint8 {tuple(expected)}. "
                f"Run 'fastdata verify {self.path}' or convert the source again."
            )
        return array.view(np.ndarray)  # the mapping stays open through the view; no memmap subclass per batch

    def encoded_sizes(self) -> np.ndarray | None:
        return np.diff(self.offsets) if self.offsets is not None else None

    def _encoded(self, indices: np.ndarray) -> list[bytes]:
        data, offsets = self.handles, self.offsets
        return [data[offsets[i] : offsets[i + 1]].tobytes() for i in indices.tolist()]

    def _read(self, indices: np.ndarray, allocate: Callable | None = None, *, pil: bool = False,
              draws: list | None = None) -> Any:
        if self.store == "raw":
            images = self.handles
            out = allocated(allocate, (len(indices), *images.shape[1:]))
            # indices are in range (MapDataset checked them); mode="raise" would buffer the whole copy
            return images.take(indices, axis=0, out=out, mode="clip")
        data, offsets, rows = self.handles, self.offsets, indices.tolist()
        where = repr(str(self.path / "data.bin"))
        return self.decoder.decode_all((data[offsets[i] : offsets[i + 1]] for i in rows),
                                       lambda row: f"{where} sample {rows[row]}", self.path, pil=pil, allocate=allocate,
                                       indices=rows, epoch=self.epoch_of(indices), draws=draws)
