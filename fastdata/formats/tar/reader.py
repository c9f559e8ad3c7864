"""The map-style reader of the ``tar`` format, :class:`TarIndexedDataset`, and what both tar
readers share: opening a dataset (manifest and checked shard index) and turning member bytes
into pixels. Members are read at the byte offsets recorded in ``index.json``: no tar stream is
parsed at read time, and member names are never used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastdata.errors import CorruptDataError, CorruptManifestError
from fastdata.formats.npyfile import MAGIC, npy_header
from fastdata.formats.tar.index import ShardIndex, load_index, open_shard, read_exact
from fastdata.formats.tar.layout import FORMAT, INDEX_NAME
from fastdata.formats.stored import open_manifest
from fastdata.reader.options import allocated
from fastdata.reader.stored import StoredDataset


def load_dataset(path: str | os.PathLike) -> tuple[Path, dict[str, Any], ShardIndex]:
    """Check the manifest and load the shard index of a tar dataset directory."""
    path = Path(path)
    manifest = open_manifest(path, FORMAT)
    return path, manifest, load_checked_index(path, manifest)


def load_checked_index(path: Path, manifest: dict[str, Any]) -> ShardIndex:
    """The shard index, checked against the manifest (sample count; raw samples' sizes)."""
    index = load_index(path)
    if len(index.labels) != manifest["count"]:
        raise CorruptManifestError(
            f"{str(path / INDEX_NAME)!r} lists {len(index.labels)} samples but the manifest says "
            f"{manifest['count']}. Convert the source again."
        )
    if manifest["store"] == "raw":
        shape = tuple(manifest["image"]["shape"])
        expected = len(npy_header(shape)) + int(np.prod(shape))
        bad = np.flatnonzero(index.image_size != expected)
        if len(bad):
            raise CorruptManifestError(
                f"{str(path / INDEX_NAME)!r}: sample {int(bad[0])} is {int(index.image_size[bad[0]])} bytes, but a "
                f"raw {shape} sample is {expected}. Run 'fastdata verify {path}' or convert the source again."
            )
    return index


def member_pixels(path: Path, manifest: dict[str, Any], index: ShardIndex, blobs: list[bytes],
                  samples: np.ndarray, allocate: Callable | None = None, *, pil: bool = False,
                  decoder: Any = None, epoch: int | None = None, draws: list | None = None) -> Any:
    """Image member bytes of ``samples`` -> uint8 HWC pixels: the raw ``.npy`` members' pixels
    (one stacked array, in ``allocate``'d memory when given) or the encoded images decoded
    (PIL images with ``pil``; a fused crop's randomness from ``epoch``, see
    :meth:`fastdata.decoding.Decoder.decode_all`)."""
    def where(row: int) -> str:
        sample = int(samples[row])
        return f"{str(path / index.files[index.shard_of[sample]])!r} sample {sample}"

    if manifest["store"] != "raw":
        return decoder.decode_all(blobs, where, path, pil=pil, allocate=allocate, indices=samples.tolist(),
                                  epoch=epoch, draws=draws)
    shape = tuple(manifest["image"]["shape"])
    size = int(np.prod(shape))
    out = allocated(allocate, (len(blobs), *shape))
    for row, blob in enumerate(blobs):
        if len(blob) < size or blob[:6] != MAGIC[:6]:
            raise CorruptDataError(f"{where(row)}: not a {shape} uint8 .npy member. Convert the source again.")
        out[row] = np.frombuffer(blob, np.uint8, size, len(blob) - size).reshape(shape)
    return out


class TarIndexedDataset(StoredDataset):
    """Map-style reader of the ``tar`` format: random access by index through member offsets.

    For samplers that need ``__getitem__`` (``shuffle=True`` DataLoaders, ``fastdata.loader``).

    >>> ds = TarIndexedDataset("out/shards")
    >>> image, label = ds[0]            # uint8 tensor (C, H, W), int

    ``batch_transform`` applies on every path, as in :class:`fastdata.reader.ReaderOptions`.
    """

    format_name = FORMAT
    required_files = {"raw": (INDEX_NAME,), "encoded": (INDEX_NAME,)}
    remote_fetch = (INDEX_NAME,)  # shards are fetched as they are read (and kept while this reader lives)

    def _load(self) -> None:
        self.index = load_checked_index(self.path, self.manifest)
        self.labels = self.index.labels

    def _field_values(self, f: Any, indices: np.ndarray) -> Any:
        if f.name not in (self.index.fields or {}):
            raise CorruptManifestError(f"{str(self.path / INDEX_NAME)!r} has no members of field {f.name!r}, which "
                                       "the manifest lists. Convert the source again.")
        return field_values(self, f, indices)

    def _open(self) -> dict[int, int]:
        return {}  # shard -> descriptor, opened on first use in this process

    def _descriptor(self, shard: int) -> int:
        descriptors = self.handles
        if shard not in descriptors:
            self.files.ensure([self.index.files[shard]])  # a URL's shard: into the cache first
            descriptors[shard] = open_shard(self.path, self.index, shard)
        return descriptors[shard]

    def _read(self, indices: np.ndarray, allocate: Callable | None = None, *, pil: bool = False,
              draws: list | None = None) -> Any:
        index, blobs = self.index, []
        for sample in indices.tolist():
            shard = int(index.shard_of[sample])
            blobs.append(
                read_exact(
                    self._descriptor(shard), int(index.image_size[sample]), int(index.image_offset[sample]),
                    _shard_path(self.path, index, shard),  # built only if the read fails
                )
            )
        return member_pixels(self.path, self.manifest, index, blobs, indices, allocate, pil=pil, decoder=self.decoder,
                             epoch=self.epoch_of(indices), draws=draws)


def field_values(dataset: Any, f: Any, indices: np.ndarray, members: list[bytes] | None = None) -> Any:
    """One extra field's stored values of ``indices`` from its members (:mod:`fastdata.fields`):
    the (B, *shape) rows of a fixed field, else each sample's stored bytes. ``members``: the
    members' bytes already read (the streaming reader's block reads); else each is read here."""
    index = dataset.index
    offsets, sizes = index.fields[f.name]
    values = []
    for row, sample in enumerate(indices.tolist()):
        shard = int(index.shard_of[sample])
        data = members[row] if members is not None else read_exact(
            dataset._descriptor(shard), int(sizes[sample]), int(offsets[sample]), _shard_path(dataset.path, index, shard))
        values.append(f.from_member(data, f"{str(dataset.path / index.files[shard])!r} sample {sample}: "))
    if f.variable:
        return values
    dtype = np.dtype(f.dtype).newbyteorder("<")
    out = np.empty((len(values), *f.shape), dtype=f.dtype)
    for row, stored in enumerate(values):
        if len(stored) != f.row_bytes:
            raise CorruptDataError(f"{str(dataset.path)!r} sample {int(indices[row])}: field {f.name!r} holds "
                                   f"{len(stored)} bytes, not one {f.dtype} {f.shape} value. Convert the source again.")
        out[row] = np.frombuffer(stored, dtype).reshape(f.shape)
    return out


def _shard_path(path: Path, index: ShardIndex, shard: int) -> Callable[[], Path]:
    return lambda: path / index.files[shard]  # no Path per sample in workers' memory
