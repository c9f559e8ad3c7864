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
