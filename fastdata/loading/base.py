"""What every loader backend shares: the batch order (one :class:`~fastdata.loading.samplers.BatchIndexSampler`
decides it before any parallelism), the epoch, ``len()``, and the errors a worker can cause."""

from __future__ import annotations

import warnings
from typing import Any, Iterator

import numpy as np
import torch

from fastdata.errors import FastdataError, InvalidOptionError
from fastdata.loading.fetch import BatchFetcher
from fastdata.loading.samplers import BatchIndexSampler, earliest
from fastdata.loading.worker_options import check_prefetch_factor


class WorkerError(FastdataError, RuntimeError):
    """A loader worker failed (raised, died or timed out); the message names the worker, the
    batch and its indices, and the cause."""


def describe_indices(indices: np.ndarray, shown: int = 8) -> str:
    values = indices.tolist()
    text = ", ".join(map(str, values[:shown]))
    return f"[{text}{', ...' if len(values) > shown else ''}] ({len(values)} samples)"


class Resumable:
    """The loader's place in its epochs, for every backend: batches are counted as they reach the
    consumer (not as workers compute them ahead), so a saved state never skips a batch that was
    prefetched but not used."""

    index_sampler: BatchIndexSampler
    _position: list[Any] | None = None  # [epoch, batches handed out, earlier layouts] while an epoch is under way

    def tracked(self, start: Any) -> Iterator[Any]:
        """The batches of one epoch, from ``start()``, counted as they are handed out. The
        position is read where the epoch is drawn from the sampler: before ``start`` runs where
        that draws (a DataLoader's iterator draws as soon as it exists), else at the first batch
        asked for (the thread and process backends, auto: ``zip(loader, loader)`` makes both
        iterators before either draws, and the second reads the next epoch)."""
        sampler = self.index_sampler
        position: list[Any] | None = [sampler.epoch, sampler.resume_at, sampler.stages]
        drawn = sampler.drawn
        batches = start()
        if sampler.drawn is drawn:  # not drawn yet: at the first batch
            position = None
        else:
            self._position = position
        return self._counted(position, batches)

    def _counted(self, position: list[Any] | None, batches: Iterator[Any]) -> Iterator[Any]:
        # the count lives in ``position`` (one list per epoch), not in an attribute set per batch:
        # on the torch backend every attribute set goes through DataLoader.__setattr__
        if position is None:
            sampler = self.index_sampler
            self._position = position = [sampler.epoch, sampler.resume_at, sampler.stages]
        try:
            for batch in batches:
                position[1] += 1
                yield batch
                del batch  # not held while the next one is fetched: a lent batch frees its slot when the loop drops it
            if self._position is position:
                self._position = None
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: the epoch under way and how many of its batches were handed out
        (or, between epochs, the next epoch and 0), with the seed and the layout that cut the
        batches. Save it with the model's checkpoint; see :meth:`load_state_dict`. A dataset that
        has an order of its own (a :func:`fastdata.mix`) adds what identifies it (``"dataset"``)."""
        sampler = self.index_sampler
        state = sampler.state_at(*self._position) if self._position is not None else sampler.state_dict()
        state["backend"] = self.backend
        identity = getattr(self.dataset, "order_identity", None)
        if identity is not None:
            state["dataset"] = identity()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (saved by any rank): the next iteration yields the batches of
        ``state["epoch"]`` not yet handed out when it was saved, then epochs go on as usual. The
        same layout continues at the saved batch; another ``world_size``, ``batch_size``,
        ``even`` or ``drop_last`` reads what the saved job had not read of that epoch, split across
        the new ranks (every rank of the saved job is taken to have handed out as many batches as
        the one that saved, or all of its own). Backend and ``num_workers`` may differ. Its seed
        comes from the state; another dataset (length, mix) or explicit seed is refused."""
        state = earliest(state, kind=type(self.index_sampler).__name__)  # every field checked before any is used
        check = getattr(self.dataset, "check_order_identity", None)
        if check is not None:
            check(state.get("dataset"))
        elif state.get("dataset") is not None:
            raise InvalidOptionError(f"Cannot resume: the saved state is of a fastdata.mix, but this loader reads "
                                     f"{type(self.dataset).__name__}. Build the loader over the mix it was saved with.")
        self.index_sampler.load_state_dict(state)
        self._position = None

    def set_epoch(self, epoch: int) -> None:
        """Pin the next epoch's order (``DistributedSampler.set_epoch``'s job)."""
        self.index_sampler.set_epoch(epoch)


class BatchLoader(Resumable):
    """Base of the ``thread`` and ``process`` backends: iterating yields the batches of one
    epoch in the sampler's order; the next iteration is the next epoch (``sampler.set_epoch``
    pins one)."""

    backend = ""

    def __init__(self, dataset: Any, sampler: BatchIndexSampler, *, num_workers: int, collate_fn: Any = None,
                 prefetch_factor: int | None = 2, timeout: float = 0, worker_init_fn: Any = None,
                 pin_memory: bool = False, persistent_workers: bool = False, padding: Any = None):
        self.dataset = dataset
        self.sampler = sampler
        self.index_sampler = sampler
        self.batch_sampler = sampler
        self.batch_size = sampler.batch_size
        self.num_workers = num_workers
        self.fetch = BatchFetcher(dataset, collate_fn, padding)
        self.prefetch_factor = check_prefetch_factor(prefetch_factor)
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        if pin_memory and not torch.cuda.is_available():  # what the DataLoader does without an accelerator
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device pinned "
                          "memory won't be used.", UserWarning, stacklevel=3)
            pin_memory = False
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers

    def __len__(self) -> int:
        return len(self.sampler)

    def epoch_batches(self) -> list[np.ndarray]:
        """The index arrays of the next epoch (advances the sampler's epoch)."""
        return list(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        return self.tracked(self.epoch_iter)

    def epoch_iter(self) -> Iterator[Any]:
        """The batches of one epoch (each backend's own)."""
        raise NotImplementedError

    def pinned(self, batch: Any) -> Any:
        """The batch's tensors in pinned memory when ``pin_memory`` (and CUDA is there)."""
        if not self.pin_memory:
            return batch
        from torch.utils.data._utils.pin_memory import pin_memory

        return pin_memory(batch)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(backend={self.backend!r}, num_workers={self.num_workers}, "
                f"batch_size={self.batch_size}, batches={len(self)})")
