"""``fastdata.loader``: batches read with one ``dataset[indices]`` call each, on one of three
backends that differ only in *who* computes a batch and *how* it reaches the consumer.

One :class:`~fastdata.loading.samplers.BatchIndexSampler` decides the order of an epoch before any
parallelism, so every backend and every ``num_workers`` yields the same batches in the same
order as ``num_workers=0``.

* ``"torch"`` (default): a ``DataLoader(batch_size=None)`` over the sampler; worker processes
  send each batch through torch's shared-memory pickling, a fastdata reader's written in place
  into a few reused segments per worker (:mod:`fastdata.reader.handover`).
* ``"thread"``: ``num_workers`` threads in this process (:mod:`fastdata.loading.threads`).
* ``"process"``: worker processes writing into reusable shared-memory slots
  (:mod:`fastdata.loading.processes`).

What differs between them (class, capabilities, tie order, words) is one row each in
:data:`fastdata.loading.backends.BACKENDS`.

At ``num_workers=0`` every backend runs the same serial loop (:mod:`fastdata.loading.serial`):
each batch computed in the calling thread, no DataLoader iterator, thread or process.

The sampler splits each epoch across distributed ranks first, then the backend shares this
rank's batches among its workers; ``state_dict()``/``load_state_dict()`` continue an epoch
where it stopped (see :class:`~fastdata.loading.samplers.EpochSampler`). ``pad=`` pads the
variable fields of a batch into one tensor (:mod:`fastdata.loading.padding`).
"""

from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader

from fastdata.errors import InvalidOptionError
from fastdata.loading.backends import BACKENDS, DEFAULT_BACKEND, Backend, backend_names, get_backend
from fastdata.loading.base import BatchLoader, Resumable, WorkerError
from fastdata.loading.fetch import accepts_index_arrays
from fastdata.loading.samplers import BatchIndexSampler

__all__ = ["BACKENDS", "Backend", "BatchLoader", "WorkerError", "accepts_index_arrays", "backend_names", "loader"]

_DATALOADER_ONLY = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
_SHARED = ("pin_memory", "timeout", "worker_init_fn", "prefetch_factor", "persistent_workers", "collate_fn")


