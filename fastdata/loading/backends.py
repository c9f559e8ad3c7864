"""The loader backends, one row each: :data:`BACKENDS` maps a name (``fastdata.loader(...,
backend=NAME)``) to a :class:`Backend` that says everything that differs between backends: the
loader class that runs it, what it can do (does a batch cross a process, must the dataset be
picklable, is there a shared-memory ring), which one wins a tie, and the words the bench and
tune explanations use for it. The loader, ``fastdata bench``, ``fastdata tune`` and their
explanations read this table and nothing else, so a new backend is one row here and its loader
class.

``num_workers=0`` is no backend of its own: every backend runs the same serial loop there
(:mod:`fastdata.loading.serial`).

This module imports no loader: a row names its class (:attr:`Backend.loader`) and
:meth:`Backend.loader_class` imports it on first use, so reading the table stays cheap.

>>> backend_names()
('torch', 'thread', 'process')
>>> [name for name, row in BACKENDS.items() if row.crosses_process]
['torch', 'process']
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from fastdata.errors import InvalidOptionError

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "Backend", "backend_names", "get_backend", "preference"]


@dataclass(frozen=True)
class Backend:
    """One loader backend: who computes ``dataset[indices]`` and how the batch reaches the loop."""

    name: str
    loader: str  # "module:Class" of its loader (imported by loader_class())
    preference: int  # in a tie between backends, the lowest wins (the simplest for the user)
    crosses_process: bool  # batches come from other processes (a start method applies)
    needs_picklable: bool  # its workers receive the dataset pickled (under spawn/forkserver)
    shares_gil: bool  # its workers run in this process: only the share of a fetch that releases the GIL runs in parallel
    shared_memory_ring: bool  # workers write batches into reusable shared-memory slots (``zero_copy`` applies)
    dataloader_options: bool  # a torch DataLoader: takes any DataLoader keyword
    options: frozenset[str]  # the keywords it takes beyond those every backend takes (without dataloader_options)
    title: str  # "the {title} backend wins"
    workers_name: str  # who hands batches over: "handing it ... costs 2 ms for {workers_name}"
    worker_words: tuple[str, str]  # one worker, several: "2 {worker_words[1]} overlap the fetch"
    reason: str  # why it wins where it does (the bench's short reasons)

    def loader_class(self) -> type:
        """The class that runs this backend with ``num_workers >= 1``."""
        module, _, name = self.loader.partition(":")
        return getattr(importlib.import_module(module), name)

    def worker_noun(self, count: int) -> str:
        """``worker process`` for one, ``worker processes`` for several."""
        return self.worker_words[count != 1]


BACKENDS: dict[str, Backend] = {row.name: row for row in sorted((
    Backend(
        name="torch", loader="fastdata.loading:TorchLoader", preference=0, crosses_process=True,
        needs_picklable=True, shares_gil=False, shared_memory_ring=False, dataloader_options=True,
        options=frozenset(), title="DataLoader", workers_name="DataLoader workers",
        worker_words=("DataLoader worker", "DataLoader workers"), reason="the DataLoader",
    ),
    Backend(
        name="thread", loader="fastdata.loading.threads:ThreadLoader", preference=1, crosses_process=False,
        needs_picklable=False, shares_gil=True, shared_memory_ring=False, dataloader_options=False,
        options=frozenset(), title="thread", workers_name="threads", worker_words=("worker thread", "worker threads"),
        reason="threads hand each batch over by reference (nothing crosses a process boundary) and the read "
               "releases the GIL",
    ),
    Backend(
        name="process", loader="fastdata.loading.processes:ProcessLoader", preference=2, crosses_process=True,
        needs_picklable=True, shares_gil=False, shared_memory_ring=True, dataloader_options=False,
        options=frozenset({"multiprocessing_context"}), title="process",
        workers_name="fastdata's shared-memory process workers", worker_words=("worker process", "worker processes"),
        reason="workers write each batch once into reusable shared memory, read back with one copy (no pickling, "
               "no new segment per batch)",
    ),
), key=lambda row: row.preference)}
DEFAULT_BACKEND = "torch"  # fastdata.loader's default, left out of labels and recommended keywords


def backend_names() -> tuple[str, ...]:
    """Every backend's name, in preference order (the tie-breaking order)."""
    return tuple(BACKENDS)


def get_backend(name: Any, *, what: str = "backend") -> Backend:
    """The row of backend ``name``, or :class:`InvalidOptionError` naming the allowed ones
    (``what``: how the caller's user wrote the option, e.g. ``--backends``)."""
    row = BACKENDS.get(name) if isinstance(name, str) else None
    if row is None:
        raise InvalidOptionError(f"Unknown {what} {name!r}. Allowed: {', '.join(map(repr, BACKENDS))}.")
    return row


def preference(name: str) -> int:
    """The tie-breaking rank of backend ``name`` (an unknown name, e.g. from an old results file, last)."""
    row = BACKENDS.get(name)
    return row.preference if row is not None else len(BACKENDS)
