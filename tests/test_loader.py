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


# --- num_workers=0: the serial loop on every backend, the DataLoader's behaviour kept ---------------


class Pixels(torch.utils.data.Dataset):
    """50 raw 4x4 RGB samples whose pixels encode the index (a lost or repeated sample shows)."""

    def __len__(self) -> int:
        return 50

    def __getitem__(self, index: int):
        return np.full((4, 4, 3), index, dtype=np.uint8), index % 7


class Squares(torch.utils.data.Dataset):
    """A per-sample dataset (no index arrays)."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, index: int):
        return torch.full((2,), float(index)), index * index


@pytest.fixture
def raw_npy(tmp_path) -> fastdata.MemmapDataset:
    fastdata.convert(Pixels(), tmp_path / "p.npy", format="npy", store="raw", workers=0)
    return fastdata.MemmapDataset(tmp_path / "p.npy")


def no_dataloader_iterator():
    """A patch under which creating any DataLoader iterator fails the test."""
    from unittest import mock

    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return mock.patch.object(_BaseDataLoaderIter, "__init__", side_effect=AssertionError("a DataLoader iterator"))


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_default_loader_at_nw0_runs_no_dataloader_iterator_thread_or_process(raw_npy) -> None:
    import threading

    import psutil

    loader = fastdata.loader(raw_npy, batch_size=8, seed=3)
    assert isinstance(loader, torch.utils.data.DataLoader) and loader.serial  # still a DataLoader object
    threads, children = threading.active_count(), psutil.Process().children()
    with no_dataloader_iterator():
        batches = list(loader) + list(loader)
    assert threading.active_count() == threads and psutil.Process().children() == children
    labels = torch.cat([labels for _, labels in batches[:7]])
    assert len(batches) == 14 and sorted(torch.cat([images[:, 0, 0, 0] for images, _ in batches[:7]]).tolist()) == \
        list(range(50)) and labels.tolist() == [i % 7 for i in torch.cat([b[0][:, 0, 0, 0] for b in batches[:7]]).tolist()]


@pytest.mark.parametrize("kind", ["memmap", "tensors", "per-sample"])
def test_nw0_batches_equal_the_thread_backend_and_the_dataloader_of_before(raw_npy, kind: str) -> None:
    from torch.utils.data import DataLoader, TensorDataset, default_collate

    from fastdata.loading import _ListBatches

    dataset = {"memmap": raw_npy, "per-sample": Squares(),
               "tensors": TensorDataset(torch.arange(60.0).reshape(30, 2), torch.arange(30))}[kind]
    default = fastdata.loader(dataset, batch_size=4, seed=5)
    thread = fastdata.loader(dataset, batch_size=4, seed=5, backend="thread")
    sampler = fastdata.BatchIndexSampler(len(dataset), 4, seed=5)  # what the torch backend iterated before
    before = DataLoader(dataset, batch_sampler=_ListBatches(sampler), collate_fn=default_collate) \
        if kind == "per-sample" else DataLoader(dataset, batch_size=None, sampler=sampler)
    for _ in range(2):  # two epochs: each reshuffled alike
        with no_dataloader_iterator():
            mine, theirs = list(default), list(thread)
        old = list(before)
        assert len(mine) == len(theirs) == len(old) == len(default) == -(-len(dataset) // 4)
        for got, threaded, was in zip(mine, theirs, old):
            assert same(got, threaded) and same(got, was)
            assert type(got) is type(was)  # a DataLoader makes a batch's tuple a list (default_convert)


def test_nw0_keeps_the_dataloader_conversion_of_numpy_batches(tmp_path, raw_npy) -> None:
    ds = fastdata.MemmapDataset(raw_npy.path, image_format="numpy")
    images, labels = next(iter(fastdata.loader(ds, batch_size=5, shuffle=False)))
    assert isinstance(images, torch.Tensor) and images.shape == (5, 4, 4, 3) and labels.tolist() == [0, 1, 2, 3, 4]
    threaded, _ = next(iter(fastdata.loader(ds, batch_size=5, shuffle=False, backend="thread")))
    assert isinstance(threaded, np.ndarray) and np.array_equal(threaded, images.numpy())


def test_nw0_collate_fn_and_per_sample_datasets(raw_npy) -> None:
    from torch.utils.data import default_collate

    def collate(samples):
        images, labels = default_collate(samples)
        return {"images": images.float(), "labels": labels, "count": len(samples)}

    for dataset in (raw_npy, Squares()):  # a collate_fn makes an index-array dataset per-sample, as a DataLoader
        with no_dataloader_iterator():
            got = list(fastdata.loader(dataset, batch_size=6, seed=1, collate_fn=collate))
        want = list(fastdata.loader(dataset, batch_size=6, seed=1, collate_fn=collate, backend="thread"))
        assert [b["count"] for b in got] == [6] * (len(dataset) // 6) + ([len(dataset) % 6] if len(dataset) % 6 else [])
        assert all(torch.equal(a["images"], b["images"]) and torch.equal(a["labels"], b["labels"])
                   for a, b in zip(got, want)) and len(got) == len(want)


@pytest.mark.parametrize("backend", ["torch", "thread", "process"])
def test_nw0_resumes_mid_epoch_and_says_the_backend_asked_for(raw_npy, backend: str) -> None:
    loader = fastdata.loader(raw_npy, batch_size=8, seed=9, backend=backend)
    full = list(fastdata.loader(raw_npy, batch_size=8, seed=9))
    iterator = iter(loader)
    consumed = [next(iterator) for _ in range(3)]
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"], state["backend"]) == (0, 3, backend)
    resumed = fastdata.loader(raw_npy, batch_size=8, backend=backend)
    resumed.load_state_dict(state)
    with no_dataloader_iterator():
        rest = list(resumed)
    assert all(same(a, b) for a, b in zip(consumed + rest, full)) and len(consumed) + len(rest) == len(full) == 7
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["consumed"] == 0


@pytest.mark.parametrize("backend, workers", [("torch", 0), ("thread", 0), ("torch", 2)])
def test_two_iterators_of_one_loader_read_consecutive_epochs(raw_npy, backend: str, workers: int) -> None:
    """A second epoch started while the first is under way (an evaluation pass inside a training
    epoch, say) reads the next epoch; the first goes on with its own and ends cleanly."""
    fresh = fastdata.loader(raw_npy, batch_size=8, seed=9)
    epoch0, epoch1 = list(fresh), list(fresh)
    loader = fastdata.loader(raw_npy, batch_size=8, seed=9, backend=backend, num_workers=workers)
    first = iter(loader)
    head = [next(first), next(first)]
    second = list(loader)  # ends while the first is under way
    rest = list(first)
    assert len(head) + len(rest) == len(epoch0) == len(second) == len(epoch1) == 7
    assert all(same(a, b) for a, b in zip(head + rest, epoch0)) and all(same(a, b) for a, b in zip(second, epoch1))
    assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (2, 0)
    assert (loader.index_sampler.state_dict()["epoch"], loader.index_sampler.state_dict()["consumed"]) == (2, 0)


def test_nw0_leaves_torchs_random_stream_alone(raw_npy) -> None:
    """A DataLoader iterator draws a worker seed from torch's generator even at num_workers=0;
    the serial loop does not (docs/reading.md says so)."""
    loader = fastdata.loader(raw_npy, batch_size=8, seed=2)
    state = torch.get_rng_state()
    list(loader)
    assert torch.equal(torch.get_rng_state(), state)
    list(torch.utils.data.DataLoader(raw_npy, batch_size=None, sampler=loader.sampler))
    assert not torch.equal(torch.get_rng_state(), state)  # what it would have drawn


def test_nw0_with_a_generator_keeps_the_dataloader_iterator(raw_npy) -> None:
    generator = torch.Generator().manual_seed(0)
    loader = fastdata.loader(raw_npy, batch_size=8, seed=4, generator=generator)
    assert not loader.serial
    before = generator.get_state()
    got = list(loader)
    assert not torch.equal(generator.get_state(), before)  # the DataLoader's per-epoch draw, as documented
    assert all(same(a, b) for a, b in zip(got, fastdata.loader(raw_npy, batch_size=8, seed=4))) and len(got) == 7


def test_nw0_keeps_the_dataloaders_option_checks(raw_npy) -> None:
    with pytest.raises(ValueError, match="prefetch_factor option could only be specified in multiprocessing"):
        fastdata.loader(raw_npy, batch_size=8, prefetch_factor=2)
    with pytest.raises(ValueError, match="persistent_workers option needs num_workers > 0"):
        fastdata.loader(raw_npy, batch_size=8, persistent_workers=True)
    with pytest.raises(ValueError, match="multiprocessing_context can only be used with multi-process loading"):
        fastdata.loader(raw_npy, batch_size=8, multiprocessing_context="spawn")
    loader = fastdata.loader(raw_npy, batch_size=8, seed=0, timeout=5, worker_init_fn=print)  # no workers: unused
    assert (loader.batch_size, loader.num_workers, loader.timeout, len(loader)) == (None, 0, 5, 7)
    assert loader.sampler is loader.index_sampler and loader.dataset is raw_npy and loader.sampler.batch_size == 8
    assert sum(len(labels) for _, labels in loader) == 50


@pytest.mark.skipif(torch.accelerator.is_available(), reason="checks the behaviour without an accelerator")
def test_nw0_pin_memory_without_an_accelerator_warns_like_the_dataloader(raw_npy) -> None:
    want = list(fastdata.loader(raw_npy, batch_size=8, seed=1))
    loader = fastdata.loader(raw_npy, batch_size=8, seed=1, pin_memory=True)
    for epoch in range(2):  # the DataLoader warns on every new iterator; so does the torch backend
        loader.set_epoch(0)
        with pytest.warns(UserWarning, match="'pin_memory' argument is set as true but no accelerator is found"):
            iterator = iter(loader)
        got = list(iterator)
        assert all(same(a, b) for a, b in zip(got, want)) and len(got) == 7
    with pytest.warns(UserWarning, match="'pin_memory' argument is set as true but no accelerator is found"):
        threaded = fastdata.loader(raw_npy, batch_size=8, seed=1, pin_memory=True, backend="thread")  # at construction
    assert all(same(a, b) for a, b in zip(threaded, want))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["torch", "thread"])
def test_nw0_pin_memory_pins_every_batch(raw_npy, backend: str) -> None:
    want = list(fastdata.loader(raw_npy, batch_size=8, seed=1))
    got = list(fastdata.loader(raw_npy, batch_size=8, seed=1, pin_memory=True, backend=backend))
    assert all(t.is_pinned() for batch in got for t in batch) and all(not t.is_pinned() for batch in want for t in batch)
    assert all(same(a, b) for a, b in zip(got, want)) and len(got) == 7
