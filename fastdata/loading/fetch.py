"""Fetching one batch from any map-style dataset, the same way on every backend.

A dataset that accepts an index array (every fastdata map-style reader, ``TensorDataset``, or
any dataset with ``supports_index_arrays = True``) returns the whole batch from one
``dataset[indices]`` call. Any other map-style dataset is read sample by sample (through
torch's batched ``__getitems__`` when it has one) and collated with torch's ``default_collate``
(or the ``collate_fn`` given), as a DataLoader with ``batch_size`` would.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from torch.utils.data import TensorDataset, default_collate

from fastdata.loading.samplers import epoch_list


def accepts_index_arrays(dataset: Any) -> bool:
    """Whether ``dataset[indices]`` returns a collated batch for an index array."""
    from fastdata.reader.mapstyle import MapDataset

    explicit = getattr(dataset, "supports_index_arrays", None)
    if explicit is not None:
        return bool(explicit)
    return isinstance(dataset, (MapDataset, TensorDataset))


def batch_reader(dataset: Any) -> Callable[[np.ndarray], Any]:
    """``dataset[indices]`` for the loader's index arrays (sorted, in range: the sampler cut them
    from ``range(len(dataset))``). A fastdata reader whose indexing is its own is read with
    ``get_batch`` straight away: the same batch without checking and wrapping the indices again."""
    from fastdata.reader.mapstyle import MapDataset

    if isinstance(dataset, MapDataset) and type(dataset).__getitem__ is MapDataset.__getitem__:
        return dataset.get_batch
    return dataset.__getitem__


def read_samples(dataset: Any, indices: np.ndarray) -> list[Any]:
    """The samples of ``indices`` one by one, as a DataLoader's fetcher reads them: through the
    dataset's batched ``__getitems__`` when it has one, else ``dataset[i]`` for each."""
    rows = epoch_list(indices, getattr(indices, "epoch", None))  # the epoch goes on with the list
    getitems = getattr(dataset, "__getitems__", None)
    return getitems(rows) if getitems is not None else [dataset[row] for row in rows]


class BatchFetcher:
    """``fetcher(indices)`` -> the collated batch of ``indices`` (a sorted int64 array).
    Picklable, so process workers run exactly what the main process would."""

    def __init__(self, dataset: Any, collate_fn: Callable | None = None, padding: Callable | None = None):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.padding = padding  # the loader's pad option (fastdata.loading.padding.Padding), applied to each batch
        self.batched = accepts_index_arrays(dataset) and collate_fn is None
        self.read = batch_reader(dataset) if self.batched else None

    def __call__(self, indices: np.ndarray, allocate: Callable | None = None) -> Any:
        """The batch; ``allocate(shape, dtype)`` (the process backend's shared-memory slot) lets
        a fastdata reader write its pixels straight where they are sent from."""
        if self.padding is not None:
            get_batch = getattr(self.dataset, "get_batch", None)
            batch = get_batch(indices, allocate=allocate) if allocate is not None and get_batch is not None \
                else self.read(indices)
            return self.padding(batch)
        if self.batched:
            get_batch = getattr(self.dataset, "get_batch", None)
            if allocate is not None and get_batch is not None:
                return get_batch(indices, allocate=allocate)
            return self.read(indices)
        return (self.collate_fn or default_collate)(read_samples(self.dataset, indices))
