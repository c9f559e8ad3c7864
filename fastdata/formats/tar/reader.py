"""The map-style reader of the ``tar`` format, :class:`TarIndexedDataset`, and what both tar
readers share: opening a dataset (manifest and checked shard index), turning member bytes into
pixels, and building samples with fields from members already read (:class:`BlockMembers`).
Members are read at the byte offsets recorded in ``index.json``: no tar stream is parsed at
read time, and member names are never used. One read of the map-style reader reads each
contiguous byte run of the members it wants once (:mod:`fastdata.formats.tar.runs`): a sample's
image and field members together, and adjacent samples together.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import numpy as np
from torch.utils.data import get_worker_info

from fastdata.errors import CorruptDataError, CorruptManifestError
from fastdata.fields import MEMBER_KEY
from fastdata.formats.npyfile import MAGIC, npy_header
from fastdata.formats.tar.index import ShardIndex, load_index, open_shard, read_exact
from fastdata.formats.tar.layout import FORMAT, INDEX_NAME
from fastdata.formats.tar.runs import read_runs
from fastdata.formats.stored import open_manifest
from fastdata.reader.options import allocated
from fastdata.formats.dataset import StoredDataset
from fastdata.remote.dataset import check_room_for_readers


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
    :meth:`fastdata.reader.decoding.Decoder.decode_all`)."""
    def where(row: int) -> str:
        sample = int(samples[row])
        return f"{str(path / index.files[index.shard_of[sample]])!r} sample {sample}"

    if manifest["store"] != "raw":
        return decoder.decode_all(blobs, where, path, pil=pil, allocate=allocate, indices=samples.tolist(),
                                  epoch=epoch, draws=draws)
    shape = tuple(manifest["image"]["shape"])
    size = math.prod(shape)
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
    # a URL's shards are fetched as they are read, and this process keeps its least recently read
    # ones open within its share of cache_limit (:class:`OpenShards`)
    remote_fetch = (INDEX_NAME,)

    def _load(self) -> None:
        self.index = load_checked_index(self.path, self.manifest)
        self.labels = self.index.labels

    def _field_values(self, f: Any, indices: np.ndarray) -> Any:
        if f.meta.get(MEMBER_KEY) is True and self.index.keys is not None and f.name not in (self.index.fields or {}):
            return [bytes(key) for key in self.index.keys[indices]]  # the members' own names: the index's keys
        return field_values(self, f, indices, self._members(indices, [self._field_column(f)])[0])

    def _field_column(self, f: Any) -> tuple[np.ndarray, np.ndarray]:
        """The (offsets, sizes) of field ``f``'s members, from the index."""
        if f.name not in (self.index.fields or {}):
            raise CorruptManifestError(f"{str(self.path / INDEX_NAME)!r} has no members of field {f.name!r}, which "
                                       "the manifest lists. Convert the source again.")
        return self.index.fields[f.name]

    def _members(self, indices: np.ndarray, columns: list[tuple[np.ndarray, np.ndarray]]) -> list[list[Any]]:
        """Each column's member bytes of ``indices`` (a column: every sample's member offsets and
        sizes), every contiguous byte run among them read once (:func:`fastdata.formats.tar.runs.read_runs`)."""
        count = len(indices)
        if not count or not columns:
            return [[] for _ in columns]
        index = self.index
        if count == 1 and len(columns) == 1:  # ds[i] of an (image, label) dataset: one member, nothing to plan
            sample = int(indices[0])
            shard = int(index.shard_of[sample])
            with self._shard(shard) as descriptor:
                return [[read_exact(descriptor, int(columns[0][1][sample]), int(columns[0][0][sample]),
                                    _shard_path(self.path, index, shard))]]
        if len(columns) == 1:  # (image, label) datasets: the images alone
            shards, offsets, sizes = index.shard_of[indices], columns[0][0][indices], columns[0][1][indices]
        else:
            shards = np.tile(index.shard_of[indices], len(columns))
            offsets = np.concatenate([column[0][indices] for column in columns])
            sizes = np.concatenate([column[1][indices] for column in columns])
        members = read_runs(shards, offsets, sizes, self._shard, lambda shard: _shard_path(self.path, index, shard))
        return [members[start:start + count] for start in range(0, len(members), count)]

    def _reading(self, indices: np.ndarray, names: set[str]) -> "BlockMembers":
        """One read of ``indices``' fields ``names``: the image and field members read together,
        each contiguous byte run once, and handed out from memory (:class:`BlockMembers`)."""
        image = self.schema.image.name in names
        wanted = [f for f in self.schema.extras if f.name in names and f.name in (self.index.fields or {})]
        columns = [(self.index.image_offset, self.index.image_size)] if image else []
        members = self._members(indices, columns + [self.index.fields[f.name] for f in wanted])
        images = members.pop(0) if image else None
        return BlockMembers(self, images, {f.name: found for f, found in zip(wanted, members)}, self.epoch_of(indices))

    def _open(self) -> "OpenShards":
        return OpenShards(self.files.url is not None)  # opened on first use in this process

    def close(self) -> None:
        """Close this process's open shards and release what it holds in a URL's cache (so the
        cache may evict it at once, not when the reader is garbage collected); reading again
        opens (and fetches) shards again."""
        if self._handles is not None and self._pid == os.getpid():
            self._handles.close()
        self.files.close()

    def _shard(self, shard: int) -> Any:
        """``with dataset._shard(shard) as descriptor``: the shard open (a URL's in the cache) while used."""
        return self.handles.use(self, shard)

    def encoded_sizes(self) -> np.ndarray | None:
        return np.asarray(self.index.image_size) if self.store == "encoded" else None

    def _encoded(self, indices: np.ndarray) -> list[bytes]:
        return [bytes(blob) for blob in self._members(indices, [(self.index.image_offset, self.index.image_size)])[0]]

    def _read(self, indices: np.ndarray, allocate: Callable | None = None, *, pil: bool = False,
              draws: list | None = None) -> Any:
        blobs = self._members(indices, [(self.index.image_offset, self.index.image_size)])[0]
        return member_pixels(self.path, self.manifest, self.index, blobs, indices, allocate, pil=pil, decoder=self.decoder,
                             epoch=self.epoch_of(indices), draws=draws)


