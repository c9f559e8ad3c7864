"""What :func:`fastdata.mix` checks when it is built, so that a mix that cannot be read is refused
then, in one line, and never at every read: its datasets, weights, length and seed, and that its
sources' samples are alike (one structure, one dtype per field: what a batch of them needs on
every backend)."""

from __future__ import annotations

import math
import operator
import random
from collections.abc import Mapping, Set
from typing import Any, Sequence

import numpy as np
import torch

from fastdata.errors import InvalidOptionError

MAX_LENGTH = 2**32  # samples per epoch: an epoch's order (the loader's shuffle) holds 8 bytes a sample


def as_integer(value: Any) -> int | None:
    """``value`` as an int when it is one (Python or numpy; not a bool), else None."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def checked_datasets(datasets: Any) -> list[Any]:
    if isinstance(datasets, (str, bytes)) or not isinstance(datasets, Sequence) or not datasets:
        raise InvalidOptionError(f"Invalid datasets {datasets!r:.100}. Give a non-empty list of map-style datasets.")
    for number, dataset in enumerate(datasets):
        if isinstance(dataset, torch.utils.data.IterableDataset):
            reader = getattr(type(dataset), "map_reader", None)
            fix = (f"Use fastdata.{reader.__name__}({str(getattr(dataset, 'path', 'PATH'))!r}) for the same data, "
                   "map-style." if reader is not None else "Give its map-style counterpart.")
            raise InvalidOptionError(f"mix needs map-style datasets (random access by index), but dataset {number} is "
                                     f"the iterable {type(dataset).__name__}. {fix}")
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise InvalidOptionError(f"Dataset {number} ({type(dataset).__name__}) is not a map-style dataset: it "
                                     "needs __getitem__ and __len__.")
        if len(dataset) == 0:
            raise InvalidOptionError(f"Dataset {number} ({type(dataset).__name__}) is empty: a mix cannot draw "
                                     "from it. Leave it out.")
    return list(datasets)


def checked_weights(weights: Any, count: int) -> np.ndarray:
    """One finite weight >= 0 per dataset, not all 0, in the datasets' order (a dict or set has no
    order of datasets: refused)."""
    if isinstance(weights, (Mapping, Set)):
        raise InvalidOptionError(f"Invalid weights {weights!r:.100}: a {type(weights).__name__} does not say which "
                                 f"dataset each weight is for. Give a list of {count} numbers, one per dataset in the "
                                 "order of datasets.")
    try:
        values = [float(w) for w in weights] if not isinstance(weights, (str, bytes)) else None
    except (TypeError, ValueError):
        values = None
    if values is None or len(values) != count or not all(math.isfinite(w) and w >= 0 for w in values) \
            or not max(values, default=0) > 0:
        raise InvalidOptionError(f"Invalid weights {weights!r:.100}. Give {count} finite numbers >= 0, one per "
                                 "dataset, not all 0 (they need not add up to 1).")
    return np.array(values, dtype=np.float64)


def checked_length(length: Any, lengths: np.ndarray) -> int:
    """Samples per epoch: ``length``, or the sum of the datasets' lengths; 0 to MAX_LENGTH."""
    total = sum(int(n) for n in lengths) if length is None else as_integer(length)
    if total is None or total < 0:
        raise InvalidOptionError(f"Invalid length {length!r}. Use a number of samples per epoch >= 0 "
                                 "(or None: the sum of the datasets' lengths).")
    if total > MAX_LENGTH:
        given = f"length={total}" if length is not None else f"the sum of the datasets' lengths ({total})"
        raise InvalidOptionError(
            f"Invalid length: {given} is more than {MAX_LENGTH} samples per epoch (an epoch's shuffled order holds "
            f"8 bytes a sample: {8 * total / 1e9:.3g} GB). Pass a shorter length=: the sources' draws go on from "
            "epoch to epoch, so more epochs of it read the same samples.")
    return total


def checked_seed(seed: Any) -> int:
    value = as_integer(seed)
    if value is None or value < 0:
        raise InvalidOptionError(f"Invalid seed {seed!r}. Use an integer >= 0.")
    return value


def _kind(sample: Any) -> Any:
    """A sample's structure, with each field's dtype (what collating a batch of them keeps)."""
    if isinstance(sample, Mapping):
        return {key: _kind(value) for key, value in sample.items()}
    if isinstance(sample, (tuple, list)):
        return tuple(_kind(value) for value in sample)
    if isinstance(sample, torch.Tensor):
        return str(sample.dtype).replace("torch.", "")
    if isinstance(sample, (np.ndarray, np.generic)):
        return str(sample.dtype)
    if isinstance(sample, bool):
        return "bool"
    return {int: "int64", float: "float64"}.get(type(sample), type(sample).__name__)


def _shown(kind: Any) -> str:
    if isinstance(kind, dict):
        return "{" + ", ".join(f"{key!r}: {_shown(value)}" for key, value in kind.items()) + "}"
    if isinstance(kind, tuple):
        return "(" + ", ".join(map(_shown, kind)) + ")"
    return str(kind)


def _difference(first: Any, other: Any, where: str = "") -> tuple[str, Any, Any] | None:
    """``(field, first's, other's)`` of the first field where two kinds differ, else None."""
    if isinstance(first, dict) and isinstance(other, dict) and set(first) == set(other):
        found = (_difference(first[key], other[key], f"{where}[{key!r}]") for key in first)
        return next((d for d in found if d is not None), None)
    if isinstance(first, tuple) and isinstance(other, tuple) and len(first) == len(other):
        found = (_difference(a, b, f"{where}[{i}]") for i, (a, b) in enumerate(zip(first, other)))
        return next((d for d in found if d is not None), None)
    return None if first == other else (where or "the sample", first, other)


def check_alike(datasets: Sequence[Any]) -> None:
    """Refuse sources whose first samples differ in structure (tuple length, dict keys) or in a
    field's dtype: one rule, whatever the backend (a batch of them is one array per field).
    Shapes may differ (a ``pad=`` loader or a ``collate_fn`` may join them). The reads leave the
    global random generators (torch's, numpy's, Python's) as they found them: a source's random
    transforms draw nothing that the caller's next draws would miss."""
    kinds = _first_samples(datasets)
    for number, kind in enumerate(kinds[1:], start=1):
        difference = _difference(kinds[0], kind)
        if difference is not None:
            field, mine, theirs = difference
            raise InvalidOptionError(
                f"A mix's sources give samples of different structures or types: source 0 "
                f"({type(datasets[0]).__name__}) gives {_shown(kinds[0])}, source {number} "
                f"({type(datasets[number]).__name__}) {_shown(kind)} ({field}: {_shown(mine)} against "
                f"{_shown(theirs)}). A batch holds one type per field: give the sources transforms (or convert "
                "them) so that their samples are alike.")


def _first_samples(datasets: Sequence[Any]) -> list[Any]:
    """The kind of each dataset's sample 0, the global random states restored afterwards."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            return [_kind(dataset[0]) for dataset in datasets]
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
