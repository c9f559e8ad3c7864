"""``fastdata.loader``: a DataLoader whose every batch is one vectorised read.

The DataLoader runs with ``batch_size=None`` and a :class:`BatchIndexSampler`, so the dataset
receives a whole array of indices at once (``ds[indices]``) and returns a collated batch; no
per-sample fetch, no per-sample collate, no Python int per sample from the sampler.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from fastdata.errors import InvalidOptionError


class BatchIndexSampler(Sampler[np.ndarray]):
    """Yields batches of indices: slices of one seeded permutation per epoch, each sorted.

    Every index appears exactly once per epoch (the last batch is short unless ``drop_last``).
    The order depends only on ``(seed, epoch)``; the epoch advances after each full pass, or is
    set with :meth:`set_epoch`. Sorting within a batch changes no batch's contents but makes
    reads from disk sequential.
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
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise InvalidOptionError(f"Invalid batch_size {batch_size!r}. Use a positive integer.")
        self.length = length
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        # like RandomSampler: without a seed, draw one from torch's generator (torch.manual_seed works)
        self.seed = int(torch.empty((), dtype=torch.int64).random_().item()) if seed is None else seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        if self.drop_last:
            return self.length // self.batch_size
        return -(-self.length // self.batch_size)

    def __iter__(self) -> Iterator[np.ndarray]:
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.length)
        else:
            order = np.arange(self.length)
        self.epoch += 1
        for batch in range(len(self)):
            indices = order[batch * self.batch_size : (batch + 1) * self.batch_size]
            yield np.sort(indices) if self.shuffle else indices


def loader(
    dataset: Any,
    batch_size: int = 256,
    shuffle: bool = True,
    num_workers: int = 0,
    drop_last: bool = False,
    seed: int | None = None,
    **dataloader_kwargs: Any,
) -> DataLoader:
    """A ``DataLoader`` that reads each batch with one ``dataset[indices]`` call.

    ``dataset`` must accept an index array and return a collated batch (every fastdata
    map-style reader does). Extra keyword arguments go to ``DataLoader`` (``pin_memory``,
    ``persistent_workers``, ``prefetch_factor``, ``multiprocessing_context``, ...).
    Reshuffle per epoch happens automatically; ``loader.sampler.set_epoch(e)`` pins it.
    """
    for name in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"):
        if name in dataloader_kwargs:
            raise InvalidOptionError(f"loader() sets {name!r} itself; pass batch_size/shuffle/drop_last directly.")
    sampler = BatchIndexSampler(len(dataset), batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed)
    return DataLoader(dataset, batch_size=None, sampler=sampler, num_workers=num_workers, **dataloader_kwargs)
