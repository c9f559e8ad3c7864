"""Samplers that order an epoch for a storage layout (each index exactly once per epoch), split
across distributed ranks before anything else, and resumable mid-epoch."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from fastdata.errors import InvalidOptionError
from fastdata.loading.mixchecks import as_integer, checked_seed
from fastdata.loading.order import MAX_STAGES, STATE_VERSION, Layout, epoch_sequence, layout_of, most_items
from fastdata.loading.states import checked_state


def resolve_distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else torch.distributed's when it is initialised, else ``(0, 1)``."""
    if (rank is None) != (world_size is None):
        raise InvalidOptionError("Pass both rank= and world_size=, or neither (then torch.distributed decides).")
    if rank is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1
    if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
        raise InvalidOptionError(
            f"Invalid rank={rank!r}, world_size={world_size!r}. Use integers with 0 <= rank < world_size."
        )
    return rank, world_size


def shared_seed(seed: int | None, world_size: int) -> int:
    """The epoch-order seed: ``seed``, else one drawn from torch's generator (like
    ``RandomSampler``, so ``torch.manual_seed`` makes it reproducible); on several ranks, rank 0's
    draw, broadcast, since every rank must cut the same permutation."""
    if seed is not None:
        return checked_seed(seed)  # any size: a SeedSequence takes it
    drawn = int(torch.empty((), dtype=torch.int64).random_().item())
    if world_size == 1:
        return drawn
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise InvalidOptionError(
            f"world_size={world_size} without a seed: every rank must shuffle alike. Pass the same seed= on "
            "every rank (or initialise torch.distributed, and rank 0's seed is shared)."
        )
    box = [drawn]
    torch.distributed.broadcast_object_list(box, src=0)
    return int(box[0])


class EpochIndices(np.ndarray):
    """A batch of sample indices that knows the epoch it is read in (``.epoch``), also after
    pickling to a worker process: how the epoch reaches a reader's per-epoch randomness (the
    fused random crop, :mod:`fastdata.reader.fused`) on every backend and ``num_workers``. Otherwise a
    plain int64 array."""

    epoch: int = 0

    def __array_finalize__(self, obj: Any) -> None:
        self.epoch = getattr(obj, "epoch", 0)

    def __reduce__(self) -> tuple[Any, ...]:
        return epoch_indices, (np.asarray(self), self.epoch)


def epoch_indices(indices: np.ndarray, epoch: int) -> EpochIndices:
    """``indices`` (a view, no copy) tagged with ``epoch``."""
    tagged = np.asarray(indices).view(EpochIndices)
    tagged.epoch = int(epoch)
    return tagged


class EpochList(list):
    """A batch's indices as a list (what a DataLoader's ``batch_sampler`` yields, and
    ``__getitems__`` receives) that knows its epoch (``.epoch``), like :class:`EpochIndices`."""

    epoch: int = 0


def epoch_list(indices: Any, epoch: int | None) -> list[int]:
    """``indices`` as a list of ints, tagged with ``epoch`` when there is one."""
    rows = EpochList(np.asarray(indices).tolist())
    if epoch is not None:
        rows.epoch = int(epoch)
    return rows


class Drawn:
    """What one pass of a sampler has yielded so far (:attr:`count`) and whether it has ended
    (:attr:`ended`): a loader that draws ahead of its batches (a DataLoader) knows from it which
    batch is the last of the epoch when that batch arrives."""

    def __init__(self, count: int = 0, ended: bool = False) -> None:
        self.count = count
        self.ended = ended


