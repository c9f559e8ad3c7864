"""torchvision datasets convert and read back equal to the dataset's own items."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.datasets import MNIST, FakeData

import fastdata
from fastdata.errors import InvalidOptionError, SourceNotFoundError
from fastdata.sources import ArraySource, DatasetSource, resolve_source


@pytest.mark.parametrize("split", ["train", "test"])
def test_mnist_fast_path_round_trip(mnist_root: Path, tmp_path: Path, split: str) -> None:
    reference = MNIST(str(mnist_root), train=split == "train")
    source = resolve_source("torchvision:MNIST", root=mnist_root, split=split)
    assert isinstance(source, ArraySource)
    out = tmp_path / f"mnist-{split}.npy"
    manifest = fastdata.convert("torchvision:MNIST", out, root=mnist_root, split=split, workers=0)
    assert manifest["count"] == len(reference) == (40 if split == "train" else 15)
    assert manifest["image"]["shape"] == [28, 28, 1] and manifest["image"]["mode"] == "L"
    assert manifest["classes"] == reference.classes
    assert manifest["source"] == {"type": "torchvision", "name": "MNIST", "split": split, "root": str(mnist_root), "length": len(reference)}
    ds = fastdata.open_dataset(out, image_format="numpy")
    for i in range(len(reference)):
        image, label = reference[i]
        got, got_label = ds[i]
        np.testing.assert_array_equal(got[:, :, 0], np.asarray(image))
        assert got_label == label


def test_mnist_encoded_and_resized(mnist_root: Path, tmp_path: Path) -> None:
    reference = MNIST(str(mnist_root), train=True)
    fastdata.convert("torchvision:MNIST", tmp_path / "e.npy", root=mnist_root, store="encoded", workers=2)
    fastdata.convert("torchvision:MNIST", tmp_path / "r.npy", root=mnist_root, resize="14x14", mode="RGB", workers=0)
    encoded = fastdata.open_dataset(tmp_path / "e.npy", image_format="numpy")
    resized = np.load(tmp_path / "r.npy" / "images.npy")
    assert resized.shape == (40, 14, 14, 3)
    for i in (0, 17, 39):
        image, label = reference[i]
        np.testing.assert_array_equal(encoded[i][0][:, :, 0], np.asarray(image))  # PNG: lossless
        expected = np.asarray(image.convert("RGB").resize((14, 14), resample=2))
        np.testing.assert_array_equal(resized[i], expected)


def test_fakedata_round_trip(tmp_path: Path) -> None:
    reference = FakeData(size=30, image_size=(3, 10, 12), num_classes=4, random_offset=7)
    source = resolve_source(reference)
    assert type(source) is DatasetSource
    manifest = fastdata.convert(reference, tmp_path / "fake.npy", workers=2)
    assert manifest["count"] == 30 and manifest["image"]["shape"] == [10, 12, 3]
    ds = fastdata.open_dataset(tmp_path / "fake.npy")
    for i in range(30):
        image, label = reference[i]
        got, got_label = ds[i]
        assert torch.equal(got, torch.from_numpy(np.array(image)).permute(2, 0, 1))
        assert got_label == int(label)


def test_fakedata_by_name_with_source_options(tmp_path: Path) -> None:
    manifest = fastdata.convert(
        "torchvision:FakeData", tmp_path / "f.npy", source_options={"size": 5, "image_size": (1, 4, 4)}, workers=0
    )
    assert manifest["count"] == 5 and manifest["image"]["mode"] == "L"


class TensorPairs(torch.utils.data.Dataset):
    """A map-style dataset yielding CHW uint8 tensors (and one HWC ndarray) with int labels."""

    def __init__(self):
        rng = np.random.default_rng(3)
        self.images = rng.integers(0, 256, (6, 3, 5, 7), dtype=np.uint8)

    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 5:
            return np.moveaxis(self.images[i], 0, -1), torch.tensor(i % 2)
        return torch.from_numpy(self.images[i]), i % 2


def test_tensor_and_ndarray_items(tmp_path: Path) -> None:
    data = TensorPairs()
    fastdata.convert(data, tmp_path / "t.npy", workers=0)
    stored = np.load(tmp_path / "t.npy" / "images.npy")
    np.testing.assert_array_equal(stored, np.moveaxis(data.images, 1, -1))
    assert np.load(tmp_path / "t.npy" / "labels.npy").tolist() == [0, 1, 0, 1, 0, 1]


def test_torchvision_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="Unknown torchvision dataset 'CIFAR11'. Did you mean 'CIFAR10'?"):
        fastdata.convert("torchvision:CIFAR11", tmp_path / "x.npy", root=tmp_path)
    # a case slip, which difflib's ratio alone does not suggest
    with pytest.raises(InvalidOptionError, match="Unknown torchvision dataset 'Cifar10'. Did you mean 'CIFAR10'?"):
        fastdata.convert("torchvision:Cifar10", tmp_path / "x.npy", root=tmp_path)
    with pytest.raises(SourceNotFoundError, match="Pass --download to fetch it"):
        fastdata.convert("torchvision:MNIST", tmp_path / "x.npy", root=tmp_path / "empty")
    with pytest.raises(InvalidOptionError, match="needs --root"):
        fastdata.convert("torchvision:MNIST", tmp_path / "x.npy")
    with pytest.raises(InvalidOptionError, match="Unknown split 'val'"):
        fastdata.convert("torchvision:MNIST", tmp_path / "x.npy", root=tmp_path, split="val")
