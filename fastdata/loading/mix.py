"""``fastdata.mix``: one map-style dataset drawing from several, in fixed proportions per epoch.

Epoch ``e`` of a mix of ``length`` samples over sources ``0..K-1`` of lengths ``n_k`` and weights
``w_k`` is a pure function of ``(seed, e, n, w, length)``:

* **counts**: source ``k`` gives exactly ``c_k`` samples, ``length * w_k / sum(w)`` rounded by the
  largest remainder (so the counts add up to ``length``, each within one of its exact share);
* **interleaving**: position ``p`` of epoch ``e`` goes to slot ``s = P_e(p)`` of
  ``[0]*c_0 + [1]*c_1 + ...``, where ``P_e`` is a seeded permutation of ``range(length)``: slot
  ``s`` is source ``k``'s ``j``-th (``j = s - c_0 - ... - c_{k-1}``);
* **draws**: source ``k``'s ``j``-th slot of epoch ``e`` is its draw ``e * c_k + j``; draw ``d``
  reads sample ``perm_k(d // n_k)(d % n_k)``, where ``perm_k(cycle)`` is a seeded permutation of
  ``range(n_k)``. A source is read without replacement until exhausted, then from a new permutation:
  a small source is up-sampled (each of its samples ``c_k / n_k`` times per epoch, give or take one),
  a large one gives new samples each epoch until it has given them all.

The permutations are computed for the positions asked for, never stored
(:mod:`fastdata.loading.permutation`): a mix holds no array of its positions or its sources'
samples, so a source of 10**9 samples costs what one of 10 does.

The loader's sampler then orders (and splits across ranks) ``range(length)`` as for any dataset:
mixing is one more level of the same order. The epoch a read is in comes with ``fastdata.loader``'s
index arrays (and lists); a plain ``DataLoader`` needs :meth:`Mix.set_epoch`.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import numpy as np
import torch

from fastdata.errors import InvalidOptionError
from fastdata.loading.fetch import accepts_index_arrays, read_samples
from fastdata.loading.mixchecks import check_alike, checked_datasets, checked_length, checked_seed, checked_weights
from fastdata.loading.permutation import permuted, round_keys, stream_keys
from fastdata.loading.samplers import epoch_indices

_SALT = 0x6D6978  # "mix": keeps the interleaving's stream apart from a sampler's of the same seed


def largest_remainder(length: int, weights: Sequence[float]) -> np.ndarray:
    """Integer counts in the proportions of ``weights`` that add up to ``length``: each share's
    floor, then one more for the largest remainders (ties to the earlier source). Weights scaled
    by a power of 2 give the same counts (they are first scaled by their largest, so their sum never
    overflows)."""
    weights = np.asarray(weights, dtype=np.float64)
    weights = weights / weights.max()
    exact = length * weights / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    short = length - int(counts.sum())
    if short:
        counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return counts


class Mix(torch.utils.data.Dataset):
    """A map-style dataset of ``length`` samples per epoch drawn from ``datasets`` in the
    proportions of ``weights`` (see :mod:`fastdata.loading.mix` for the exact rule; built by
    :func:`fastdata.mix`). ``mix[i]`` is a sample, ``mix[indices]`` a collated batch read with one
    call per source present (when every source accepts index arrays), ``mix.source_of(i)`` the
    source a sample comes from. ``with_source=True`` adds it to every sample: a last tuple
    element, or a ``"source"`` key of a dict."""

    def __init__(self, datasets: Sequence[Any], weights: Sequence[float], *, length: int | None = None,
                 seed: int = 0, with_source: bool = False):
        self.datasets = checked_datasets(datasets)
        self.weights = checked_weights(weights, len(self.datasets))
        self.lengths = np.array([len(d) for d in self.datasets], dtype=np.int64)
        self.length = checked_length(length, self.lengths)
        self.seed = checked_seed(seed)
        self.with_source = bool(with_source)
        self.counts = largest_remainder(self.length, self.weights)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)  # each source's first slot
        self.epoch = 0
        self._keys = [round_keys(self.seed, source, _SALT) for source in range(len(self.datasets))]
        self._order_keys = round_keys(self.seed, len(self.datasets), _SALT, _SALT)
        check_alike(self.datasets)
        self._batched = all(accepts_index_arrays(dataset) for dataset in self.datasets)
        self._labels = [f"source {k} ({type(d).__name__})" for k, d in enumerate(self.datasets)]
        self._source_dtype = np.int16 if len(self.datasets) <= 2**15 else np.int32  # ids of 32768 sources and more

    # --- the order -----------------------------------------------------------------------

    def __len__(self) -> int:
        return self.length

    def set_epoch(self, epoch: int) -> None:
        """The epoch of reads that do not carry one (a plain ``DataLoader``'s; ``fastdata.loader``'s
        batches carry theirs); passed on to the sources that take it."""
        self.epoch = int(epoch)
        for dataset in self.datasets:
            if hasattr(dataset, "set_epoch"):
                dataset.set_epoch(epoch)

    def plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source, index)`` of every position of ``epoch``: int16 source ids and int64 indices
        into them (int32 ids past 32768 sources; computed for all ``length`` positions: :meth:`locate`
        computes a few)."""
        return self.locate(np.arange(self.length), epoch)

    def draws(self, source: int, epoch: int, slots: np.ndarray) -> np.ndarray:
        """The samples of source ``source``'s slots ``slots`` of ``epoch`` (its draws ``epoch *
        c_k + slots``): each cycle through the source a new permutation."""
        size = int(self.lengths[source])
        first_cycle, offset = divmod(epoch * int(self.counts[source]), size)  # Python ints: any epoch
        draws = offset + slots
        cycles = (np.uint64(first_cycle % 2**64) + (draws // size).astype(np.uint64))  # wraps past 2**64 cycles
        return permuted(draws % size, size, stream_keys(self._keys[source], cycles))

    def locate(self, indices: Any, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(sources, source_indices)`` of mix indices ``indices`` in ``epoch`` (default: the
        one ``indices`` carry, else :meth:`set_epoch`'s): int16 (int32 past 32768 sources) and int64 arrays."""
        epoch = self.epoch_of(indices) if epoch is None else int(epoch)
        slots = permuted(self._positions(indices), self.length,
                         stream_keys(self._order_keys, np.array([epoch % 2**64], dtype=np.uint64)))
        sources = (np.searchsorted(self.starts, slots, side="right") - 1).astype(self._source_dtype)
        inner = np.empty(len(slots), dtype=np.int64)
        for source in np.unique(sources).tolist():
            mine = sources == source
            inner[mine] = self.draws(source, epoch, slots[mine] - self.starts[source])
        return sources, inner

    def source_of(self, index: Any, epoch: int | None = None) -> Any:
        """The source id (position in ``datasets``) of mix index ``index`` (an int, or an int64
        array for an array of indices) in ``epoch``."""
        sources, _ = self.locate(np.atleast_1d(np.asarray(index)), self.epoch_of(index) if epoch is None else epoch)
        return int(sources[0]) if np.ndim(index) == 0 else sources.astype(np.int64)

    def epoch_of(self, indices: Any) -> int:
        return int(getattr(indices, "epoch", self.epoch))

    def _positions(self, indices: Any) -> np.ndarray:
        positions = np.asarray(indices.numpy() if isinstance(indices, torch.Tensor) else indices)
        if positions.ndim != 1 or not (positions.dtype.kind in "iu" or positions.size == 0):
            raise TypeError(f"indices must be an int or a 1-D sequence of ints, got {type(indices).__name__}")
        if not positions.size:
            return positions.astype(np.int64)
        low, high = positions.min(), positions.max()
        if low >= 0 and high < self.length:  # the common case (the loader's batches): nothing to wrap
            return positions
        if low < -self.length or high >= self.length:
            bad = positions[(positions < -self.length) | (positions >= self.length)][0]
            raise IndexError(f"index {bad} is out of range for a mix of {self.length} samples")
        return np.where(positions < 0, positions + self.length, positions)

    # --- reading -------------------------------------------------------------------------

    @property
    def supports_index_arrays(self) -> bool:
        """Whether ``mix[indices]`` returns a collated batch: when every source does."""
        return self._batched

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)) or (isinstance(index, torch.Tensor) and index.ndim == 0):
            sources, inner = self.locate([int(index)], self.epoch_of(index))
            source = int(sources[0])
            return self._tagged(self.datasets[source][int(inner[0])], source)
        if not self.supports_index_arrays:
            raise TypeError(f"{self._describe_per_sample()} cannot be read with an index array; read it per index "
                            "(fastdata.loader and DataLoader do so by themselves).")
        return self.get_batch(index)

    def get_batch(self, indices: Any, allocate: Any = None) -> Any:
        """The collated batch of mix indices ``indices``: one ``dataset[source_indices]`` read per
        source present, the parts placed back in the order of ``indices`` (into ``allocate``'d
        memory where given: the process backend's shared-memory slot)."""
        from fastdata.loading.assemble import assemble

        epoch = self.epoch_of(indices)
        sources, inner = self.locate(indices, epoch)
        steps = np.diff(sources)
        if not steps.any():  # one source
            batch = self._read(int(sources[0]), inner, epoch, allocate) if len(sources) else \
                self._read(0, inner, epoch, allocate)
        elif (steps >= 0).all():  # grouped per source (arrange_batch): each read into its rows
            batch = self._read_runs(sources, inner, epoch, allocate)
        else:
            parts, places = [], []
            present = np.unique(sources)
            for source in present.tolist():
                where = np.flatnonzero(sources == source)
                where = where[np.argsort(inner[where], kind="stable")]  # each source read in ascending order
                parts.append(self._read(source, inner[where], epoch))
                places.append(where)
            batch = assemble(parts, places, len(sources), allocate=allocate, names=self._names(present))
        if self.with_source:
            batch = self._tagged(batch, torch.from_numpy(sources.astype(np.int64)))
        return batch

    def _read(self, source: int, inner: np.ndarray, epoch: int, allocate: Any = None) -> Any:
        dataset = self.datasets[source]
        get_batch = getattr(dataset, "get_batch", None)
        if allocate is not None and get_batch is not None:
            return get_batch(epoch_indices(inner, epoch), allocate=allocate)
        return dataset[epoch_indices(inner, epoch)]

    def _read_runs(self, sources: np.ndarray, inner: np.ndarray, epoch: int, allocate: Any) -> Any:
        """The batch of indices grouped per source: each source's run read straight into its rows
        of shared buffers where it can (no copy afterwards), else placed."""
        from fastdata.loading.assemble import SharedRows, concatenate_runs

        starts = [0, *(np.flatnonzero(sources[1:] != sources[:-1]) + 1).tolist()]
        runs = list(zip(starts, [*starts[1:], len(sources)]))
        shared = SharedRows(len(sources), allocate)
        parts = [self._read(int(sources[start]), inner[start:stop], epoch, shared.rows(start, stop))
                 for start, stop in runs]
        return concatenate_runs(parts, runs, len(sources), allocate=allocate,
                                names=[self._labels[int(sources[start])] for start, _ in runs], buffers=shared.buffers)

    def arrange_batch(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        """A batch's indices grouped per source, ascending within each (``fastdata.loader`` orders
        each batch so: the same samples, one contiguous run of rows per source, each read straight
        into its place)."""
        sources, inner = self.locate(indices, epoch)
        return indices[np.lexsort((inner, sources))]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """The samples of ``indices`` (torch's batched fetch), each source read through its own
        ``__getitems__`` where it has one."""
        epoch = self.epoch_of(indices)
        sources, inner = self.locate(list(indices), epoch)
        samples: list[Any] = [None] * len(sources)
        for source in np.unique(sources).tolist():
            where = np.flatnonzero(sources == source)
            rows = read_samples(self.datasets[source], epoch_indices(inner[where], epoch))
            for place, sample in zip(where.tolist(), rows):
                samples[place] = self._tagged(sample, source)
        return samples

    def _tagged(self, sample: Any, source: Any) -> Any:
        """``sample`` with its source added (``with_source``)."""
        if not self.with_source:
            return sample
        if isinstance(sample, dict):
            return {**sample, "source": source}
        if isinstance(sample, (tuple, list)):
            return type(sample)([*sample, source]) if type(sample) in (tuple, list) else (*sample, source)
        return sample, source

    def _names(self, present: np.ndarray) -> list[str]:
        return [self._labels[k] for k in present.tolist()]

    def _describe_per_sample(self) -> str:
        names = [type(d).__name__ for d in self.datasets if not accepts_index_arrays(d)]
        return f"This mix (its source {', '.join(names)} reads per sample)"

    # --- identity for state_dict ---------------------------------------------------------

    def order_identity(self) -> dict[str, Any]:
        """What a loader's state records of this mix (a few bytes whatever the sources): its seed
        and a digest of what its order depends on: its length, counts per source (weights scaled
        alike give the same) and source lengths."""
        return {"seed": self.seed, "digest": _digest(f"computed|{self.length}|{self.counts.tolist()}|"
                                                     f"{self.lengths.tolist()}")}

    def check_order_identity(self, saved: Any) -> None:
        """Refuse a state saved over another mix (one line, naming what differs)."""
        if saved is None:
            raise InvalidOptionError("Cannot resume: the saved state is not of a fastdata.mix (its 'dataset' is None "
                                     "or missing), but this loader reads one. Resume over the dataset it was saved "
                                     "with.")
        mine = self.order_identity()
        if saved.get("seed") != mine["seed"]:
            raise InvalidOptionError(
                f"Cannot resume: the saved state is of a mix with seed={saved.get('seed')!r} but this mix has "
                f"seed={mine['seed']!r}. Build the mix with seed={saved.get('seed')!r}.")
        if saved.get("digest") == _digest(f"{self.length}|{self.weights.tolist()}|{self.lengths.tolist()}"):
            raise InvalidOptionError(
                "Cannot resume: the saved state is of this mix as an earlier fastdata ordered it (each epoch's "
                "order differs now). Finish that epoch with the fastdata that saved it, or start the next epoch "
                "without the state (loader.set_epoch(state['epoch'] + 1)).")
        if saved.get("digest") != mine["digest"]:
            raise InvalidOptionError(
                "Cannot resume: the saved state is of another mix (its length, weights or datasets' lengths "
                f"differ from this one's: length={self.length}, weights={self.weights.tolist()}, "
                f"lengths={self.lengths.tolist()}). Build the mix as it was when the state was saved.")

    def __repr__(self) -> str:
        parts = ", ".join(f"{type(d).__name__}({n}) x {w:g}" for d, n, w in
                          zip(self.datasets, self.lengths.tolist(), self.weights.tolist()))
        return f"Mix([{parts}], length={self.length}, seed={self.seed})"


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def mix(datasets: Sequence[Any], weights: Sequence[float], *, length: int | None = None, seed: int = 0,
        with_source: bool = False) -> Mix:
    """A map-style dataset of ``length`` samples per epoch (default: the sum of the datasets'
    lengths) drawn from ``datasets`` in the proportions of ``weights``: exact counts per epoch
    (largest remainder), interleaved by a seeded permutation; each dataset read without replacement
    until exhausted, then from a new permutation; a pure function of ``(seed, epoch)``. Works with
    ``fastdata.loader`` (one read per source per batch; every backend, ranks, ``state_dict`` and
    elastic resume) and with a plain ``DataLoader`` (call ``mix.set_epoch(e)`` each epoch).
    ``mix.source_of(i)`` names a sample's source; ``with_source=True`` adds it to every sample."""
    return Mix(datasets, weights, length=length, seed=seed, with_source=with_source)