def loader(
    dataset: Any,
    batch_size: int = 256,
    shuffle: bool = True,
    num_workers: int | str = 0,
    drop_last: bool = False,
    seed: int | None = None,
    *,
    backend: str | None = None,
    zero_copy: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    even: bool = True,
    pad: Any = None,
    max_workers: int | None = None,
    memory_budget: int | str | None = None,
    **dataloader_kwargs: Any,
) -> Any:
    """Batches of ``dataset``, each read with one ``dataset[indices]`` call.

    ``dataset`` is any map-style dataset: one that accepts an index array (every fastdata
    map-style reader, ``TensorDataset``) returns each batch from one call; any other is read
    per index and collated with torch's ``default_collate`` (or ``collate_fn``). ``backend``
    is ``"torch"`` (a DataLoader; other keywords go to it), ``"thread"`` or ``"process"`` (both
    take ``pin_memory``, ``timeout``, ``worker_init_fn``, ``prefetch_factor``,
    ``persistent_workers``, ``collate_fn``; ``"process"`` also ``multiprocessing_context`` and
    ``zero_copy``. The process backend lends each batch's shared-memory slot to the loop: its
    tensors are valid for as long as they are kept, and the slot returns to its worker when they
    are dropped (batches beyond the slots a worker can spare are copied). With ``zero_copy=k``
    a batch's tensors are views of shared memory that stay valid until ``k`` more batches have
    been drawn, kept or not). ``num_workers=0`` computes every batch in
    this thread, whatever the backend. Reshuffle per epoch happens automatically;
    ``loader.sampler.set_epoch(e)`` (or ``loader.set_epoch(e)``) pins it.

    Distributed: ``rank``/``world_size`` default to torch.distributed's when it is initialised;
    each rank reads its own block of every epoch's permutation (``even=True``: the same number
    of samples on every rank, like ``DistributedSampler``; ``even=False``: every sample exactly
    once). Without ``seed``, rank 0 draws one and shares it. ``loader.state_dict()`` says where
    the loader is (epoch, batches consumed, the layout that cut them: a few hundred bytes);
    ``load_state_dict(state)`` continues with the first batch not consumed, whatever the backend
    or ``num_workers``, and in another ``world_size`` or ``batch_size`` reads the samples of that
    epoch no rank had read, once each (:mod:`fastdata.loading.order`).

    ``pad`` (datasets with fields, docs/fields.md): variable-first-dimension arrays (boxes,
    keypoints) come padded to each batch's longest instead of as lists, as
    ``torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=fill)`` pads them, with
    each sample's length beside them as ``<key>_length`` (int64 ``(B,)``; a field at a tuple position
    becomes ``(padded, lengths)``). ``pad=True`` pads every such field with 0, a list of names
    those, a dict ``{"boxes": 0.0, "labels": -1}`` each with its fill value (of the field's dtype).

    ``num_workers="auto"`` (backend ``"auto"`` by default: threads or processes; or a backend named)
    starts at once at ``num_workers=0`` and changes workers between batches while the loop runs,
    within the usable cores, ``memory_budget`` (bytes or ``"8GB"``; default half the available RAM)
    and ``max_workers``; the batches are those of any fixed setting. Its decisions are logged on
    the ``fastdata`` logger and kept in ``loader.tuning_log``; ``loader.tuned`` is the setting to pin
    (:mod:`fastdata.loading.autoloader`).
    """
    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset):
        suggestion = _map_reader_of(dataset)
        raise InvalidOptionError(
            f"fastdata.loader needs a map-style dataset (random access by index), but got the iterable "
            f"{type(dataset).__name__}.{suggestion} Or iterate it with a plain DataLoader."
        )
    for name in _DATALOADER_ONLY:
        if name in dataloader_kwargs:
            raise InvalidOptionError(f"loader() sets {name!r} itself; pass batch_size/shuffle/drop_last directly.")
    if num_workers == "auto" or backend == "auto" or max_workers is not None or memory_budget is not None:
        return _auto_loader(dataset, batch_size, shuffle, num_workers, drop_last, seed, backend=backend,
                            zero_copy=zero_copy, sampling=dict(rank=rank, world_size=world_size, even=even), pad=pad,
                            max_workers=max_workers, memory_budget=memory_budget, kwargs=dataloader_kwargs)
    backend = DEFAULT_BACKEND if backend is None else backend
    row = get_backend(backend)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise InvalidOptionError(f"Invalid num_workers {num_workers!r}. Use 0, a positive integer or 'auto'.")
    if isinstance(zero_copy, bool) or not isinstance(zero_copy, int) or zero_copy < 0:
        raise InvalidOptionError(f"Invalid zero_copy {zero_copy!r}. Use 0 (copy batches out) or a number of batches >= 1.")
    if zero_copy and not row.shared_memory_ring:
        ring = [name for name, other in BACKENDS.items() if other.shared_memory_ring]
        raise InvalidOptionError(f"zero_copy applies to backend={' or '.join(map(repr, ring))} only "
                                 f"(got backend={backend!r}).")
    padding = _padding(dataset, pad, dataloader_kwargs) if pad is not None and pad is not False else None
    sampler = BatchIndexSampler(len(dataset), batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed,
                                rank=rank, world_size=world_size, even=even)
    sampler.arrange = getattr(dataset, "arrange_batch", None)  # a mix groups each batch per source
    if row.dataloader_options:
        return _torch_loader(dataset, sampler, num_workers, dataloader_kwargs, padding)
    return _own_loader(dataset, sampler, num_workers, row, zero_copy, dataloader_kwargs, padding)


