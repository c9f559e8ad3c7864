"""The iterable reader of the ``tar`` format, :class:`TarDataset`: shards streamed in order,
each read in large blocks at the offsets of ``index.json``.
:func:`fastdata.formats.tar.split.split_pieces` decides which samples one DataLoader worker of one
distributed rank reads in an epoch; every sample goes to exactly one of them.
"""

from __future__ import annotations

import logging
import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from fastdata.errors import InvalidOptionError, NotIndexableError
from fastdata.formats.tar.index import open_shard, read_exact
from fastdata.formats.tar.layout import BLOCK, INDEX_NAME
from fastdata.formats.tar.reader import BlockMembers, TarIndexedDataset, load_dataset, member_pixels
from fastdata.formats.tar.split import buffer_shuffle, shard_order, split_pieces
from fastdata.loading.samplers import resolve_distributed
from fastdata.reader.options import ReaderOptions
from fastdata.reader.output import ReaderOutput
from fastdata.formats.dataset import decoder_for
from fastdata.formats.stored import single_file_problem
from fastdata.remote.dataset import locate
from fastdata.remote.filesystem import scrub
from fastdata.urls import is_url

_READ_BYTES = 4 * 1024 * 1024
_CHUNK_SAMPLES = 64
_warned: set[tuple[str, int, int]] = set()
logger = logging.getLogger(__name__)


class ShardSplitWarning(UserWarning):
    """More ranks x workers than samples: some DataLoader workers have nothing to read."""


@dataclass(frozen=True)
class TarStreamOptions(ReaderOptions):
    """:class:`~fastdata.reader.ReaderOptions` and the streaming ones of :class:`TarDataset`
    (``prefetch``, a URL's shards fetched ahead of the one being read per worker, is a
    :class:`~fastdata.remote.RemoteOptions` option that streaming readers take)."""

    streams = True

    shuffle: bool = True
    seed: int = 0
    shuffle_buffer: int = 1000
    rank: int | None = None
    world_size: int | None = None
    even: bool = False
    batch_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.shuffle_buffer, int) or self.shuffle_buffer < 0:
            raise InvalidOptionError(f"Invalid shuffle_buffer {self.shuffle_buffer!r}. Use 0 (none) or a positive count.")
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size <= 0):
            raise InvalidOptionError(
                f"Invalid batch_size {self.batch_size!r}. Use None (single samples) or a positive integer.")