def field_values(dataset: Any, f: Any, indices: np.ndarray, members: list[bytes | memoryview]) -> Any:
    """One extra field's stored values of ``indices`` from its members' bytes (:mod:`fastdata.fields`):
    the (B, *shape) rows of a fixed field, else each sample's stored bytes."""
    index = dataset.index
    values = [f.from_member(data, f"{str(dataset.path / index.files[index.shard_of[sample]])!r} sample {sample}: ")
              for data, sample in zip(members, indices.tolist())]
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


class OpenShards:
    """One process's open shards of a :class:`TarIndexedDataset`. Local shards stay open. A URL's
    shards are leased from the cache while open (never evicted meanwhile), and the least
    recently used ones not being read are closed (their leases released, so the cache may evict
    them) before another is opened past this process's share of ``cache_limit``: the limit less
    the files held at open (index, manifest), split over the DataLoader's workers. So random
    access to a dataset bigger than the cache keeps the cache within ``cache_limit`` plus one
    shard, re-fetching an evicted shard when it is read again (as Mosaic Streaming does)."""

    def __init__(self, remote: bool):
        self.remote = remote  # no reference to the dataset: closed as soon as the dataset is dropped
        self.open: OrderedDict[int, list[Any]] = OrderedDict()  # shard -> [descriptor, lease, bytes, users]
        self.lock = threading.Lock()  # the thread backend reads one dataset from several threads

    def _budget(self, dataset: TarIndexedDataset) -> float:
        files = dataset.files
        info = get_worker_info()
        readers = info.num_workers if info else 1
        check_room_for_readers(files, int(dataset.index.sizes.max()), readers)  # never a wait for another's shard
        return (files.cache.limit - files.held_bytes()) / readers

    def use(self, dataset: TarIndexedDataset, shard: int) -> Any:
        """``with open_shards.use(dataset, shard) as descriptor``: the shard open while used."""
        if not self.remote:  # local shards stay open: no lease, no count of users
            entry = self.open.get(shard)
            return contextlib.nullcontext((entry or self._acquire(dataset, shard, count=False))[0])
        return _Held(self, self._acquire(dataset, shard))

    def _acquire(self, dataset: TarIndexedDataset, shard: int, *, count: bool = True) -> list[Any]:
        """The shard's entry, opened (a URL's shard leased in the cache, the least recently used
        idle ones closed past this process's share of ``cache_limit``); counted in use with ``count``."""
        with self.lock:
            entry = self.open.get(shard)
            if entry is None:
                name = dataset.index.files[shard]
                size = int(dataset.index.sizes[shard])
                if self.remote:
                    budget, used = self._budget(dataset), sum(e[2] for e in self.open.values())
                    for idle in [s for s, e in self.open.items() if e[3] == 0]:  # least recently used first
                        if used + size <= budget:
                            break
                        used -= self._close(idle)
                lease = dataset.files.lease(name) if self.remote else None  # a URL's shard: into the cache
                try:
                    descriptor = open_shard(dataset.path, dataset.index, shard)
                except BaseException:
                    if lease is not None:
                        lease.release()
                    raise
                entry = self.open[shard] = [descriptor, lease, size, 0]
            if count:  # a URL's shard: in use (not closed) until released
                self.open.move_to_end(shard)
                entry[3] += 1
            return entry

    def _close(self, shard: int) -> int:
        descriptor, lease, size, _ = self.open.pop(shard)
        os.close(descriptor)
        if lease is not None:
            lease.release()
        return size

    def close(self) -> None:
        with self.lock:
            for shard in list(self.open):
                self._close(shard)

    def __del__(self) -> None:
        for shard in list(getattr(self, "open", {})):
            try:
                self._close(shard)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass



