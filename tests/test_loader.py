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


# --- batch_transform: the same images on every path ------------------------------------------------


def centred(batch: torch.Tensor) -> torch.Tensor:
    """A batch transform that insists on getting a batch."""
    assert batch.ndim == 4 and batch.dtype == torch.uint8, batch.shape
    return batch.float() / 255 - 0.5


def test_batch_transform_applies_on_every_path(converted) -> None:
    from torch.utils.data import DataLoader

    spec = fastdata.formats.get_format(fastdata.formats.find_manifest(converted)["format"])
    plain = spec.map_dataset(converted)
    expected = torch.stack([plain[i][0] for i in range(12)]).float() / 255 - 0.5
    ds = spec.map_dataset(converted, batch_transform=centred)
    assert torch.equal(torch.stack([ds[i][0] for i in range(12)]), expected)  # ds[i]: a batch of one
    assert torch.equal(ds[list(range(12))][0], expected)  # one collated read
    assert torch.equal(torch.cat([images for images, _ in DataLoader(ds, batch_size=5)]), expected)
    assert torch.equal(torch.cat([images for images, _ in fastdata.loader(ds, batch_size=5, shuffle=False)]), expected)
    flipped = spec.map_dataset(converted, transform=lambda image: image.flip(-1), batch_transform=centred)
    assert torch.equal(flipped[[0, 1, 2]][0], expected[:3].flip(-1))  # after transform, on both paths
    assert torch.equal(next(iter(DataLoader(flipped, batch_size=3)))[0], expected[:3].flip(-1))
    if spec.iterable:  # the streaming reader: per image, or per batch with batch_size
        one_by_one = torch.stack([image for image, _ in spec.dataset(converted, shuffle=False, batch_transform=centred)])
        batched = torch.cat([b for b, _ in spec.dataset(converted, shuffle=False, batch_size=5, batch_transform=centred)])
        assert torch.equal(one_by_one, expected) and torch.equal(batched, expected)


def test_batch_transform_needs_tensors(uniform_folder, tmp_path) -> None:
    out = tmp_path / "b.npy"
    fastdata.convert(uniform_folder, out, workers=0)
    with pytest.raises(InvalidOptionError) as info:
        fastdata.MemmapDataset(out, image_format="numpy", batch_transform=centred)
    assert str(info.value) == ("batch_transform takes image tensors [B, C, H, W], but image_format='numpy' gives "
                               "ndarrays. Use image_format='tensor' (the default), or apply the transform yourself.")
    ds = fastdata.MemmapDataset(out, transform=lambda image: image.numpy(), batch_transform=centred)
    with pytest.raises(TypeError) as error:
        ds[0]
    assert str(error.value) == ("batch_transform takes image tensors [B, C, H, W]; the images here are ndarray (from "
                                "transform). Make transform return a (C, H, W) tensor.")
    plain = fastdata.MemmapDataset(out)[[0, 1]][0]
    assert torch.equal(ds[[0, 1]][0], centred(plain))  # collated first: default_collate makes the arrays a tensor