class TorchLoader(Resumable, DataLoader):
    """The ``torch`` backend: a DataLoader over the batch sampler, with the loader's epoch
    position (``state_dict``/``load_state_dict``, ``set_epoch``) like the other backends.

    It is a DataLoader (built, checked and described by ``DataLoader.__init__``) at every
    ``num_workers``, but at ``num_workers=0`` an epoch is fastdata's serial loop
    (:func:`~fastdata.loading.serial.serial_batches`), not a DataLoader iterator: the same
    batches, collated and pinned as the DataLoader would, in the calling thread. Only
    ``generator`` and ``pin_memory_device``, whose effects live in the DataLoader's iterator,
    keep that iterator at ``num_workers=0`` (see :attr:`serial`)."""

    backend = "torch"

    def __init__(self, dataset: Any, index_sampler: BatchIndexSampler, **kwargs: Any):
        self.index_sampler = index_sampler
        DataLoader.__init__(self, dataset, **kwargs)

    @property
    def serial(self) -> bool:
        """Whether an epoch runs as the serial loop: ``num_workers=0``, without ``generator``
        (a DataLoader iterator draws a seed from it per epoch) or ``pin_memory_device``."""
        return self.num_workers == 0 and self.generator is None and not self.pin_memory_device

    def __iter__(self) -> Iterator[Any]:
        if self.serial:
            return self.tracked(self._serial_epoch)
        from fastdata.machine import preload_worker_imports

        preload_worker_imports()
        shared = self.worker_init_fn
        if not isinstance(shared, SharedBatches) or not shared.count:
            return self.tracked(self._workers_epoch)
        from fastdata.loading import spares
        from fastdata.reader.handover import BatchSlots

        if shared.slots is None or not (self.persistent_workers and self._iterator is not None):
            # new workers, new slots: forked ones start with segments an earlier epoch's workers wrote in
            given = spares.take_storages(self.num_workers * shared.count) if self._forks() else []
            shared.slots = BatchSlots(self.num_workers, shared.count, given)
        give_back = not self.persistent_workers  # the workers end with the epoch: their segments are kept
        return self.tracked(lambda: _watched(self._workers_epoch(), shared.slots, give_back))

    def _workers_epoch(self) -> Iterator[Any]:
        """The DataLoader's iterator; where its workers end with the epoch, they are stopped behind
        the loop once the last batch arrives (:func:`~fastdata.loading.teardown.retiring`) instead
        of the loop waiting for their exit when it asks for the batch after the last."""
        before = self.index_sampler.drawn
        batches = DataLoader.__iter__(self)
        drawn = self.index_sampler.drawn  # the pass this iterator draws from (it has drawn ahead already)
        if not self.num_workers or self.persistent_workers or drawn is before:
            return batches
        from fastdata.loading.teardown import retiring

        return retiring(batches, drawn)

    def _forks(self) -> bool:
        """Whether this loader's workers start by fork (they then inherit this process's mappings)."""
        import torch.multiprocessing

        context = self.multiprocessing_context
        return (context.get_start_method() if context is not None
                else torch.multiprocessing.get_start_method()) == "fork"

    def _serial_epoch(self) -> Iterator[Any]:
        from fastdata.loading.serial import DataLoaderFetch, dataloader_pinning, serial_batches

        pin = dataloader_pinning(self.pin_memory)
        fetch = DataLoaderFetch(self.dataset, self.collate_fn, per_sample=self._auto_collation)
        return serial_batches(self.index_sampler, fetch, pin)


def _padding(dataset: Any, pad: Any, kwargs: dict[str, Any]) -> Any:
    """The checked ``pad`` option as a :class:`~fastdata.loading.padding.Padding` (fastdata readers of
    datasets with fields only)."""
    if getattr(dataset, "schema", None) is None or not accepts_index_arrays(dataset):
        raise InvalidOptionError(
            f"pad applies to fastdata readers of datasets with fields (boxes, keypoints); {type(dataset).__name__} "
            "has none. Pad in a collate_fn (torch.nn.utils.rnn.pad_sequence) instead.")
    if kwargs.get("collate_fn") is not None:
        raise InvalidOptionError("pad pads fastdata's own batches; with a collate_fn, pad in it "
                                 "(torch.nn.utils.rnn.pad_sequence) and leave pad out.")
    from fastdata.loading.padding import Padding  # only datasets with fields need it

    return Padding(dataset, pad)


class PaddedConvert:
    """The torch backend's ``collate_fn`` with ``pad``: the batch padded, then what a
    DataLoader with ``batch_size=None`` does to it (``default_convert``). Picklable."""

    def __init__(self, padding: Any):
        self.padding = padding

    def __call__(self, batch: Any) -> Any:
        from fastdata.loading.serial import converted

        return converted(self.padding(batch))


