"""The ``npy`` format: memory-mapped numpy arrays in a directory.

raw:      images.npy (N, H, W, C) uint8, labels.npy (N,) int64, manifest.json
encoded:  data.bin (concatenated original bytes), offsets.npy (N + 1,) int64, labels.npy,
          manifest.json

Everything is readable without fastdata: ``np.load(path / "images.npy", mmap_mode="r", allow_pickle=False)``;
sample ``i`` of an encoded dataset is ``data[offsets[i]:offsets[i + 1]]``.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastdata.errors import CorruptDataError, CorruptManifestError
from fastdata.formats import FormatSpec, register
from fastdata.images import decode
from fastdata.manifest import (
    CHECKSUM_ALGORITHM, check_file_sizes, describe_file, load_small_array, open_manifest, write_manifest,
)
from fastdata.plan import Batch, Plan, Writer
from fastdata.reader import MapDataset

LAYOUT_VERSION = 1
FORMAT = "npy"


def _npy_header(shape: tuple[int, ...], length: int = 0) -> bytes:
    """A format-1.0 .npy header for a C-order uint8 array, padded to ``length`` bytes if given."""
    text = "{'descr': '|u1', 'fortran_order': False, 'shape': %r, }" % (tuple(shape),)
    total = max(length, -(-(len(text) + 11) // 64) * 64)
    text = text.ljust(total - 10 - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


class MemmapWriter(Writer):
    """Appends samples to the data file; labels (and encoded offsets) go to side files as they
    arrive, so a checkpoint is just file sizes and ``--resume`` can truncate back to it."""

    supports_resume = True

    def __init__(self, path: Path, plan: Plan, options: Any, *, state: dict[str, Any] | None = None):
        super().__init__(path, plan, options)
        self.raw = plan.store == "raw"
        self.header = _npy_header((plan.count, *plan.shape)) if self.raw else b""
        self.sample_bytes = int(np.prod(plan.shape)) if self.raw else 0
        data_name = "images.npy" if self.raw else "data.bin"
        if state is None:
            path.mkdir(parents=True)
            self.count, self.position = 0, len(self.header)
            self.data = open(path / data_name, "wb")
            self.data.write(self.header)
            # the data file's checksum, kept while writing (the main process waits on the
            # decoders anyway) instead of re-reading gigabytes at the end
            self.digest = hashlib.blake2b(self.header, digest_size=32)
            self.labels = open(path / "labels.partial", "wb")
            self.offsets = None if self.raw else open(path / "offsets.partial", "wb")
            if self.offsets:
                self.offsets.write(np.zeros(1, dtype=np.int64).tobytes())
        else:  # reopen the checkpointed files, dropping whatever was written after the checkpoint
            self.count, self.position = state["count"], state["data_bytes"]
            self.digest = None  # what came before the checkpoint is re-read at the end
            self.data = _reopen(path / data_name, self.position)
            self.labels = _reopen(path / "labels.partial", 8 * self.count)
            self.offsets = None if self.raw else _reopen(path / "offsets.partial", 8 * (self.count + 1))

    @classmethod
    def resume(cls, path: Path, plan: Plan, options: Any, state: dict[str, Any]) -> "MemmapWriter":
        return cls(path, plan, options, state=state)

    def write(self, batch: Batch) -> None:
        if not len(batch):
            return
        if self.raw:
            data = memoryview(np.ascontiguousarray(batch.images)).cast("B")
            self.position += len(batch) * self.sample_bytes
        else:
            sizes = np.fromiter((len(b) for b in batch.blobs), dtype=np.int64, count=len(batch))
            data = b"".join(batch.blobs)
            self.offsets.write((self.position + np.cumsum(sizes)).tobytes())
            self.position += int(sizes.sum())
        self.data.write(data)
        if self.digest is not None:
            self.digest.update(data)
        self.labels.write(batch.labels.astype(np.int64, copy=False).tobytes())
        self.count += len(batch)

    def _handles(self) -> list:
        return [h for h in (self.data, self.labels, self.offsets) if h is not None]

    def checkpoint(self) -> dict[str, Any]:
        for handle in self._handles():
            handle.flush()
            os.fsync(handle.fileno())
        return {"count": self.count, "data_bytes": self.position}

    def close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.raw and self.count != self.plan.count:
            # samples were skipped: the header promised more rows than were written
            self.data.seek(0)
            self.data.write(_npy_header((self.count, *self.plan.shape), len(self.header)))
            self.digest = None
        self.checkpoint()
        for handle in self._handles():
            handle.close()
        names = ["images.npy" if self.raw else "data.bin"]
        side_files = ["labels.partial"] if self.raw else ["offsets.partial", "labels.partial"]
        for side in side_files:
            final = side.replace(".partial", ".npy")
            np.save(self.path / final, np.fromfile(self.path / side, dtype=np.int64))
            (self.path / side).unlink()
            names.append(final)
        manifest["files"] = {name: describe_file(self.path / name) for name in names[1:]}
        data_file = self.path / names[0]
        manifest["files"][names[0]] = (
            {"bytes": self.position, CHECKSUM_ALGORITHM: self.digest.hexdigest()}
            if self.digest is not None else describe_file(data_file)
        )
        manifest["files"] = {name: manifest["files"][name] for name in names}  # data file first
        write_manifest(self.path, manifest)
        return manifest

    def abort(self) -> None:
        for handle in self._handles():
            handle.close()


def _reopen(file: Path, size: int):
    handle = open(file, "r+b")
    handle.truncate(size)
    handle.seek(size)
    return handle


class MemmapDataset(MapDataset):
    """Reader of the ``npy`` format (map-style; random access; batched reads).

    >>> ds = MemmapDataset("out/cifar.npy")
    >>> image, label = ds[0]            # uint8 tensor (C, H, W), int
    >>> images, labels = ds[[3, 1, 2]]  # uint8 (3, C, H, W), int64 (3,)
    """

    def __init__(
        self,
        path: str | os.PathLike,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        *,
        image_format: str = "tensor",
        batch_transform: Callable | None = None,
    ):
        super().__init__(
            transform=transform, target_transform=target_transform,
            image_format=image_format, batch_transform=batch_transform,
        )
        self.path = Path(path)
        manifest = open_manifest(self.path, FORMAT)
        required = ["images.npy", "labels.npy"] if manifest["store"] == "raw" else ["data.bin", "offsets.npy", "labels.npy"]
        missing = [name for name in required if name not in manifest["files"]]
        if missing:
            raise CorruptManifestError(
                f"{str(self.path / 'manifest.json')!r} does not list {missing[0]!r}, which an npy "
                f"{manifest['store']} dataset needs. Run 'fastdata verify {self.path}' or convert the source again."
            )
        check_file_sizes(self.path, manifest)
        self.manifest = manifest
        self.store = manifest["store"]
        self.mode = manifest["image"]["mode"]
        self._set_classes(manifest)
        count = manifest["count"]
        self.labels = load_small_array(self.path / "labels.npy", dtype=np.int64, length=count)
        self.offsets = None
        if self.store == "encoded":
            self.offsets = load_small_array(self.path / "offsets.npy", dtype=np.int64, length=count + 1)
            size = manifest["files"]["data.bin"]["bytes"]
            if self.offsets[0] != 0 or np.any(np.diff(self.offsets) < 0) or self.offsets[-1] != size:
                raise CorruptDataError(
                    f"{str(self.path / 'offsets.npy')!r}: offsets must rise from 0 to the size of data.bin "
                    f"({size}); they run from {int(self.offsets[0])} to {int(self.offsets[-1])}. "
                    f"Run 'fastdata verify {self.path}' or convert the source again."
                )

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
        return array

    def _read(self, indices: np.ndarray) -> np.ndarray | list[np.ndarray]:
        if self.store == "raw":
            return self.handles[indices]
        data, offsets = self.handles, self.offsets
        pixels = []
        for index in indices.tolist():
            blob = data[offsets[index] : offsets[index + 1]].tobytes()
            try:
                pixels.append(decode(blob, self.mode))
            except Exception as exc:
                raise CorruptDataError(
                    f"{str(self.path / 'data.bin')!r}: sample {index} cannot be decoded ({exc}). "
                    f"Run 'fastdata verify {self.path}'."
                ) from exc
        return pixels


def verify_files(path: Path, manifest: dict[str, Any], *, deep: bool = False) -> list[str]:
    """The ``npy`` checks of ``fastdata verify``: array headers and encoded offsets."""
    count, raw = manifest["count"], manifest["store"] == "raw"
    expected = {"labels.npy": ((count,), np.int64)}
    if raw:
        expected["images.npy"] = ((count, *manifest["image"]["shape"]), np.uint8)
    else:
        expected["offsets.npy"] = ((count + 1,), np.int64)
    problems, arrays = [], {}
    for name, (shape, dtype) in expected.items():
        try:
            arrays[name] = array = np.load(path / name, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            problems.append(f"{str(path / name)!r}: not a readable .npy array ({exc}).")
            continue
        if array.shape != shape or array.dtype != dtype:
            problems.append(f"{str(path / name)!r}: holds {array.dtype} {array.shape}, expected {np.dtype(dtype)} {shape}.")
    offsets = arrays.get("offsets.npy")
    if offsets is not None and offsets.shape == (count + 1,):
        size = (path / "data.bin").stat().st_size if (path / "data.bin").is_file() else None
        if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or (size is not None and offsets[-1] != size):
            problems.append(
                f"{str(path / 'offsets.npy')!r}: offsets must rise from 0 to the size of data.bin ({size}); "
                f"they run from {int(offsets[0])} to {int(offsets[-1])}."
            )
    return problems


register(
    FormatSpec(
        name=FORMAT,
        dataset=MemmapDataset,
        writer=MemmapWriter,
        suffix=".npy",
        layout_version=LAYOUT_VERSION,
        description="memory-mapped numpy arrays in a directory",
        verify=verify_files,
    )
)
