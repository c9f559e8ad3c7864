"""Readers of the ``tar`` format: :class:`TarDataset` (iterable) and :class:`TarIndexedDataset`.

Both read members at the byte offsets recorded in the shard index (``index.json``), so no
tar stream is parsed at read time. :func:`fastdata.formats.tar_split.split_pieces` decides which samples one DataLoader
worker of one distributed rank reads in an epoch; every sample goes to exactly one of them.
"""

from __future__ import annotations

import io
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from fastdata.errors import CorruptDataError, CorruptManifestError, InvalidOptionError, ManifestError
from fastdata.formats.tar_index import (
    BLOCK, INDEX_NAME, ShardIndex, load_index, open_shard, padded, read_exact,
)
from fastdata.formats.tar_split import buffer_shuffle, resolve_distributed, shard_order, split_pieces
from fastdata.images import decode
from fastdata.manifest import CHECKSUM_ALGORITHM, open_manifest
from fastdata.reader import MapDataset

FORMAT = "tar"
LAYOUT_VERSION = 1
_READ_BYTES = 4 * 1024 * 1024
_CHUNK_SAMPLES = 64
_warned: set[tuple[str, int, int]] = set()
logger = logging.getLogger(__name__)


class ShardSplitWarning(UserWarning):
    """More ranks x workers than samples: some DataLoader workers have nothing to read."""