class SharedBatches:
    """The torch backend's ``worker_init_fn`` for fastdata readers: the worker's reads build
    their batches in shared memory, in :attr:`slots` reused while the training loop has let go
    of them (:mod:`fastdata.reader.handover`: the DataLoader then sends them without copying),
    then the user's ``worker_init_fn`` (:attr:`fn`) runs. Picklable."""

    def __init__(self, fn: Any = None, count: int = 0):
        self.fn = fn
        self.count = count  # slots per worker; 0: a new segment per batch
        self.slots: Any = None  # the BatchSlots of the workers being started (TorchLoader sets it)

    def __call__(self, worker_id: int) -> None:
        from fastdata.reader.handover import share_batches

        share_batches(self.slots, worker_id)
        if self.fn is not None:
            self.fn(worker_id)


def _watched(batches: Iterator[Any], slots: Any, give_back: bool = False) -> Iterator[Any]:
    """The DataLoader's batches, each watched so its slot is reused once the loop lets go of it;
    with ``give_back``, an epoch that ran to its end (its workers, stopping, write nothing more)
    leaves the segments of the slots let go of for the next workers (:mod:`fastdata.loading.spares`)."""
    for batch in batches:
        slots.received(batch)
        yield batch
        del batch  # not held while the next one comes
        slots.poll()  # before the DataLoader asks a worker for another batch: the one the loop dropped is free
    if give_back:
        from fastdata.loading import spares

        spares.keep_storages(slots.release())


def _torch_loader(dataset: Any, sampler: BatchIndexSampler, num_workers: int, kwargs: dict[str, Any],
                  padding: Any = None) -> DataLoader:
    collate_fn = kwargs.pop("collate_fn", None)
    count = 0  # slots per worker
    if accepts_index_arrays(dataset) and num_workers:
        # slots only where each batch reaches the loop as read (a pinned or padded batch is a new one)
        count = 0 if padding is not None or collate_fn is not None or kwargs.get("pin_memory") \
            else (kwargs.get("prefetch_factor") or 2) + 2
        kwargs["worker_init_fn"] = SharedBatches(kwargs.get("worker_init_fn"), count)
    if padding is not None:
        return TorchLoader(dataset, sampler, batch_size=None, sampler=sampler, num_workers=num_workers,
                           collate_fn=PaddedConvert(padding), **kwargs)
    if accepts_index_arrays(dataset) and collate_fn is None:
        if count:
            from fastdata.reader.handover import SlotConvert  # the labels leave in the pixels' slot

            kwargs["collate_fn"] = SlotConvert()
        return TorchLoader(dataset, sampler, batch_size=None, sampler=sampler, num_workers=num_workers, **kwargs)
    # per-sample datasets: the same batches, fetched per index and collated by torch
    from torch.utils.data import default_collate

    return TorchLoader(dataset, sampler, batch_sampler=_ListBatches(sampler), num_workers=num_workers,
                       collate_fn=collate_fn or default_collate, **kwargs)


class _ListBatches:
    """The sampler's batches as lists (what a DataLoader ``batch_sampler`` yields)."""

    def __init__(self, sampler: BatchIndexSampler):
        self.sampler = sampler

    def __iter__(self):
        from fastdata.loading.samplers import epoch_list

        return (epoch_list(batch, batch.epoch) for batch in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)


def _own_loader(dataset: Any, sampler: BatchIndexSampler, num_workers: int, backend: Backend, zero_copy: int,
                kwargs: dict[str, Any], padding: Any = None) -> BatchLoader:
    allowed = set(_SHARED) | backend.options
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        passing = [repr(name) for name, row in BACKENDS.items() if row.dataloader_options]
        raise InvalidOptionError(
            f"Option {unknown[0]!r} does not apply to backend={backend.name!r}. It takes: {', '.join(sorted(allowed))} "
            f"(backend={' or '.join(passing)} passes any DataLoader option on)."
        )
    if num_workers == 0:
        from fastdata.loading.serial import SerialLoader

        return SerialLoader(dataset, sampler, num_workers=0, backend=backend.name, padding=padding,
                            **{k: v for k, v in kwargs.items() if k in _SHARED})
    ring = {"zero_copy": zero_copy} if backend.shared_memory_ring else {}
    return backend.loader_class()(dataset, sampler, num_workers=num_workers, padding=padding, **ring, **kwargs)


