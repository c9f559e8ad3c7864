"""The contract every writable format in the registry keeps (parametrized over the registry)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset

import fastdata
from fastdata.errors import BadSampleError, OutputExistsError
from fastdata.formats import all_formats
from fastdata.sources import scan_folder

WRITABLE = [(spec.name, store) for spec in all_formats() if spec.writable for store in spec.stores]


def output_path(tmp_path: Path, name: str) -> Path:
    return tmp_path / f"out-{name}"


@pytest.fixture(params=WRITABLE, ids=[f"{f}-{s}" for f, s in WRITABLE])
def converted(request, uniform_folder: Path, tmp_path: Path):
    name, store = request.param
    out = output_path(tmp_path, f"{name}-{store}")
    fastdata.convert(uniform_folder, out, format=name, store=store, workers=0)
    keys, labels, _ = scan_folder(uniform_folder)
    expected = [(np.asarray(Image.open(uniform_folder / k).convert("RGB")), y) for k, y in zip(keys, labels)]
    return out, expected


def as_records(images, labels) -> list[tuple[bytes, int]]:
    images = images.permute(0, 2, 3, 1).contiguous().numpy()
    return [(image.tobytes(), int(label)) for image, label in zip(images, labels)]


def sorted_expected(expected) -> list[tuple[bytes, int]]:
    return sorted((np.ascontiguousarray(image).tobytes(), label) for image, label in expected)


def test_round_trip_len_and_manifest(converted) -> None:
    out, expected = converted
    ds = fastdata.open_dataset(out)
    manifest = fastdata.formats.find_manifest(out)
    assert manifest["count"] == len(expected) == 12
    assert manifest["class_to_idx"] == {"ant": 0, "bee": 1, "cow": 2}
    assert manifest["files"] and all("blake2b" in entry for entry in manifest["files"].values())
    if isinstance(ds, IterableDataset):
        got = [(image.permute(1, 2, 0).numpy(), label) for image, label in ds]
        assert sorted_expected(got) == sorted_expected(expected)
        return
    assert len(ds) == 12
    for i, (image, label) in enumerate(expected):
        got, got_label = ds[i]
        np.testing.assert_array_equal(got.permute(1, 2, 0).numpy(), image)
        assert got_label == label


def test_pickled_dataset_reads_the_same(converted) -> None:
    out, expected = converted
    ds = fastdata.open_dataset(out)
    clone = pickle.loads(pickle.dumps(ds))
    if isinstance(ds, IterableDataset):
        assert sum(1 for _ in clone) == len(expected)
    else:
        ds[0]
        clone = pickle.loads(pickle.dumps(ds))
        assert all(torch.equal(clone[i][0], ds[i][0]) for i in range(len(ds)))


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_sample_exactly_once_with_fork(converted, num_workers: int, shuffle: bool) -> None:
    out, expected = converted
    ds = fastdata.open_dataset(out)
    context = "fork" if num_workers else None
    if isinstance(ds, IterableDataset):
        loaders = [DataLoader(ds, batch_size=5, num_workers=num_workers, multiprocessing_context=context)]
    else:
        loaders = [
            DataLoader(ds, batch_size=5, shuffle=shuffle, num_workers=num_workers, multiprocessing_context=context),
            fastdata.loader(ds, batch_size=5, shuffle=shuffle, num_workers=num_workers, seed=1,
                            multiprocessing_context=context),
        ]
    for loader in loaders:
        records = [r for images, labels in loader for r in as_records(images, labels)]
        assert sorted(records) == sorted_expected(expected)


def test_every_sample_exactly_once_with_spawn_after_parent_read(converted) -> None:
    out, expected = converted
    ds = fastdata.open_dataset(out)
    if not isinstance(ds, IterableDataset):
        ds[0]  # the parent opens its files first; workers must open their own
    loader = (
        DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context="spawn")
        if isinstance(ds, IterableDataset)
        else fastdata.loader(ds, batch_size=5, num_workers=2, multiprocessing_context="spawn")
    )
    records = [r for images, labels in loader for r in as_records(images, labels)]
    assert sorted(records) == sorted_expected(expected)


class FailsAt(torch.utils.data.Dataset):
    def __init__(self, bad: int):
        self.bad = bad

    def __len__(self):
        return 300

    def __getitem__(self, i):
        if i == self.bad:
            raise OSError("disk went away")
        return np.full((4, 4, 3), i % 256, dtype=np.uint8), i % 3


@pytest.mark.parametrize("name,store", WRITABLE, ids=[f"{f}-{s}" for f, s in WRITABLE])
@pytest.mark.parametrize("workers", [0, 2])
def test_failure_mid_write_leaves_nothing(tmp_path: Path, name: str, store: str, workers: int) -> None:
    out = output_path(tmp_path, name)
    with pytest.raises(BadSampleError, match="sample 250: cannot load sample \\(disk went away\\)"):
        # mode and size are given, so no scan pass runs: the failure comes after batches were written
        fastdata.convert(FailsAt(250), out, format=name, store=store, workers=workers, mode="RGB", resize="4x4")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", sorted({f for f, _ in WRITABLE}))
def test_existing_output_refused_without_overwrite(uniform_folder: Path, tmp_path: Path, name: str) -> None:
    out = output_path(tmp_path, name)
    fastdata.convert(uniform_folder, out, format=name, workers=0)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(OutputExistsError):
        fastdata.convert(uniform_folder, out, format=name, workers=0)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