class EpochSampler(Sampler):
    """Base of fastdata's samplers: one permutation per epoch from :meth:`order`, this rank's
    share of it, yielded as ints, or (with ``batch_size``) as sorted index arrays, one per batch.

    The order depends only on ``(seed, epoch)``; the epoch advances after each full pass, or is
    set with :meth:`set_epoch`. Without a seed, one is drawn from torch's generator, like
    ``RandomSampler`` (so ``torch.manual_seed`` makes it reproducible). Sorting within a batch
    changes no batch's contents but makes reads from disk sequential.

    Ranks (``rank``/``world_size``, by default torch.distributed's when it is initialised): each
    takes a contiguous block of the permutation, before batching, so batches never mix ranks and
    workers then share out whole batches. ``even=True`` (the default) gives every rank the same
    number of samples, like ``DistributedSampler``: with ``drop_last=False`` the permutation is
    padded with its own first samples up to a multiple of ``world_size`` (those few are read twice
    that epoch); with ``drop_last=True`` its last ``N % world_size`` samples are left out (a
    different few each epoch). ``even=False`` reads every sample exactly once and lets the ranks'
    shares differ by one sample (evaluation; DDP training needs equal batch counts on every rank).

    :meth:`state_dict`/:meth:`load_state_dict` hold the epoch, the batches of it already
    consumed and the layout that cut them; the next pass after loading starts at the first batch
    not consumed, or, in another layout (world size, batch size, ``even``, ``drop_last``), reads
    the samples of that epoch the saved job had not read (:mod:`fastdata.loading.order`).
    """

    def __init__(self, length: int, *, batch_size: int | None, drop_last: bool, seed: int | None,
                 rank: int | None = None, world_size: int | None = None, even: bool = True):
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0
        ):
            raise InvalidOptionError(f"Invalid batch_size {batch_size!r}. Use a positive integer.")
        self.length = length
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)  # a state saves it: np.True_ or 1 would not load back (nor go to JSON)
        self.rank, self.world_size = resolve_distributed(rank, world_size)
        self.even = bool(even)
        self.seed_given = seed is not None
        self.seed = shared_seed(seed, self.world_size)
        self.epoch = 0
        self.resume_at = 0  # batches (or samples, without batch_size) of the next pass already consumed
        self.stages: list[tuple[Layout, int]] = []  # earlier layouts of the next pass's epoch (elastic resume)

    @property
    def layout(self) -> Layout:
        """What cuts this sampler's epochs (every rank's alike)."""
        return Layout(self.world_size, self.batch_size, self.even, self.drop_last)

    def order_kind(self) -> str:
        """A short name for how :meth:`order` orders an epoch (a resume checks that it is the same)."""
        return type(self).__name__

    def set_epoch(self, epoch: int) -> None:
        """Pin the next pass's epoch. A resumed position (:meth:`load_state_dict`) is kept when
        it is for this epoch (the usual loop calls ``set_epoch`` after loading) and dropped otherwise.
        A numpy or 0-d tensor integer is kept as an int (a state saves it: JSON and YAML take it)."""
        value = as_integer(epoch)
        if value is None or value < 0:
            raise InvalidOptionError(f"Invalid epoch {epoch!r}. Use an integer >= 0.")
        epoch = value
        if epoch != self.epoch:
            self.resume_at = 0
            self.stages = []
        self.epoch = epoch

    def order(self, epoch: int) -> np.ndarray:
        """The permutation of one epoch (of every rank's samples)."""
        raise NotImplementedError

    def share(self) -> tuple[int, int]:
        """``(start, stop)`` of this rank's block, in the padded (or truncated) epoch order."""
        return self.layout.bounds(self.length, self.rank)

    def rank_order(self, epoch: int, stages: list[tuple[Layout, int]] | None = None) -> np.ndarray:
        """This rank's samples of one epoch, in order: its block of the epoch's order (of what is
        left of it after ``stages``, the layouts the epoch ran in before a resume)."""
        return self.layout.block(epoch_sequence(self.order(epoch), stages or []), self.rank)

    def samples(self) -> int:
        """Samples this rank reads per epoch."""
        start, stop = self.share()
        return stop - start

    def __len__(self) -> int:
        return self.layout.batches(self.samples())

    def __iter__(self) -> Iterator[Any]:
        epoch, stages = self.epoch, self.stages
        order = self.rank_order(epoch, stages)
        self.epoch += 1
        first, self.resume_at, self.stages = self.resume_at, 0, []
        position = self._pass = [epoch, first, stages]  # this pass's own (another may start while it runs)
        if self.batch_size is None:
            items: Iterator[Any] = iter(order[first:].tolist())
        else:
            arrange = self.arrange or (lambda indices, _: np.sort(indices))
            items = (epoch_indices(arrange(order[batch * self.batch_size : (batch + 1) * self.batch_size], epoch), epoch)
                     for batch in range(first, self.layout.batches(len(order))))
        drawn = self.drawn = Drawn()
        for item in items:
            position[1] += 1
            drawn.count += 1
            yield item
        drawn.ended = True
        if self._pass is position:  # the latest pass is over (an earlier one's end leaves the later's)
            self._pass = None

    _pass: list[Any] | None = None  # [epoch, items yielded, stages] while a pass is under way
    drawn: Drawn | None = None  # the latest pass's count, and whether it has ended
    # how a batch's indices are put in order (default: ascending, for sequential reads); a dataset
    # with an order of its own (a mix: grouped per source) gives ``arrange_batch(indices, epoch)``
    arrange: Any = None

    def state_dict(self) -> dict[str, Any]:
        """What a restart needs to continue this sampler's order: the epoch and how many of its
        items this sampler has yielded (between passes: the next epoch and 0; see
        :meth:`load_state_dict`). Under a DataLoader with workers, items are drawn ahead of use
        (``prefetch_factor``): ``fastdata.loader(...).state_dict()`` counts the batches that reached
        the training loop instead."""
        epoch, consumed, stages = self._pass if self._pass is not None else (self.epoch, self.resume_at, self.stages)
        return self.state_at(epoch, consumed, stages)

    def state_at(self, epoch: int, consumed: int, stages: list[tuple[Layout, int]]) -> dict[str, Any]:
        """The state of a position: ``consumed`` items of ``epoch`` in this layout, after ``stages``."""
        return {"version": STATE_VERSION, "seed": self.seed, "epoch": epoch, "consumed": consumed,
                "length": self.length, "order": self.order_kind(), "batch_size": self.batch_size,
                "drop_last": self.drop_last, "rank": self.rank, "world_size": self.world_size, "even": self.even,
                "earlier": [layout.as_list(done) for layout, done in stages]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict` or the loader's, of any rank): the
        next pass is what is left of epoch ``state["epoch"]``. In the saved layout (world size,
        batch size, ``even``, ``drop_last``) it starts at item ``state["consumed"]``; in another
        one it reads the samples the saved job had not read, each once, cut by this layout
        (:mod:`fastdata.loading.order`). Every rank of the saved job is taken to have consumed
        ``state["consumed"]`` items (or all of its own, if it had fewer). The seed comes from the
        state; a different dataset length, order or explicit seed is an error.

        ``state`` may also be a list of every rank's states: the earliest is used (ranks out of
        step re-read what the faster ones read past it; none is lost)."""
        state = earliest(state, kind=type(self).__name__)
        check_state(state, self, kind=type(self).__name__)
        saved = Layout(int(state.get("world_size", 1)), state.get("batch_size"), bool(state.get("even", True)),
                       bool(state.get("drop_last", False)))
        stages = [layout_of(entry) for entry in state.get("earlier", [])]
        consumed = int(state["consumed"])
        total = self.length
        for number, (layout, done) in enumerate([*stages, (saved, consumed)]):
            if done > most_items(total, layout):
                field = "consumed" if number == len(stages) else f"earlier[{number}] consumed"
                raise InvalidOptionError(f"Invalid state: {field}={done} of an epoch of {most_items(total, layout)} "
                                         "batches. Resume from a state as state_dict() saved it.")
            total = len(epoch_sequence(np.empty(total), [(layout, done)]))
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self._pass = None
        if saved == self.layout:
            self.stages, self.resume_at = stages, consumed
        elif consumed == 0:
            self.stages, self.resume_at = stages, 0
        else:
            if len(stages) >= MAX_STAGES:
                raise InvalidOptionError(
                    f"Cannot resume: the state already records {len(stages)} changes of layout within epoch "
                    f"{self.epoch}, the most a state keeps. Resume in its layout (world_size={saved.world_size}, "
                    f"batch_size={saved.batch_size}) until the epoch ends.")
            self.stages, self.resume_at = [*stages, (saved, consumed)], 0

class BatchIndexSampler(EpochSampler):
    """Yields batches of indices: slices of one seeded permutation per epoch, each sorted
    (or ``0..N-1`` in order without ``shuffle``).

    Every index appears exactly once per epoch (the last batch is short unless ``drop_last``);
    see :class:`fastdata.loading.samplers.EpochSampler` for seeding, epochs, ranks and resuming.
    """

    def __init__(
        self,
        length: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        even: bool = True,
    ):
        if batch_size is None:
            raise InvalidOptionError("Invalid batch_size None. Use a positive integer.")
        super().__init__(length, batch_size=batch_size, drop_last=drop_last, seed=seed, rank=rank,
                         world_size=world_size, even=even)
        self.shuffle = shuffle

    def order_kind(self) -> str:
        return "permutation" if self.shuffle else "sequential"

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
    Ranks take contiguous blocks of the epoch's order, so each keeps whole windows (see
    :class:`EpochSampler` for ``rank``, ``world_size``, ``even`` and resuming).
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
        rank: int | None = None,
        world_size: int | None = None,
        even: bool = True,
    ):
        length = data_source if isinstance(data_source, int) else len(data_source)
        super().__init__(length, batch_size=batch_size, drop_last=drop_last, seed=seed, rank=rank,
                         world_size=world_size, even=even)
        chunk_images = chunk_images or getattr(data_source, "chunk_images", None) or max(self.length, 1)
        for name, value in (("chunk_images", chunk_images), ("window_chunks", window_chunks)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidOptionError(f"Invalid {name} {value!r}. Use a positive integer.")
        self.chunk_images = chunk_images
        self.window_chunks = window_chunks

    def order_kind(self) -> str:
        return f"chunks:{self.chunk_images}x{self.window_chunks}"

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


def earliest(states: Any, *, kind: str) -> Any:
    """``states`` itself, or of a list of states (every rank's), the earliest position."""
    if not isinstance(states, (list, tuple)) or not states:
        return checked_state(states, kind=kind)
    for state in states:
        checked_state(state, kind=kind)
    return min(states, key=lambda state: (state["epoch"], len(state.get("earlier", [])), state["consumed"]))


def check_state(state: Any, sampler: EpochSampler, *, kind: str) -> None:
    """Refuse a saved position that cannot continue this sampler's order: not a state, a newer
    state version, another dataset length, another order, another explicit seed."""
    checked_state(state, kind=kind)
    if state.get("length", sampler.length) != sampler.length:
        raise InvalidOptionError(
            f"Cannot resume: the saved state has dataset length={state['length']!r} but this loader has "
            f"{sampler.length!r}. An epoch's order depends on the length: resume over the dataset the state was "
            "saved with, or start the next epoch without the state (loader.set_epoch(state['epoch'] + 1)).")
    if state.get("order", sampler.order_kind()) != sampler.order_kind():
        raise InvalidOptionError(
            f"Cannot resume: the saved state has order={state['order']!r} but this loader has "
            f"{sampler.order_kind()!r}. Build the loader with the saved one's shuffle (and chunk options).")
    if sampler.seed_given and state["seed"] != sampler.seed:
        raise InvalidOptionError(
            f"Cannot resume: the saved state has seed={state['seed']!r} but this loader was built with "
            f"seed={sampler.seed!r}. Build it with seed={state['seed']!r}, or without seed= (it then takes the state's).")
