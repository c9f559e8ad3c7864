"""The ``npy`` format: memory-mapped numpy arrays in a directory.

raw:      images.npy (N, H, W, C) uint8, labels.npy (N,) int64, manifest.json
encoded:  data.bin (concatenated original bytes), offsets.npy (N + 1,) int64, labels.npy,
          manifest.json

Everything is readable without fastdata: ``np.load(path / "images.npy", mmap_mode="r")``;
sample ``i`` of an encoded dataset is ``data[offsets[i]:offsets[i + 1]]``.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastdata.errors import CorruptDataError, ManifestError
from fastdata.formats import FormatSpec, register
from fastdata.images import decode
from fastdata.manifest import MANIFEST_NAME, check_layout_version, describe_file, read_manifest_file, write_manifest
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
    def __init__(self, path: Path, plan: Plan, options: Any):
        super().__init__(path, plan, options)
        path.mkdir(parents=True)
        self.count = 0
        self.labels: list[np.ndarray] = []
        if plan.store == "raw":
            self.header = _npy_header((plan.count, *plan.shape))
            self.data = open(path / "images.npy", "wb")
            self.data.write(self.header)
        else:
            self.data = open(path / "data.bin", "wb")
            self.offsets = [np.zeros(1, dtype=np.int64)]
            self.position = 0

    def write(self, batch: Batch) -> None:
        if not len(batch):
            return
        if self.plan.store == "raw":
            self.data.write(memoryview(np.ascontiguousarray(batch.images)).cast("B"))
        else:
            sizes = np.fromiter((len(b) for b in batch.blobs), dtype=np.int64, count=len(batch))
            self.data.write(b"".join(batch.blobs))
            self.offsets.append(self.position + np.cumsum(sizes))
            self.position += int(sizes.sum())
        self.labels.append(batch.labels)
        self.count += len(batch)

    def close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.plan.store == "raw" and self.count != self.plan.count:
            # samples were skipped: the header promised more rows than were written
            self.data.seek(0)
            self.data.write(_npy_header((self.count, *self.plan.shape), len(self.header)))
        self.data.flush()
        os.fsync(self.data.fileno())
        self.data.close()
        names = ["images.npy" if self.plan.store == "raw" else "data.bin"]
        if self.plan.store == "encoded":
            np.save(self.path / "offsets.npy", np.concatenate(self.offsets))
            names.append("offsets.npy")
        labels = np.concatenate(self.labels) if self.labels else np.empty(0, dtype=np.int64)
        np.save(self.path / "labels.npy", labels.astype(np.int64, copy=False))
        names.append("labels.npy")
        manifest["files"] = {name: describe_file(self.path / name) for name in names}
        write_manifest(self.path, manifest)
        return manifest

    def abort(self) -> None:
        self.data.close()


def read_manifest(path: Path) -> dict[str, Any] | None:
    candidate = path / MANIFEST_NAME
    if not path.is_dir() or not candidate.is_file():
        return None
    manifest = read_manifest_file(candidate)
    return manifest if manifest.get("format") == FORMAT else None


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
        manifest = read_manifest_file(self.path / MANIFEST_NAME)
        if manifest.get("format") != FORMAT:
            raise ManifestError(
                f"{str(self.path)!r} holds format {manifest.get('format')!r}, not {FORMAT!r}. "
                "Use fastdata.open_dataset(path) to pick the right reader."
            )
        check_layout_version(manifest, LAYOUT_VERSION, str(self.path))
        self.manifest = manifest
        self.store = manifest["store"]
        self.mode = manifest["image"]["mode"]
        self.labels = self._load_array("labels.npy")
        self.offsets = self._load_array("offsets.npy") if self.store == "encoded" else None
        if len(self.labels) != manifest["count"]:
            raise CorruptDataError(
                f"{str(self.path / 'labels.npy')!r} has {len(self.labels)} labels but the manifest "
                f"says {manifest['count']} samples. Run 'fastdata verify {self.path}'."
            )

    def _load_array(self, name: str) -> np.ndarray:
        file = self.path / name
        try:
            return np.load(file, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise CorruptDataError(
                f"{str(file)!r}: cannot read ({exc}). Run 'fastdata verify {self.path}' "
                "or convert the source again."
            ) from exc

    def _open(self) -> np.ndarray:
        name = "images.npy" if self.store == "raw" else "data.bin"
        file = self.path / name
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
        if tuple(array.shape) != tuple(expected):
            raise CorruptDataError(
                f"{str(file)!r} holds shape {tuple(array.shape)} but the manifest says {tuple(expected)}. "
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


register(
    FormatSpec(
        name=FORMAT,
        dataset=MemmapDataset,
        writer=MemmapWriter,
        suffix=".npy",
        layout_version=LAYOUT_VERSION,
        read_manifest=read_manifest,
        description="memory-mapped numpy arrays in a directory",
    )
)
