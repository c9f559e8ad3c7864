"""Samplers that order an epoch for a storage layout (each index exactly once per epoch)."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from fastdata.errors import InvalidOptionError


class EpochSampler(Sampler):
    """Base of fastdata's samplers: one permutation per epoch from :meth:`order`, yielded as
    ints, or (with ``batch_size``) as sorted index arrays, one per batch.

    The order depends only on ``(seed, epoch)``; the epoch advances after each full pass, or is
    set with :meth:`set_epoch`. Without a seed, one is drawn from torch's generator, like
    ``RandomSampler`` (so ``torch.manual_seed`` makes it reproducible). Sorting within a batch
    changes no batch's contents but makes reads from disk sequential.
    """

    def __init__(self, length: int, *, batch_size: int | None, drop_last: bool, seed: int | None):
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0
        ):
            raise InvalidOptionError(f"Invalid batch_size {batch_size!r}. Use a positive integer.")
        self.length = length
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.seed = int(torch.empty((), dtype=torch.int64).random_().item()) if seed is None else seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self, epoch: int) -> np.ndarray:
        """The permutation of one epoch."""
        raise NotImplementedError

    def __len__(self) -> int:
        if self.batch_size is None:
            return self.length
        return self.length // self.batch_size if self.drop_last else -(-self.length // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        order = self.order(self.epoch)
        self.epoch += 1
        if self.batch_size is None:
            yield from order.tolist()
            return
        for batch in range(len(self)):
            yield np.sort(order[batch * self.batch_size : (batch + 1) * self.batch_size])


class BatchIndexSampler(EpochSampler):
    """Yields batches of indices: slices of one seeded permutation per epoch, each sorted
    (or ``0..N-1`` in order without ``shuffle``).

    Every index appears exactly once per epoch (the last batch is short unless ``drop_last``);
    see :class:`fastdata.samplers.EpochSampler` for seeding and epochs.
    """

    def __init__(
        self,
        length: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int | None = None,
    ):
        if batch_size is None:
            raise InvalidOptionError("Invalid batch_size None. Use a positive integer.")
        super().__init__(length, batch_size=batch_size, drop_last=drop_last, seed=seed)
        self.shuffle = shuffle

    def order(self, epoch: int) -> np.ndarray:
        if self.shuffle:
            return np.random.default_rng([self.seed, epoch]).permutation(self.length)
        return np.arange(self.length)


class ChunkShuffleSampler(EpochSampler):
    """Shuffles chunk order, then samples within a window of ``window_chunks`` chunks.

    For compressed HDF5 files, where a random single-image read decompresses a whole chunk:
    each window's chunks are decompressed once (they fit ``HDF5Dataset``'s chunk cache) instead
    of once per image. Every index appears exactly once per epoch; the order depends only on
    ``(seed, epoch)``. ``data_source`` is a dataset (its ``chunk_images`` is used; a contiguous
    one counts as one chunk, i.e. a plain shuffle) or a length with ``chunk_images`` given.
    Without ``batch_size`` it yields ints (for ``DataLoader(ds, sampler=...)``); with it,
    sorted index arrays (for ``DataLoader(ds, batch_size=None, sampler=...)``: one read per batch).
    """

    def __init__(
        self,
        data_source: Any,
        *,
        chunk_images: int | None = None,
        window_chunks: int = 4,
        batch_size: int | None = None,
        drop_last: bool = False,
        seed: int | None = None,
    ):
        length = data_source if isinstance(data_source, int) else len(data_source)
        super().__init__(length, batch_size=batch_size, drop_last=drop_last, seed=seed)
        chunk_images = chunk_images or getattr(data_source, "chunk_images", None) or max(self.length, 1)
        for name, value in (("chunk_images", chunk_images), ("window_chunks", window_chunks)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidOptionError(f"Invalid {name} {value!r}. Use a positive integer.")
        self.chunk_images = chunk_images
        self.window_chunks = window_chunks

    def order(self, epoch: int) -> np.ndarray:
        """The permutation of one epoch."""
        rng = np.random.default_rng([self.seed, epoch])
        chunks = rng.permutation(-(-self.length // self.chunk_images))
        pieces = []
        for first in range(0, len(chunks), self.window_chunks):
            window = np.concatenate([
                np.arange(c * self.chunk_images, min((c + 1) * self.chunk_images, self.length))
                for c in chunks[first : first + self.window_chunks]
            ])
            pieces.append(rng.permutation(window))
        return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)
