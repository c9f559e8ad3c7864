"""``num_workers=0``, on every backend: each batch computed in the calling thread, in order, with
nothing between the sampler and the dataset (no DataLoader iterator, no thread, no process).

:func:`serial_batches` is the one loop. :class:`SerialLoader` runs it for the ``thread`` and
``process`` backends; the ``torch`` backend's :class:`~fastdata.loading.TorchLoader` runs it too,
with :class:`DataLoaderFetch` doing what a DataLoader's fetcher does with each batch, so a
batch comes out exactly as a DataLoader at ``num_workers=0`` would give it.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import default_convert

from fastdata.loading.base import BatchLoader
from fastdata.loading.fetch import batch_reader, read_samples


def serial_batches(sampler: Iterable[np.ndarray], fetch: Callable[[np.ndarray], Any],
                   pin: Callable[[Any], Any] | None = None) -> Iterator[Any]:
    """The batches of one epoch: ``fetch(indices)`` for each of the sampler's index arrays
    (drawn at the first ``next()``, as a DataLoader at ``num_workers=0`` draws them), then
    ``pin(batch)`` when given."""
    if pin is None:
        for indices in list(sampler):
            yield fetch(indices)
    else:
        for indices in list(sampler):
            yield pin(fetch(indices))


class SerialLoader(BatchLoader):
    """``num_workers=0`` on the ``thread`` and ``process`` backends (``backend`` says which was
    asked for: ``state_dict()`` records it)."""

    def __init__(self, *args: Any, backend: str, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.backend = backend

    def epoch_iter(self) -> Iterator[Any]:
        return serial_batches(self.sampler, self.fetch, self.pinned if self.pin_memory else None)


def converted(batch: Any) -> Any:
    """``default_convert(batch)`` (what a DataLoader with ``batch_size=None`` applies to each
    batch: numpy arrays become tensors, a tuple becomes a list), without its walk for the usual
    tuple of tensors."""
    if type(batch) is tuple:
        for item in batch:
            if not isinstance(item, torch.Tensor):
                return default_convert(batch)
        return list(batch)
    return default_convert(batch)


class DataLoaderFetch:
    """``fetch(indices)`` -> the batch a DataLoader's map-style fetcher makes of ``indices``:
    with ``per_sample`` (a ``batch_sampler``), the samples from ``__getitems__`` (or one
    ``dataset[i]`` each) given to ``collate_fn``; otherwise ``collate_fn(dataset[indices])``,
    where ``collate_fn`` is ``default_convert`` unless the user set another."""

    def __init__(self, dataset: Any, collate_fn: Callable[[Any], Any], *, per_sample: bool):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.per_sample = per_sample
        self.read = batch_reader(dataset)

    def __call__(self, indices: np.ndarray) -> Any:
        if self.per_sample:
            return self.collate_fn(read_samples(self.dataset, indices))
        if self.collate_fn is default_convert:
            return converted(self.read(indices))
        return self.collate_fn(self.read(indices))


def dataloader_pinning(pin_memory: bool) -> Callable[[Any], Any] | None:
    """How a DataLoader iterator pins batches at ``num_workers=0``: its warnings (on every new
    iterator, as the DataLoader gives them), and ``pin_memory`` to the current accelerator, or
    None where nothing is pinned."""
    if not pin_memory:
        return None
    if not torch.accelerator.is_available():
        warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device pinned "
                      "memory won't be used.", UserWarning, stacklevel=4)
        return None
    accelerator = torch.accelerator.current_accelerator()
    device = accelerator.type if accelerator is not None else None
    if device == "mps":
        warnings.warn("'pin_memory' argument is set as true but not supported on MPS now, device pinned memory "
                      "won't be used.", UserWarning, stacklevel=4)
        return None
    from torch.utils.data._utils.pin_memory import pin_memory as pin

    return lambda batch: pin(batch, device)
