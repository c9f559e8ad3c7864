"""A fused crop on a dataset with fields (issue #22 item 6, docs/reading.md "fused"): masks, boxes
and further images get the image's drawn box and flip, exactly what torchvision's unfused v2
pipeline gives for the same random stream; the rest of the transform runs once, after."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

import fastdata
from conftest import FIELD_FORMATS, SUFFIXES
from fastdata.errors import InvalidOptionError
from fastdata.formats.tar import TarDataset, TarIndexedDataset
from fastdata.reader.fused import generator_for

FORMATS = {name: SUFFIXES[name] for name in FIELD_FORMATS}  # format -> output name ending
HEIGHT, WIDTH = 48, 64
SEED, EPOCH = 3, 2


def _image(index: int, codec: str) -> Image.Image:
    rng = np.random.default_rng(index)
    pixels = rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    if codec == "png":
        return Image.fromarray(pixels)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return Image.open(io.BytesIO(buffer.getvalue()))


class Segmentation:
    """image + class-id mask + boxes + a second image (``depth``) + label, all HEIGHT x WIDTH."""

    def __init__(self, codec: str = "png", depth_size: tuple[int, int] = (HEIGHT, WIDTH)):
        self.codec, self.depth_size = codec, depth_size

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> dict:
        mask = (np.arange(HEIGHT * WIDTH).reshape(HEIGHT, WIDTH) // (7 + index)) % 5
        boxes = torch.tensor([[4.0, 6.0, 40.0, 30.0], [0.0, 0.0, WIDTH, HEIGHT], [50.5, 20.25, 63.0, 47.0]])[: 1 + index % 3]
        depth = np.random.default_rng(100 + index).integers(0, 256, (*self.depth_size, 3), dtype=np.uint8)
        return {"image": _image(index, self.codec), "mask": tv_tensors.Mask(torch.from_numpy(mask.astype(np.uint8))),
                "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(HEIGHT, WIDTH)),
                "depth": tv_tensors.Image(torch.from_numpy(depth).permute(2, 0, 1)), "label": index}


def _open(path: Path, **options):
    return TarIndexedDataset(path, **options) if path.suffix == ".tar" else fastdata.open_dataset(path, **options)


def _expected(path: Path, transform, index: int) -> dict:
    """torchvision's own pipeline on the unfused sample, its global generator seeded like the
    stream the fused decode draws sample ``index``'s crop from."""
    plain = _open(path)[index]
    torch.manual_seed(generator_for(SEED, EPOCH, index).initial_seed())
    return transform(plain)


def _assert_same(got: dict, want: dict, *, exact_image: bool) -> None:
    assert list(got) == list(want)
    for name in ("mask", "boxes", "depth"):
        assert type(got[name]) is type(want[name]), name
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        assert torch.equal(got[name], want[name]), name
    assert got["boxes"].canvas_size == want["boxes"].canvas_size
    assert got["boxes"].format == want["boxes"].format
    assert type(got["image"]) is tv_tensors.Image and got["image"].shape == want["image"].shape
    if exact_image:
        assert torch.equal(got["image"], want["image"])
    assert got["label"] == want["label"]


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("codec", ["png", "jpeg"])
def test_masks_boxes_and_images_get_the_fused_crop_and_flip_of_their_image(tmp_path: Path, name: str, codec: str) -> None:
    out = tmp_path / f"seg{FORMATS[name]}"
    fastdata.convert(Segmentation(codec), out, workers=0, store="encoded", reencode="jpeg:90" if codec == "jpeg" else None)
    stored = (out / "data.bin").read_bytes()[:3] if name == "npy" else None
    if stored is not None:
        assert stored == (b"\x89PN" if codec == "png" else b"\xff\xd8\xff")  # the JPEG takes the DCT-scaled path
    transform = v2.Compose([v2.RandomResizedCrop(24, scale=(0.2, 0.9)), v2.RandomHorizontalFlip()])
    ds = _open(out, transform=transform, seed=SEED)
    assert ds.decoder.plan is not None
    ds.set_epoch(EPOCH)
    flips = set()
    for index in range(len(ds)):
        got, want = ds[index], _expected(out, transform, index)
        _assert_same(got, want, exact_image=codec == "png")  # PNG: the full decode, pixel-equal to torchvision
        assert got["image"].shape == (3, 24, 24) and got["mask"].shape == (24, 24) and got["boxes"].canvas_size == (24, 24)
        draw = ds.decoder.plan.draw(HEIGHT, WIDTH, generator_for(SEED, EPOCH, index))  # the box FusedPlan draws
        plain = _open(out)[index]
        for field in ("mask", "boxes"):
            cropped = F.resized_crop(plain[field], draw.top, draw.left, draw.height, draw.width, [24, 24])
            assert torch.equal(got[field], F.horizontal_flip(cropped) if draw.flip else cropped)
        flips.add(draw.flip)
        assert set(got["mask"].unique().tolist()) <= set(range(5))  # nearest neighbour: class ids only
    assert flips == {True, False}  # both flips happened (six samples, the same draws every run)
    batch = ds[[4, 1]]
    assert batch["image"].shape == (2, 3, 24, 24) and batch["mask"].shape == (2, 24, 24)
    assert torch.equal(batch["mask"][1], _expected(out, transform, 1)["mask"])
    assert torch.equal(batch["boxes"][0], _expected(out, transform, 4)["boxes"])


