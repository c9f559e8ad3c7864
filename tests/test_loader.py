"""BatchIndexSampler and fastdata.loader: exactly once, seeded, reshuffled per epoch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastdata
from fastdata.errors import InvalidOptionError
from fastdata import BatchIndexSampler


def epoch(sampler) -> list[np.ndarray]:
    return list(sampler)


def test_every_index_once_sorted_batches() -> None:
    sampler = BatchIndexSampler(103, 10, seed=4)
    batches = epoch(sampler)
    assert len(batches) == len(sampler) == 11 and [len(b) for b in batches][-1] == 3
    assert sorted(np.concatenate(batches).tolist()) == list(range(103))
    assert all((np.diff(b) > 0).all() for b in batches)


def test_seed_and_epochs() -> None:
    first, second = BatchIndexSampler(50, 8, seed=1), BatchIndexSampler(50, 8, seed=1)
    a, b = epoch(first), epoch(second)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    next_epoch = epoch(first)  # the epoch advances by itself
    assert not all(np.array_equal(x, y) for x, y in zip(a, next_epoch))
    second.set_epoch(0)
    assert all(np.array_equal(x, y) for x, y in zip(a, epoch(second)))
    torch.manual_seed(0)
    seeded = BatchIndexSampler(50, 8).seed
    torch.manual_seed(0)
    assert BatchIndexSampler(50, 8).seed == seeded


def test_no_shuffle_and_drop_last() -> None:
    batches = epoch(BatchIndexSampler(10, 4, shuffle=False, drop_last=True))
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_loader_validates(uniform_folder, tmp_path) -> None:
    fastdata.convert(uniform_folder, tmp_path / "u.npy", workers=0)
    ds = fastdata.open_dataset(tmp_path / "u.npy")
    with pytest.raises(InvalidOptionError, match="Invalid batch_size 0"):
        fastdata.loader(ds, batch_size=0)
    with pytest.raises(InvalidOptionError, match="loader\\(\\) sets 'sampler' itself"):
        fastdata.loader(ds, sampler=None)
    images, labels = next(iter(fastdata.loader(ds, batch_size=12, shuffle=False)))
    assert images.shape == (12, 3, 12, 10) and labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