def npy_header_bytes(shape: tuple[int, ...]) -> int:
    """Length of the ``.npy`` header fastdata writes before a raw sample's pixels."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "|u1", "fortran_order": False, "shape": tuple(shape)})
    return len(buffer.getvalue())


def load_dataset(path: str | os.PathLike) -> tuple[Path, dict[str, Any], ShardIndex]:
    """Check the manifest and load the shard index of a tar dataset directory."""
    path = Path(path)
    manifest = open_manifest(path, FORMAT)
    index = load_index(path)
    if len(index.labels) != manifest["count"]:
        raise CorruptManifestError(
            f"{str(path / INDEX_NAME)!r} lists {len(index.labels)} samples but the manifest says "
            f"{manifest['count']}. Convert the source again."
        )
    if manifest["store"] == "raw":
        shape = tuple(manifest["image"]["shape"])
        expected = npy_header_bytes(shape) + int(np.prod(shape))
        bad = np.flatnonzero(index.image_size != expected)
        if len(bad):
            raise CorruptManifestError(
                f"{str(path / INDEX_NAME)!r}: sample {int(bad[0])} is {int(index.image_size[bad[0]])} bytes, but a "
                f"raw {shape} sample is {expected}. Run 'fastdata verify {path}' or convert the source again."
            )
    return path, manifest, index


class _Decoder:
    """Member bytes -> uint8 HWC pixels for one dataset (raw ``.npy`` or encoded image)."""

    def __init__(self, manifest: dict[str, Any]):
        self.store = manifest["store"]
        self.mode = manifest["image"]["mode"]
        self.shape = tuple(manifest["image"]["shape"] or ())
        self.pixels = int(np.prod(self.shape)) if self.shape else 0

    def __call__(self, blobs: list[bytes], name: Callable[[int], str]) -> np.ndarray | list[np.ndarray]:
        """Pixels of ``blobs``; ``name(row)`` names a sample in error messages."""
        if self.store == "raw":
            out = np.empty((len(blobs), *self.shape), dtype=np.uint8)
            for row, blob in enumerate(blobs):
                if len(blob) < self.pixels or blob[:6] != b"\x93NUMPY":
                    raise CorruptDataError(f"{name(row)}: not a {self.shape} uint8 .npy member. Convert the source again.")
                out[row] = np.frombuffer(blob, np.uint8, self.pixels, len(blob) - self.pixels).reshape(self.shape)
            return out
        pixels = []
        for row, blob in enumerate(blobs):
            try:
                pixels.append(decode(blob, self.mode))
            except Exception as exc:
                raise CorruptDataError(f"{name(row)}: cannot decode image ({exc}). Convert the source again.") from exc
        return pixels


def _member_name(path: Path, index: ShardIndex, sample: int) -> str:
    return f"{str(path / index.files[index.shard_of[sample]])!r} sample {sample}"


class _Formatter(MapDataset):
    """Applies the map-style output contract (reader.py) to pixels that were already read."""

    def format(self, pixels: Any, labels: np.ndarray) -> list[tuple[Any, Any]]:
        self._pending, self.labels = pixels, labels
        try:
            return self._samples(np.arange(len(labels)))
        finally:
            self._pending = None

    def batch(self, pixels: Any, labels: np.ndarray) -> tuple[Any, Any]:
        self._pending, self.labels = pixels, labels
        try:
            return self.get_batch(np.arange(len(labels)))
        finally:
            self._pending = None

    def _read(self, indices: np.ndarray) -> Any:
        return self._pending


# --- readers ----------------------------------------------------------------------------


class TarDataset(IterableDataset):
    """Iterable reader of the ``tar`` format: every sample exactly once per epoch.

    Shards are split across distributed ranks (``rank``/``world_size``, or torch.distributed
    when initialised) and DataLoader workers; with fewer shards than ranks x workers, samples
    are split within shards. ``shuffle`` permutes the shard order per ``(seed, epoch)`` and
    mixes samples through a ``shuffle_buffer``; call :meth:`set_epoch` each epoch.
    ``even=True`` gives every rank exactly ``N // world_size`` samples, split alike across its
    workers, so DDP ranks see the same number of batches (up to ``world_size - 1`` samples
    are left out per epoch). Yields ``(image, label)`` like the map-style readers, or with
    ``batch_size`` collated batches ``(uint8 [B, C, H, W], int64 [B])`` from one stacked read
    (each worker's last batch may be short); use those with ``DataLoader(batch_size=None)``.

    >>> loader = DataLoader(TarDataset("out/shards", seed=1), batch_size=256, num_workers=4)
    >>> loader = DataLoader(TarDataset("out/shards", batch_size=256), batch_size=None, num_workers=4)
    """

    def __init__(
        self,
        path: str | os.PathLike,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        *,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int = 1000,
        rank: int | None = None,
        world_size: int | None = None,
        even: bool = False,
        batch_size: int | None = None,
        image_format: str = "tensor",
        batch_transform: Callable | None = None,
    ):
        if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
            raise InvalidOptionError(f"Invalid shuffle_buffer {shuffle_buffer!r}. Use 0 (none) or a positive count.")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size <= 0):
            raise InvalidOptionError(f"Invalid batch_size {batch_size!r}. Use None (single samples) or a positive integer.")
        self.batch_size = batch_size
        self.formatter = _Formatter(
            transform=transform, target_transform=target_transform,
            image_format=image_format, batch_transform=batch_transform,
        )
        self.path, self.manifest, self.index = load_dataset(path)
        self.formatter._set_classes(self.manifest)
        self.classes, self.class_to_idx = self.formatter.classes, self.formatter.class_to_idx
        self.decoder = _Decoder(self.manifest)
        self.rank, self.world_size = resolve_distributed(rank, world_size)
        self.shuffle, self.seed, self.shuffle_buffer, self.even = shuffle, seed, shuffle_buffer, even
        self.epoch = 0

    @property
    def labels(self) -> np.ndarray:
        """Every sample's label, in index order (from the shard index)."""
        return self.index.labels

    def set_epoch(self, epoch: int) -> None:
        """Pick the epoch whose shuffle the next iteration uses (reaches non-persistent workers)."""
        self.epoch = epoch

    def pieces(self, worker: int = 0, num_workers: int = 1) -> list[tuple[int, int, int]]:
        """``(shard, start, stop)`` ranges one worker of this rank reads this epoch."""
        order = shard_order(len(self.index.files), seed=self.seed, epoch=self.epoch, shuffle=self.shuffle)
        pieces, split = split_pieces(
            self.index.counts, order, rank=self.rank, world_size=self.world_size,
            worker=worker, num_workers=num_workers, even=self.even,
        )
        key = (str(self.path), len(self.index.files), self.world_size * num_workers)
        if split and worker == 0 and key not in _warned:
            _warned.add(key)
            # Each consumer reads only its own contiguous byte ranges (through the index), so
            # splitting within shards costs no extra I/O: log it. Idle consumers do cost: warn.
            message = (
                f"{str(self.path)!r} has {key[1]} shard(s) for {self.world_size} rank(s) x {num_workers} "
                f"worker(s): splitting samples within shards"
            )
            if len(self.index.labels) < key[2]:
                warnings.warn(
                    f"{message}, and {len(self.index.labels)} samples leave some workers idle. "
                    f"Use fewer workers (at most {len(self.index.labels) // self.world_size} per rank).",
                    ShardSplitWarning,
                    stacklevel=3,
                )
            else:
                logger.info("%s. Convert with --shard-samples for at least %d shards.", message, key[2])
        return pieces

    def __len__(self) -> int:
        """Samples this rank yields per epoch: all of them on one rank, ``N // world_size`` with
        ``even``. Otherwise (and for batches) it depends on the shuffle or the worker count."""
        if self.batch_size is not None:
            raise TypeError(
                "A TarDataset with batch_size has no fixed len(): each DataLoader worker's last batch "
                "may be short. Use batch_size=None with DataLoader(batch_size=...) for a length."
            )
        if self.world_size == 1:
            return len(self.index.labels)
        if self.even:
            return len(self.index.labels) // self.world_size
        raise TypeError(
            "TarDataset has no fixed length per rank when world_size > 1 (whole shards go to each "
            "rank); pass even=True for exactly N // world_size samples per rank."
        )

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        info = get_worker_info()
        return self.iter_worker(info.id if info else 0, info.num_workers if info else 1)

    def iter_worker(self, worker: int, num_workers: int) -> Iterator[tuple[Any, Any]]:
        """What DataLoader worker ``worker`` of ``num_workers`` yields (``__iter__`` calls this)."""
        records = self._records(self.pieces(worker, num_workers))
        if self.shuffle and self.shuffle_buffer > 1:
            rng = np.random.default_rng([self.seed, self.epoch, self.rank, worker, num_workers])
            records = buffer_shuffle(records, self.shuffle_buffer, rng)
        size = self.batch_size or _CHUNK_SAMPLES
        chunk: list[tuple[int, bytes]] = []
        for record in records:
            chunk.append(record)
            if len(chunk) == size:
                yield from self._emit(chunk)
                chunk = []
        if chunk:
            yield from self._emit(chunk)

    def _emit(self, chunk: list[tuple[int, bytes]]) -> list[Any]:
        samples = np.fromiter((sample for sample, _ in chunk), dtype=np.int64, count=len(chunk))
        pixels = self.decoder([blob for _, blob in chunk], lambda row: _member_name(self.path, self.index, int(samples[row])))
        if self.batch_size:
            return [self.formatter.batch(pixels, self.index.labels[samples])]
        return self.formatter.format(pixels, self.index.labels[samples])

    def _records(self, pieces: list[tuple[int, int, int]]) -> Iterator[tuple[int, bytes]]:
        """``(global sample index, image member bytes)`` of the pieces, in order, read in blocks."""
        index, starts = self.index, self.index.starts
        for shard, start, stop in pieces:
            first = int(starts[shard])
            descriptor = open_shard(self.path, index, shard)
            try:
                sample = first + start
                while sample < first + stop:
                    base = int(index.image_offset[sample]) - BLOCK
                    limit = base + _READ_BYTES
                    end = sample + 1 + int(np.searchsorted(index.sample_end[sample + 1 : first + stop], limit, "right"))
                    block = read_exact(descriptor, int(index.sample_end[end - 1]) - base, base, self.path / index.files[shard])
                    view = memoryview(block)
                    for s in range(sample, end):
                        offset = int(index.image_offset[s]) - base
                        yield s, bytes(view[offset : offset + int(index.image_size[s])])
                    sample = end
            finally:
                os.close(descriptor)


class TarIndexedDataset(MapDataset):
    """Map-style reader of the ``tar`` format: random access by index through member offsets.

    For samplers that need ``__getitem__`` (``shuffle=True`` DataLoaders, ``fastdata.loader``).

    >>> ds = TarIndexedDataset("out/shards")
    >>> image, label = ds[0]            # uint8 tensor (C, H, W), int
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
        self.path, self.manifest, self.index = load_dataset(path)
        self.labels = self.index.labels
        self._set_classes(self.manifest)
        self.decoder = _Decoder(self.manifest)

    def _open(self) -> dict[int, int]:
        return {}  # shard -> descriptor, opened on first use in this process

    def _descriptor(self, shard: int) -> int:
        descriptors = self.handles
        if shard not in descriptors:
            descriptors[shard] = open_shard(self.path, self.index, shard)
        return descriptors[shard]

    def _read(self, indices: np.ndarray) -> np.ndarray | list[np.ndarray]:
        index, blobs = self.index, []
        for sample in indices.tolist():
            shard = int(index.shard_of[sample])
            blobs.append(
                read_exact(
                    self._descriptor(shard), int(index.image_size[sample]), int(index.image_offset[sample]),
                    lambda: self.path / index.files[shard],  # no Path per sample in workers' memory
                )
            )
        return self.decoder(blobs, lambda row: _member_name(self.path, index, int(indices[row])))


# --- verify -------------------------------------------------------------------------------

_SHOWN_PER_SHARD = 5


def verify_shards(path: Path, manifest: dict[str, Any], *, deep: bool = False) -> list[str]:
    """The ``tar`` checks of ``fastdata verify``: the shard index agrees with the manifest, and
    every shard holds exactly the members the index lists, at their offsets (an extra member,
    e.g. ``x.pyd`` or ``../evil.png``, is reported, never read). ``deep`` also compares each
    ``.cls`` member with the index's label."""
    try:
        index = load_index(path)
        document = json.loads((path / INDEX_NAME).read_text(encoding="utf-8"))
    except (ManifestError, OSError, ValueError) as exc:
        return [str(exc)]
    origin = repr(str(path / INDEX_NAME))
    problems = []
    if len(index.labels) != manifest["count"]:
        problems.append(f"{origin}: lists {len(index.labels)} samples but the manifest says {manifest['count']}.")
    listed = {name: entry for name, entry in manifest["files"].items() if name != INDEX_NAME}
    if list(listed) != index.files:
        problems.append(f"{origin}: lists shards {index.files} but the manifest lists {list(listed)}.")
    starts = index.starts
    for number, shard in enumerate(document["shards"]):
        entry = listed.get(shard["file"], {})
        if (entry.get("bytes"), entry.get(CHECKSUM_ALGORITHM)) != (shard["bytes"], shard.get(CHECKSUM_ALGORITHM)):
            problems.append(f"{origin}: size or checksum of {shard['file']!r} differs from the manifest's.")
        file = path / shard["file"]
        if file.is_file() and file.stat().st_size == shard["bytes"]:
            expected = _expected_members(shard, int(starts[number]), document["key_width"])
            problems += _check_members(file, expected, deep=deep)[:_SHOWN_PER_SHARD]
    return problems


def _expected_members(shard: dict[str, Any], first: int, key_width: int) -> dict[int, tuple[str, int, int | None]]:
    """Header offset -> (member name, data size, label for ``.cls`` members) the index implies."""
    expected: dict[int, tuple[str, int, int | None]] = {}
    for row in range(shard["count"]):
        key = f"{first + row:0{key_width}d}"
        expected[shard["image_offset"][row] - BLOCK] = (f"{key}.{shard['extension'][row]}", shard["image_size"][row], None)
        expected[shard["cls_offset"][row] - BLOCK] = (f"{key}.cls", shard["cls_size"][row], shard["label"][row])
    expected[shard["bytes"] - 2 * BLOCK] = ("", 0, None)  # the end-of-archive blocks
    return expected


def _check_members(file: Path, expected: dict[int, tuple[str, int, int | None]], *, deep: bool) -> list[str]:
    """Walk the shard's ustar headers (names are compared as text, never used as paths)."""
    problems, offset, size = [], 0, file.stat().st_size
    descriptor = os.open(file, os.O_RDONLY)
    try:
        while offset < size:
            header = os.pread(descriptor, BLOCK, offset)
            name, length = _parse_header(header)
            want = expected.pop(offset, None)
            if name is None:
                member = f" (member {want[0]!r})" if want and want[0] else ""
                problems.append(f"{str(file)!r}: damaged tar header at byte {offset}{member}; the rest of the "
                                "shard was not walked.")
                return problems
            if not name and not length:  # end of archive
                if want is None or want[0] or header.count(0) != BLOCK:
                    problems.append(f"{str(file)!r}: archive ends at byte {offset}, not where the index says.")
                break
            if want is None or (name, length) != want[:2]:
                problems.append(f"{str(file)!r}: member {name!r} ({length} bytes) at byte {offset} is not in the index.")
            elif deep and want[2] is not None:
                text = os.pread(descriptor, length, offset + BLOCK)
                if text.strip() != str(want[2]).encode("ascii"):
                    problems.append(f"{str(file)!r}: member {name!r} holds label {text[:20]!r}, the index says {want[2]}.")
            offset += BLOCK + padded(length)
    finally:
        os.close(descriptor)
    for where, (name, _, _) in sorted(expected.items()):
        problems.append(f"{str(file)!r}: member {name or 'end of archive'!r} expected at byte {where} is missing.")
    return problems


def _parse_header(header: bytes) -> tuple[str | None, int]:
    """(name, size) of a ustar header; ("", 0) for a zero block; (None, 0) when it is damaged."""
    if len(header) < BLOCK:
        return None, 0
    if not any(header):
        return "", 0
    try:
        recorded = int(header[148:156].strip(b" \x00") or b"0", 8)
        size = int(header[124:136].strip(b" \x00") or b"0", 8)
    except ValueError:
        return None, 0
    if recorded != sum(header[:148]) + 8 * 32 + sum(header[156:]):
        return None, 0
    return header[:100].rstrip(b"\x00").decode("utf-8", "replace"), size
