"""Probe datasets of ready batches: a loader over one of them measures only what it costs to
hand such a batch from a worker to the loop (``fastdata tune``'s hand-over per backend, and the
``probe transfer`` rows of ``fastdata.sweep``). They live here, below both, so that the bench
never imports the tuner."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fastdata.loading.fetch import BatchFetcher


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, tuple):
        return tuple(_clone(v) for v in value)
    if isinstance(value, list):
        return [_clone(v) for v in value]
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


class ReadyBatches(torch.utils.data.Dataset):
    """A probe: every index array returns a fresh copy of one real batch, so a loader over it
    measures only what it costs to hand such a batch from a worker to the loop."""

    supports_index_arrays = True

    def __init__(self, batch: Any, length: int):
        self.batch = batch
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, indices: Any) -> Any:
        return _clone(self.batch)


class ReadyBatchesOf(ReadyBatches):
    """:class:`ReadyBatches` whose batch is read from ``dataset`` by :meth:`prepare`, in the
    process that measures (``fastdata.sweep`` forks one per configuration from a parent that
    must not read: a parent that ran torch's intra-op threads can leave a forked child hung)."""

    def __init__(self, dataset: Any, batch_size: int, length: int):
        super().__init__(None, length)
        self.dataset, self.batch_size = dataset, batch_size

    def prepare(self) -> None:
        if self.batch is None:
            indices = np.arange(min(self.batch_size, len(self.dataset)), dtype=np.int64)
            self.batch = BatchFetcher(self.dataset)(indices)

    def __getitem__(self, indices: Any) -> Any:
        self.prepare()
        return _clone(self.batch)