class _Held:
    """A URL's shard in use (its user count held) for the ``with`` block: its descriptor."""

    __slots__ = ("shards", "entry")

    def __init__(self, shards: OpenShards, entry: list[Any]):
        self.shards, self.entry = shards, entry

    def __enter__(self) -> int:
        return self.entry[0]

    def __exit__(self, *exc: Any) -> None:
        with self.shards.lock:
            self.entry[3] -= 1


class BlockMembers:
    """A tar reader of a dataset with fields (what :class:`fastdata.reader.records.Records` builds samples
    from) whose image and field members were read already: by the map-style reader's byte runs
    (:meth:`TarIndexedDataset._reading`) or the streaming reader's block reads. ``images`` and
    each of ``fields``' lists are in the order of the indices the records ask for; a field not
    in ``fields`` is read by the reader."""

    def __init__(self, reader: TarIndexedDataset, images: list[Any] | None, fields: dict[str, list[Any]],
                 epoch: int | None):
        self.reader, self.images, self.fields, self.epoch = reader, images, fields, epoch

    def __getattr__(self, name: str) -> Any:  # schema, options, path, labels, manifest: the reader's
        return getattr(self.reader, name)

    def _reading(self, indices: np.ndarray, names: set[str]) -> "BlockMembers":
        return self  # read already

    def _read(self, indices: np.ndarray, allocate: Callable | None = None, *, pil: bool = False,
              draws: list | None = None) -> Any:
        reader = self.reader
        return member_pixels(reader.path, reader.manifest, reader.index, self.images, indices, allocate, pil=pil,
                             decoder=reader.decoder, epoch=self.epoch, draws=draws)

    def _field_values(self, f: Any, indices: np.ndarray) -> Any:
        members = self.fields.get(f.name)
        if members is None:
            return self.reader._field_values(f, indices)  # read now (or: names the missing field's members)
        return field_values(self.reader, f, indices, members)
