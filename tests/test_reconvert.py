"""A converted dataset converts again, to every format, and keeps what it is: variable-shape
fields (COCO's instance masks), the encoded images' own bytes and extension, the source's
sample structure; a tar output has a ``.cls`` member only where samples have a label."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image
from torchvision import tv_tensors

import fastdata
from fastdata.formats.tar import TarDataset, TarIndexedDataset
from fastdata.formats.tar.index import load_index

SUFFIXES = (".npy", ".h5", ".tar")


def picture(index: int, height: int = 6, width: int = 8) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    return Image.fromarray(np.stack([(x * 9 + index * 40) % 256, (y * 7) % 256,
                                     np.full_like(x, index * 30)], -1).astype(np.uint8))


class Detection:
    """COCO-like samples without a label: boxes, per-object labels, (K, H, W) instance masks
    whose height and width vary with the image."""

    fastdata_kinds = {"masks": "array:ragged"}

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict:
        height, width, objects = 6 + index, 8 + 2 * index, index % 3
        boxes = torch.arange(4 * objects, dtype=torch.float32).reshape(-1, 4)
        return {"image": picture(index, height, width),
                "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(height, width)),
                "labels": torch.arange(objects, dtype=torch.int64),
                "masks": tv_tensors.Mask(torch.full((objects, height, width), index, dtype=torch.uint8))}


def member_names(out: Path) -> list[str]:
    names = []
    for shard in sorted(out.glob("shard-*.tar")):
        with tarfile.open(shard) as archive:
            names += [member.name for member in archive]
    return names


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # stock webdataset leaves its shard files open
def test_a_tar_output_has_no_cls_member_where_samples_have_no_label(tmp_path: Path) -> None:
    out = tmp_path / "det.tar"
    fastdata.convert(Detection(), out, store="encoded", workers=0, shard_samples=3)
    assert member_names(out)[:4] == ["000000000.png", "000000000.boxes.npy", "000000000.labels.npy",
                                     "000000000.masks.npy"]
    assert not [name for name in member_names(out) if name.endswith(".cls")]
    assert not any("cls_offset" in shard for shard in json.loads((out / "index.json").read_text())["shards"])
    assert load_index(out).labels.tolist() == [-1] * 4
    assert fastdata.verify(out, deep=True).ok
    streamed = list(TarDataset(out, shuffle=False))
    for index, sample in enumerate(streamed):
        assert torch.equal(sample["masks"], TarIndexedDataset(out)[index]["masks"])
        assert sample["masks"].shape == (index % 3, 6 + index, 8 + 2 * index)
    stock = list(wds.WebDataset(str(out / "shard-000000.tar"), shardshuffle=False))
    assert sorted(k for k in stock[0] if not k.startswith("__")) == ["boxes.npy", "labels.npy", "masks.npy", "png"]


def test_a_tar_output_keeps_its_cls_member_where_samples_have_a_label(tmp_path: Path) -> None:
    class Labelled(Detection):
        def __getitem__(self, index: int) -> dict:
            return {**super().__getitem__(index), "label": index % 2}

    out = tmp_path / "det.tar"
    fastdata.convert(Labelled(), out, store="encoded", workers=0)
    assert member_names(out)[:2] == ["000000000.png", "000000000.cls"]
    assert load_index(out).labels.tolist() == [0, 1, 0, 1] and TarIndexedDataset(out)[3]["label"] == 1
    assert fastdata.verify(out, deep=True).ok


# --- converting a converted dataset again ---------------------------------------------------------


def reader(path: Path):
    return TarIndexedDataset(path) if path.suffix == ".tar" else fastdata.open_dataset(path)


def same_samples(got, want) -> None:
    """Equal samples: the same structure, types, tv_tensor metadata and values."""
    assert type(got) is type(want)
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            same_samples(a, b)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            same_samples(got[key], want[key])
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        if isinstance(want, tv_tensors.BoundingBoxes):
            assert (got.format, got.canvas_size) == (want.format, want.canvas_size)
    else:
        assert got == want


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> dict[str, Path]:
    """COCO (pycocotools' masks: (K, H, W), K from 0 to 2) converted as the docs show: resized to
    raw npy, and re-encoded as JPEG to tar."""
    import tv_layouts

    root = tmp_path_factory.mktemp("coco")
    layout = tv_layouts.make_coco(root)
    out = {}
    for name, options in (("raw.npy", {"resize": "16x16"}), ("jpeg.tar", {"store": "encoded", "reencode": "jpeg:90"})):
        out[name] = root / name
        fastdata.convert("torchvision:CocoDetection", out[name], root=layout["root"], workers=0,
                         source_options={"annFile": layout["annFile"]}, **options)
    return out


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("source", ["raw.npy", "jpeg.tar"])
def test_a_converted_coco_converts_again_to_every_format(coco, tmp_path: Path, source: str, suffix: str) -> None:
    out = tmp_path / f"again{suffix}"
    store = "encoded" if source.endswith(".tar") else "raw"
    fastdata.convert(coco[source], out, store=store, workers=0)
    before, after = reader(coco[source]), reader(out)
    assert [before[i]["masks"].shape[0] for i in range(4)] == [2, 0, 1, 2]  # K differs: the reason it failed
    for index in range(4):
        same_samples(after[index], before[index])
    if store == "encoded":  # the JPEGs kept as they were stored, not decoded and stored as PNG
        assert after._encoded(np.arange(4)) == before._encoded(np.arange(4))
        assert fastdata.formats.find_manifest(out)["image"]["encoding"] == "original"
    assert fastdata.verify(out, deep=True).ok


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_an_encoded_folder_dataset_converts_again_keeping_its_jpeg_files(tmp_path: Path, suffix: str) -> None:
    folder = tmp_path / "photos"
    files = []
    for index in range(3):
        (folder / ("cat" if index % 2 else "dog")).mkdir(parents=True, exist_ok=True)
        files.append(folder / ("cat" if index % 2 else "dog") / f"{index}.jpg")
        picture(index, 10 + index, 12).save(files[-1], quality=80)
    first = tmp_path / "first.tar"
    fastdata.convert(folder, first, store="encoded", workers=0)
    out = tmp_path / f"again{suffix}"
    fastdata.convert(first, out, store="encoded", workers=0)
    stored = reader(out)._encoded(np.arange(3))
    assert sorted(stored) == sorted(file.read_bytes() for file in files)
    assert [reader(out)[i][1] for i in range(3)] == [reader(first)[i][1] for i in range(3)]
    if suffix == ".tar":
        assert [name.rsplit(".", 1)[1] for name in member_names(out)] == ["jpg", "cls"] * 3


def test_pets_samples_keep_torchvisions_structure_through_every_conversion(tmp_path: Path) -> None:
    import torchvision.datasets as tv_datasets
    import tv_layouts

    tv_layouts.make_pets(tmp_path / "pets")
    reference = tv_datasets.OxfordIIITPet(str(tmp_path / "pets"), target_types=["category", "segmentation"])
    first = tmp_path / "pets.npy"
    fastdata.convert("torchvision:OxfordIIITPet", first, root=tmp_path / "pets", workers=0,
                     source_options={"target_types": "category,segmentation"})
    again = tmp_path / "pets.tar"
    fastdata.convert(first, again, workers=0)
    for path in (first, again):
        image, (label, mask) = reader(path)[1]
        expected_image, (expected_label, expected_mask) = reference[1]
        assert label == expected_label and type(mask) is tv_tensors.Mask
        assert np.array_equal(mask.numpy(), np.asarray(expected_mask))
        assert np.array_equal(image.permute(1, 2, 0).numpy(), np.asarray(expected_image))