def _map_reader_of(dataset: Any) -> str:
    """" Use X(path) instead." when ``dataset`` is an iterable fastdata reader that names its
    map-style counterpart (its class's ``map_reader``, as :class:`fastdata.TarDataset` does)."""
    reader = getattr(type(dataset), "map_reader", None)
    if reader is None:
        return ""
    path = getattr(dataset, "path", "PATH")
    return f" Use fastdata.{reader.__name__}({str(path)!r}) for the same data, map-style."


# --- num_workers="auto" (fastdata.loading.autoloader: the loader; fastdata.loading.autotune: the search) ---


def _auto_loader(dataset: Any, batch_size: int, shuffle: bool, num_workers: Any, drop_last: bool, seed: int | None, *,
                 backend: str | None, zero_copy: int, sampling: dict[str, Any], pad: Any, max_workers: Any,
                 memory_budget: Any, kwargs: dict[str, Any]) -> Any:
    """The self-tuning loader: the options checked once, then an AutoLoader that builds the fixed
    loader of each setting it tries with :func:`_torch_loader` or :func:`_own_loader`."""
    import psutil

    from fastdata.loading.autoloader import MEMORY_SHARE, AutoLoader
    from fastdata.loading.autotune import Budget
    from fastdata.loading.worker_options import check_worker_options
    from fastdata.machine import usable_cores
    from fastdata.quantities import parse_bytes, parse_count

    if num_workers != "auto":
        raise InvalidOptionError(f"backend='auto', max_workers and memory_budget go with num_workers='auto' "
                                 f"(got num_workers={num_workers!r}).")
    backends = ("thread", "process") if backend in (None, "auto") else (backend,)
    if backends[0] not in BACKENDS:
        raise InvalidOptionError(f"Unknown backend {backend!r}. Allowed: 'auto', {', '.join(map(repr, BACKENDS))}.")
    for name in _DATALOADER_ONLY:
        if name in kwargs:
            raise InvalidOptionError(f"loader() sets {name!r} itself; pass batch_size/shuffle/drop_last directly.")
    if zero_copy:
        raise InvalidOptionError("zero_copy does not go with num_workers='auto' (batches are copied or lent).")
    if len(backends) > 1:
        allowed = set(_SHARED) | {"multiprocessing_context"}
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise InvalidOptionError(f"Option {unknown[0]!r} does not apply to backend='auto'. It takes: "
                                     f"{', '.join(sorted(allowed))}.")
    check_worker_options(dataset, kwargs, backends)
    limit = parse_count(max_workers, flag="max_workers", minimum=0, allow_none=True)
    memory = parse_bytes(memory_budget, flag="memory_budget") if memory_budget is not None \
        else int(MEMORY_SHARE * psutil.virtual_memory().available)
    padding = _padding(dataset, pad, kwargs) if pad is not None and pad is not False else None
    sampler = BatchIndexSampler(len(dataset), batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, **sampling)
    sampler.arrange = getattr(dataset, "arrange_batch", None)  # a mix groups each batch per source
    budget = Budget(cores=usable_cores(), memory_bytes=memory, max_workers=limit, backends=backends)
    return AutoLoader(dataset, sampler, build=_FixedBuilder(dataset, kwargs, padding), backend=backend or "auto",
                      budget=budget, prefetch=kwargs.get("prefetch_factor") or 2)


class _FixedBuilder:
    """``build(setting, sampler)`` -> the fixed loader of one setting over ``sampler`` (workers kept
    across epochs while the setting runs)."""

    def __init__(self, dataset: Any, kwargs: dict[str, Any], padding: Any):
        self.dataset, self.kwargs, self.padding = dataset, kwargs, padding

    def __call__(self, setting: Any, sampler: Any) -> Any:
        row = get_backend(setting.backend)
        options = dict(self.kwargs)
        if not (setting.num_workers and (row.dataloader_options or "multiprocessing_context" in row.options)):
            options.pop("multiprocessing_context", None)  # a DataLoader refuses it at num_workers=0
        if setting.num_workers:
            options["prefetch_factor"] = setting.prefetch
            options["persistent_workers"] = True
        else:
            options.pop("prefetch_factor", None)
            options.pop("persistent_workers", None)
        if row.dataloader_options:
            return _torch_loader(self.dataset, sampler, setting.num_workers, options, self.padding)
        return _own_loader(self.dataset, sampler, setting.num_workers, row, 0, options, self.padding)