class TarDataset(ReaderOutput, IterableDataset):
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
    ``batch_transform`` takes image tensors [B, C, H, W]: each batch with ``batch_size``, else
    each image as a batch of one (see :class:`fastdata.reader.ReaderOptions`).

    >>> loader = DataLoader(TarDataset("out/shards", seed=1), batch_size=256, num_workers=4)
    >>> loader = DataLoader(TarDataset("out/shards", batch_size=256), batch_size=None, num_workers=4)
    """

    Options = TarStreamOptions
    map_reader = TarIndexedDataset  # the same samples, map-style (fastdata.loader's refusal names it)

    def __init__(self, path: str | os.PathLike, transform: Callable | None = None,
                 target_transform: Callable | None = None, **options: Any):
        self._init_options(transform, target_transform, options)
        self.url = os.fspath(path) if is_url(path) else None
        local, self.files = locate(path, self.options.remote, fetch=(INDEX_NAME,),  # a URL: shards come on use
                                   check_single=single_file_problem)
        self.path, self.manifest, self.index = load_dataset(local)
        self.decoder = decoder_for(self.manifest, self.options)
        self._set_classes(self.manifest)
        self.rank, self.world_size = resolve_distributed(self.options.rank, self.options.world_size)
        self.epoch = 0
        self.fields_reader = None
        self.schema = None  # the fastdata.fields.Schema of a dataset with fields
        if "fields" in self.manifest:  # samples with fields: built by the map-style reader's records
            shared = {f.name: getattr(self.options, f.name) for f in dataclasses.fields(ReaderOptions)}
            self.fields_reader = TarIndexedDataset(self.path, **shared)
            self.schema = self.fields_reader.schema

    @property
    def batch_size(self) -> int | None:
        return self.options.batch_size

    @property
    def shuffle(self) -> bool:
        return self.options.shuffle

    @property
    def labels(self) -> np.ndarray:
        """Every sample's label, in index order (from the shard index)."""
        return self.index.labels

    def set_epoch(self, epoch: int) -> None:
        """Pick the epoch whose shuffle (and fused crops, drawn from ``(seed, epoch, sample)``)
        the next iteration uses (reaches non-persistent workers)."""
        self.epoch = epoch

    def pieces(self, worker: int = 0, num_workers: int = 1) -> list[tuple[int, int, int]]:
        """``(shard, start, stop)`` ranges one worker of this rank reads this epoch."""
        order = shard_order(len(self.index.files), seed=self.options.seed, epoch=self.epoch, shuffle=self.shuffle)
        pieces, split = split_pieces(
            self.index.counts, order, rank=self.rank, world_size=self.world_size,
            worker=worker, num_workers=num_workers, even=self.options.even,
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
        if self.options.even:
            return len(self.index.labels) // self.world_size
        raise TypeError(
            "TarDataset has no fixed length per rank when world_size > 1 (whole shards go to each "
            "rank); pass even=True for exactly N // world_size samples per rank."
        )

    def __getitem__(self, index: Any) -> Any:
        """Refused: samples stream shard by shard. :class:`TarIndexedDataset` reads them by index."""
        where = scrub(self.url, self.options.remote.storage_options) if self.url else str(self.path)
        raise NotIndexableError(
            f"TarDataset streams the samples of {where!r} shard by shard and cannot give ds[{index!r}]. "
            f"Use fastdata.TarIndexedDataset({where!r}) for random access by index (the same samples, map-style), "
            "or iterate this one (for sample in ds: ...)."
        )

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        info = get_worker_info()
        return self.iter_worker(info.id if info else 0, info.num_workers if info else 1)

    def iter_worker(self, worker: int, num_workers: int) -> Iterator[tuple[Any, Any]]:
        """What DataLoader worker ``worker`` of ``num_workers`` yields (``__iter__`` calls this)."""
        records = self._records(self.pieces(worker, num_workers))
        if self.shuffle and self.options.shuffle_buffer > 1:
            rng = np.random.default_rng([self.options.seed, self.epoch, self.rank, worker, num_workers])
            records = buffer_shuffle(records, self.options.shuffle_buffer, rng)
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
        if self.fields_reader is not None:
            from fastdata.reader.records import Records  # only datasets with fields need it

            names = self._block_fields()
            members = BlockMembers(self.fields_reader, [blob[0] for _, blob in chunk],
                                   {name: [blob[1][k] for _, blob in chunk] for k, name in enumerate(names)}, self.epoch)
            records = Records(members)
            return [records.batch(samples)] if self.batch_size else records.samples(samples)
        pixels = member_pixels(self.path, self.manifest, self.index, [blob for _, blob in chunk], samples,
                               pil=self.image_format == "pil", decoder=self.decoder, epoch=self.epoch)
        if self.batch_size:
            return [self.output.batch(pixels, self.index.labels[samples])]
        return self.output.samples(pixels, self.index.labels[samples])

    def _block_fields(self) -> list[str]:
        """The extra fields whose members the block reads hand on (datasets with fields)."""
        return sorted(self.index.fields or {})

    def _records(self, pieces: list[tuple[int, int, int]]) -> Iterator[tuple[int, Any]]:
        """``(global sample index, image member bytes)`` of the pieces, in order, read in blocks;
        for a dataset with fields ``(index, (image bytes, [each field member's bytes]))``, the
        fields in :meth:`_block_fields` order, cut from the same blocks."""
        index, starts = self.index, self.index.starts
        names = self._block_fields() if self.fields_reader is not None else None
        columns = [index.fields[name] for name in names] if names is not None else []
        files = [index.files[shard] for shard, _, _ in pieces]
        ahead = 1 + 2 * (self.options.remote.prefetch + 1)  # enough pieces for the prefetch window (a shard may be split in pieces)
        for position, (shard, start, stop) in enumerate(pieces):
            first = int(starts[shard])
            self.files.prefetch(list(dict.fromkeys(files[position : position + ahead])))  # this shard and the next ones
            lease = self.files.lease(files[position])  # a URL's shard, in the cache and kept there while read
            try:
                descriptor = open_shard(self.path, index, shard)
            except BaseException:
                if lease is not None:
                    lease.release()
                raise
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
                        image = bytes(view[offset : offset + int(index.image_size[s])])
                        if names is None:
                            yield s, image
                            continue
                        extras = []
                        for offsets, sizes in columns:  # each field member, inside the block (written after the image)
                            at, size = int(offsets[s]) - base, int(sizes[s])
                            extras.append(bytes(view[at : at + size]) if 0 <= at and at + size <= len(block) else
                                          read_exact(descriptor, size, int(offsets[s]), self.path / index.files[shard]))
                        yield s, (image, extras)
                    sample = end
            finally:
                os.close(descriptor)
                if lease is not None:
                    lease.release()

