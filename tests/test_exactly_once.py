"""Exactly once, every time: every reader of every format and store, under every loader set-up.

Parametrized over the registry (each writable format x each of its stores, plus a few extra
on-disk layouts that take a different read path). The source's pixels spell each sample's
index, so a sample read twice, lost, mixed up with another or given the wrong label is caught.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import fastdata
from fastdata.formats import all_formats, get_format

COUNT = 47  # prime: every batch size, shard size and worker count leaves a remainder
CLASSES = 5
BATCH = 5
SIDE = 4


def sample_pixels(index: int) -> np.ndarray:
    """Sample ``index``'s 4x4 RGB pixels: red spells the index, green/blue vary per pixel."""
    pixels = np.empty((SIDE, SIDE, 3), dtype=np.uint8)
    pixels[:, :, 0] = index
    pixels[:, :, 1] = (np.arange(SIDE * SIDE).reshape(SIDE, SIDE) * 13 + index * 7) % 256
    pixels[:, :, 2] = 255 - index
    return pixels


class Numbered(torch.utils.data.Dataset):
    """A plain map-style source (no ``.data`` fast path): ``(HWC uint8 array, index % CLASSES)``."""

    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        if not 0 <= index < COUNT:
            raise IndexError(index)
        return sample_pixels(index), index % CLASSES


# num_workers=3 on a 2-core machine: torch warns that it suggests fewer workers (warnings are errors)
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

EXPECTED = Counter((i, i % CLASSES) for i in range(COUNT))

# Extra layouts with their own read path: several tar shards of unequal size (so some splits
# take whole shards and some cut within them), chunked + compressed HDF5 (the chunk cache).
EXTRA_OPTIONS = {("tar", "raw"): {"shard_samples": 10}, ("tar", "encoded"): {"shard_samples": 10}}
EXTRA_LAYOUTS = [("hdf5", "raw", "gzip-chunks", {"compression": "gzip", "chunk_images": 7})]
LAYOUTS = [
    (spec.name, store, "default", EXTRA_OPTIONS.get((spec.name, store), {}))
    for spec in all_formats()
    if spec.writable
    for store in spec.stores
] + EXTRA_LAYOUTS
# The registry names one reader per format; an iterable one's map-style sibling is named here.
MAP_STYLE = {"tar": fastdata.TarIndexedDataset}
ITERABLE = [layout for layout in LAYOUTS if issubclass(get_format(layout[0]).dataset, IterableDataset)]


def layout_id(layout) -> str:
    name, store, label, _ = layout
    return f"{name}-{store}" + ("" if label == "default" else f"-{label}")


@pytest.fixture(scope="module")
def convert_once(tmp_path_factory):
    """Converts each layout once for the whole module; returns its path."""
    done: dict[str, Path] = {}

    def convert(layout) -> Path:
        key = layout_id(layout)
        if key not in done:
            name, store, _, options = layout
            out = tmp_path_factory.mktemp("exactly-once") / key
            manifest = fastdata.convert(Numbered(), out, format=name, store=store, workers=0, **options)
            assert manifest["count"] == COUNT
            done[key] = out
        return done[key]

    return convert


@pytest.fixture(params=LAYOUTS, ids=layout_id)
def map_style(request, convert_once):
    name = request.param[0]
    reader = MAP_STYLE.get(name, get_format(name).dataset)
    ds = reader(convert_once(request.param))
    assert not isinstance(ds, IterableDataset) and len(ds) == COUNT
    return ds


@pytest.fixture(params=ITERABLE, ids=layout_id)
def iterable(request, convert_once):
    return get_format(request.param[0]).dataset, convert_once(request.param)


def records(loader, seen_order: list[int]) -> Counter:
    """The multiset of (index spelled by the pixels, label) one pass over ``loader`` yields.

    Every image must equal the source pixels of the index it spells, not only its red channel.
    """
    found: Counter = Counter()
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, SIDE, SIDE)
        assert labels.dtype == torch.int64 and len(labels) == len(images)
        for image, label in zip(images.permute(0, 2, 3, 1).numpy(), labels.tolist()):
            index = int(image[0, 0, 0])
            np.testing.assert_array_equal(image, sample_pixels(index), err_msg=f"sample {index}")
            found[(index, label)] += 1
            seen_order.append(index)
    return found


def check_epochs(make_loader, shuffle: bool, *, in_order: bool = False, epochs: int = 2) -> None:
    """``epochs`` passes each yield every sample exactly once; a shuffled pass is not in index
    order, and with ``in_order`` an unshuffled pass is."""
    for epoch in range(epochs):
        order: list[int] = []
        found = make_loader(epoch, order)
        missing, extra = EXPECTED - found, found - EXPECTED
        assert not missing and not extra, f"epoch {epoch}: missing {sorted(missing)}, extra {sorted(extra)}"
        if shuffle:
            assert order != sorted(order), f"epoch {epoch}: shuffle=True read in index order"
        elif in_order:
            assert order == list(range(COUNT)), f"epoch {epoch}: shuffle=False read out of index order"


def fork(num_workers: int) -> dict:
    return {"num_workers": num_workers, "multiprocessing_context": "fork" if num_workers else None}


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_map_style_readers_yield_every_sample_once(map_style, num_workers: int, shuffle: bool) -> None:
    """MemmapDataset, HDF5Dataset, TarIndexedDataset: with fastdata.loader and the standard DataLoader."""
    fast = fastdata.loader(map_style, batch_size=BATCH, shuffle=shuffle, seed=3, **fork(num_workers))
    check_epochs(lambda epoch, order: records(fast, order), shuffle, in_order=True)
    standard = DataLoader(map_style, batch_size=BATCH, shuffle=shuffle, **fork(num_workers))
    check_epochs(lambda epoch, order: records(standard, order), shuffle, in_order=True)


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_iterable_reader_yields_every_sample_once_across_ranks(
    iterable, num_workers: int, shuffle: bool, world_size: int
) -> None:
    """TarDataset: the union over ranks (one DataLoader each, as DDP runs them) is the dataset."""
    reader, path = iterable

    def epoch_over_ranks(epoch: int, order: list[int]) -> Counter:
        found: Counter = Counter()
        for rank in range(world_size):
            ds = reader(path, shuffle=shuffle, seed=7, shuffle_buffer=8, rank=rank, world_size=world_size)
            ds.set_epoch(epoch)
            found += records(DataLoader(ds, batch_size=BATCH, **fork(num_workers)), order)
        return found

    # workers interleave, and ranks are read one after the other: in order only on one process
    check_epochs(epoch_over_ranks, shuffle, in_order=num_workers <= 1 and world_size == 1)
