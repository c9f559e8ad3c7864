"""The base of map-style readers (:class:`MapDataset`): per-process files, indexing by int,
slice or index array, torch's batched fetch, and collated batches from one vectorised read."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from fastdata.reader.handover import default_allocate
from fastdata.reader.output import ReaderOutput


class MapDataset(ReaderOutput, Dataset):
    """Base of map-style readers. Subclasses set ``labels`` and implement the hooks of
    :class:`fastdata.formats.base.Reader` (``_open``, ``_read``); ``_open()``'s handles are kept
    in ``self._handles``, per process.
    """

    labels: np.ndarray
    epoch: int | None = None  # set_epoch's; None: the crops of a fused transform use torch's global generator

    def __init__(self, transform: Callable | None = None, target_transform: Callable | None = None, **options: Any):
        self._init_options(transform, target_transform, options)
        self._handles: Any = None
        self._pid: int | None = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the reads that do not carry one (``fastdata.loader``'s batches do): with
        a fused transform, sample ``i``'s crop is drawn from ``(seed, epoch, i)``. Without it
        (and without ``fastdata.loader``), crops come from torch's global generator, as
        torchvision's transforms' do."""
        self.epoch = int(epoch)

    def epoch_of(self, indices: Any) -> int | None:
        """The epoch a read of ``indices`` is in: the one ``fastdata.loader``'s batches carry,
        else :meth:`set_epoch`'s (None: not known)."""
        return getattr(indices, "epoch", self.epoch)

    # --- per-process resources ---------------------------------------------------------

    def _open(self) -> Any:
        """This process's handles (:meth:`fastdata.formats.base.Reader._open`); none by default."""
        return None

    def _read(self, indices: np.ndarray, allocate: Callable | None = None, *, pil: bool = False) -> Any:
        """Pixels of ``indices`` (:meth:`fastdata.formats.base.Reader._read`)."""
        raise NotImplementedError

    def _pixels(self, indices: np.ndarray, allocate: Callable | None = None) -> Any:
        return self._read(indices, allocate, pil=self.image_format == "pil")

    @property
    def handles(self) -> Any:
        """This process's open files, opened on first use (and again after a fork)."""
        if self._pid != os.getpid():
            self._handles = self._open()
            self._pid = os.getpid()
        return self._handles

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = None
        state["_pid"] = None
        return state

    # --- indexing ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.labels)

    def _indices(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            return np.arange(*index.indices(len(self)))
        if isinstance(index, torch.Tensor):
            index = index.numpy()
        indices = index if isinstance(index, np.ndarray) else np.asarray(index)
        if indices.ndim != 1 or not (indices.dtype.kind in "iu" or indices.size == 0):
            raise TypeError(
                f"indices must be an int, a slice or a 1-D sequence of ints, got {type(index).__name__}"
            )
        if not indices.size:
            return indices.astype(np.int64)
        length = len(self.labels)
        low, high = indices.min(), indices.max()
        if low >= 0 and high < length:  # the common case: nothing to wrap or refuse
            return indices
        if low < -length or high >= length:
            bad = indices[(indices < -length) | (indices >= length)][0]
            raise IndexError(f"index {bad} is out of range for a dataset of {length} samples")
        return np.where(indices < 0, indices + length, indices)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)) or (isinstance(index, torch.Tensor) and index.ndim == 0):
            position = int(index)
            if not -len(self) <= position < len(self):
                raise IndexError(f"index {position} is out of range for a dataset of {len(self)} samples")
            indices = np.array([position % len(self)])
            if self.schema is not None:
                return self.records.samples(indices)[0]
            return self.output.samples(self._pixels(indices), self.labels[indices])[0]
        return self.get_batch(self._indices(index))

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, Any]]:
        """torch's batched fetch: the samples of ``indices`` from one read, as views."""
        indices = self._indices(indices)
        if self.schema is not None:
            return self.records.samples(indices)
        return self.output.samples(self._pixels(indices), self.labels[indices])

    schema: Any = None  # the fastdata.fields.Schema of a dataset with fields; None for (image, label)

    @property
    def records(self) -> Any:
        """How this reader's samples with fields are built (:class:`fastdata.reader.records.Records`)."""
        from fastdata.reader.records import Records  # only datasets with fields need it

        return Records(self)

    def _reading(self, indices: np.ndarray, names: set[str]) -> Any:
        """What one read of fields ``names`` of ``indices`` takes its values from (``_read``,
        ``_field_values``, the rest of the reader's attributes): this reader, each field read on
        its own; a format that reads several fields' bytes at once gives an object serving them
        (the tar reader: each contiguous byte run read once)."""
        return self

    def _field_values(self, f: Any, indices: np.ndarray) -> Any:
        """One extra field's stored values of ``indices``: the (B, *shape) rows of a fixed field,
        or each sample's stored bytes (:mod:`fastdata.fields`)."""
        raise NotImplementedError

    def get_batch(self, indices: np.ndarray, allocate: Callable | None = None) -> tuple[Any, Any]:
        """A collated batch ``(uint8 [B,C,H,W], int64 [B])`` from one vectorised read (into
        ``allocate``'d memory where given: the process backend's shared-memory slot)."""
        output = self.output
        if allocate is None:  # in a torch DataLoader worker: shared memory (fastdata.reader.handover)
            allocate = default_allocate(as_read=output.batch_transform is None and output.image_format == "tensor")
        if self.schema is not None:
            return self.records.batch(indices, None if output.per_sample else allocate)
        if output.per_sample:
            allocate = None  # transformed samples are new objects anyway
        return output.batch(self._pixels(indices, allocate), self.labels[indices], allocate)
