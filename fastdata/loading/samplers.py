"""Samplers that order an epoch for a storage layout (each index exactly once per epoch), split
across distributed ranks before anything else, and resumable mid-epoch."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from fastdata.errors import InvalidOptionError


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
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InvalidOptionError(f"Invalid seed {seed!r}. Use an integer.")
        return seed
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

    :meth:`state_dict`/:meth:`load_state_dict` hold the epoch and the batches of it already
    consumed; the next pass after loading starts at the first batch not consumed.
    """

    def __init__(self, length: int, *, batch_size: int | None, drop_last: bool, seed: int | None,
                 rank: int | None = None, world_size: int | None = None, even: bool = True):
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0
        ):
            raise InvalidOptionError(f"Invalid batch_size {batch_size!r}. Use a positive integer.")
        self.length = length
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.rank, self.world_size = resolve_distributed(rank, world_size)
        self.even = bool(even)
        self.seed = shared_seed(seed, self.world_size)
        self.epoch = 0
        self.resume_at = 0  # batches (or samples, without batch_size) of the next pass already consumed

    def set_epoch(self, epoch: int) -> None:
        """Pin the next pass's epoch. A resumed position (:meth:`load_state_dict`) is kept when
        it is for this epoch (the usual loop calls ``set_epoch`` after loading) and dropped otherwise."""
        if epoch != self.epoch:
            self.resume_at = 0
        self.epoch = epoch

    def order(self, epoch: int) -> np.ndarray:
        """The permutation of one epoch (of every rank's samples)."""
        raise NotImplementedError

    def share(self) -> tuple[int, int]:
        """``(start, stop)`` of this rank's block, in the padded (or truncated) epoch order."""
        if self.world_size == 1:
            return 0, self.length
        if not self.even:
            return self.length * self.rank // self.world_size, self.length * (self.rank + 1) // self.world_size
        quota = self.length // self.world_size if self.drop_last else -(-self.length // self.world_size)
        return self.rank * quota, (self.rank + 1) * quota

    def rank_order(self, epoch: int) -> np.ndarray:
        """This rank's samples of one epoch, in order."""
        order = self.order(epoch)
        start, stop = self.share()
        if stop > len(order) and len(order):  # padding, as DistributedSampler does: the epoch's first samples again
            order = np.concatenate([order, np.resize(order, stop - len(order))])
        return order[start:stop]

    def samples(self) -> int:
        """Samples this rank reads per epoch."""
        start, stop = self.share()
        return stop - start

    def __len__(self) -> int:
        samples = self.samples()
        if self.batch_size is None:
            return samples
        return samples // self.batch_size if self.drop_last else -(-samples // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        epoch = self.epoch
        order = self.rank_order(epoch)
        self.epoch += 1
        first, self.resume_at = self.resume_at, 0
        self._pass = [epoch, first]
        if self.batch_size is None:
            items: Iterator[Any] = iter(order[first:].tolist())
        else:
            items = (epoch_indices(np.sort(order[batch * self.batch_size : (batch + 1) * self.batch_size]), epoch)
                     for batch in range(first, len(self)))
        for item in items:
            self._pass[1] += 1
            yield item
        self._pass = None

    _pass: list[int] | None = None  # [epoch, items yielded] while a pass is under way

    def state_dict(self) -> dict[str, Any]:
        """What a restart needs to continue this sampler's order: the epoch and how many of its
        items this sampler has yielded (between passes: the next epoch and 0; see
        :meth:`load_state_dict`). Under a DataLoader with workers, items are drawn ahead of use
        (``prefetch_factor``): ``fastdata.loader(...).state_dict()`` counts the batches that reached
        the training loop instead."""
        epoch, consumed = self._pass if self._pass is not None else (self.epoch, self.resume_at)
        return {"seed": self.seed, "epoch": epoch, "consumed": consumed, "length": self.length,
                "batch_size": self.batch_size, "drop_last": self.drop_last, "rank": self.rank,
                "world_size": self.world_size, "even": self.even}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict` of the same sampler on the same rank): the
        next pass is epoch ``state["epoch"]`` from its item ``state["consumed"]``. The seed comes
        from the state; a different dataset length, batch size or rank layout is an error."""
        check_state(state, self.state_dict(), kind=type(self).__name__)
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self._pass = None
        consumed = int(state["consumed"])
        if not 0 <= consumed <= len(self):
            raise InvalidOptionError(f"Invalid state: consumed={consumed} of an epoch of {len(self)}.")
        self.resume_at = consumed


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


_LAYOUT = ("length", "batch_size", "drop_last", "world_size", "rank", "even")


def check_state(state: Any, current: dict[str, Any], *, kind: str) -> None:
    """Refuse a saved position that would not continue this order: another dataset length,
    batch size or rank layout cuts different batches."""
    if not isinstance(state, dict) or not {"seed", "epoch", "consumed"} <= set(state):
        raise InvalidOptionError(f"Not a {kind} state: expected a dict from state_dict(), got {state!r:.200}.")
    for key in _LAYOUT:
        if key in state and state[key] != current[key]:
            what = "dataset length" if key == "length" else key
            raise InvalidOptionError(
                f"Cannot resume: the saved state has {what}={state[key]!r} but this loader has {current[key]!r}. "
                "Rebuild the loader as it was when the state was saved (same dataset, batch_size, drop_last, "
                "rank and world_size)."
            )