def test_the_rest_of_the_transform_runs_once_after_the_fused_crop(tmp_path: Path) -> None:
    out = tmp_path / "seg.npy"
    fastdata.convert(Segmentation(), out, workers=0, store="encoded")
    transform = v2.Compose([v2.RandomResizedCrop(20), v2.RandomHorizontalFlip(), v2.RandomVerticalFlip(p=1.0),
                            v2.ToDtype(torch.float32, scale=True)])
    ds = fastdata.open_dataset(out, transform=transform, seed=SEED)
    assert ds.decoder.fusion.rest is not None
    ds.set_epoch(EPOCH)
    for index in (0, 3, 5):
        _assert_same(ds[index], _expected(out, transform, index), exact_image=True)
        assert ds[index]["image"].dtype == torch.float32


def test_resize_and_center_crop_fused_move_masks_and_boxes_alike(tmp_path: Path) -> None:
    out = tmp_path / "seg.h5"
    fastdata.convert(Segmentation(), out, workers=0, store="encoded")
    transform = v2.Compose([v2.Resize(30), v2.CenterCrop((28, 32))])
    ds = fastdata.open_dataset(out, transform=transform)
    assert ds.decoder.plan.kind == "resize_center_crop"
    plain = fastdata.open_dataset(out)
    for index in range(len(ds)):
        _assert_same(ds[index], transform(plain[index]), exact_image=True)


def test_the_streaming_tar_reader_draws_the_epochs_crops_for_every_field(tmp_path: Path) -> None:
    out = tmp_path / "seg.tar"
    fastdata.convert(Segmentation(), out, workers=0, store="encoded")
    transform = v2.Compose([v2.RandomResizedCrop(24), v2.RandomHorizontalFlip()])
    stream = TarDataset(out, transform=transform, seed=SEED)
    stream.set_epoch(EPOCH)
    seen = sorted((sample["label"], sample) for sample in stream)
    assert [label for label, _ in seen] == list(range(6))
    for label, sample in seen:
        _assert_same(sample, _expected(out, transform, label), exact_image=True)


def test_a_field_of_another_size_is_a_clear_error_not_a_mismatch(tmp_path: Path) -> None:
    out = tmp_path / "odd.npy"
    fastdata.convert(Segmentation(depth_size=(40, 64)), out, workers=0, store="encoded")
    transform = v2.Compose([v2.RandomResizedCrop(24), v2.RandomHorizontalFlip()])
    with pytest.raises(ValueError, match="multiple HxW"):  # what torchvision says unfused
        fastdata.open_dataset(out, transform=transform, fuse=False)[0]
    with pytest.raises(InvalidOptionError, match=r"odd\.npy' sample 2: field 'depth' is 40x64 \(HxW\) but its image "
                                                 r"'image' is 48x64; the transform crops them together only at one size"):
        fastdata.open_dataset(out, transform=transform)[2]


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_fastdata_loader_batches_carry_the_epochs_crops_for_every_field(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "seg.npy"
    fastdata.convert(Segmentation(), out, workers=0, store="encoded")
    transform = v2.Compose([v2.RandomResizedCrop(24), v2.RandomHorizontalFlip()])
    ds = fastdata.open_dataset(out, transform=transform, seed=SEED)
    loader = fastdata.loader(ds, batch_size=3, shuffle=False, num_workers=2, backend=backend)
    loader.set_epoch(EPOCH)
    batches = list(loader)
    assert [batch["label"].tolist() for batch in batches] == [[0, 1, 2], [3, 4, 5]]
    for batch in batches:
        for row, index in enumerate(batch["label"].tolist()):
            want = _expected(out, transform, index)
            assert torch.equal(batch["image"][row], want["image"]) and torch.equal(batch["mask"][row], want["mask"])
            assert torch.equal(batch["boxes"][row], want["boxes"]) and torch.equal(batch["depth"][row], want["depth"])
