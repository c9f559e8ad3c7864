"""The npy format: pixel-exact raw, byte-exact encoded, plain-numpy readable, errors."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from conftest import expected_pixels, pattern, save
from fastdata.errors import (
    BadSampleError, CorruptDataError, InvalidOptionError, OutputExistsError, ShapeMismatchError,
    UnknownFormatError,
)
from fastdata.sources import scan_folder
from fastdata.testing import FormatContract


class TestNpyFormat(FormatContract):
    format = "npy"

    @staticmethod
    def stored_bytes(out: Path) -> list[bytes]:
        data = np.fromfile(out / "data.bin", dtype=np.uint8)
        offsets = np.load(out / "offsets.npy")
        return [data[offsets[i] : offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]

    @classmethod
    def set_label(cls, out: Path, sample: int, label: int) -> None:
        labels = np.load(out / "labels.npy")
        labels[sample] = label
        np.save(out / "labels.npy", labels)
        cls.reseal(out)

    @classmethod
    def garble_sample(cls, out: Path, sample: int) -> None:
        start, stop = np.load(out / "offsets.npy")[sample : sample + 2]
        with open(out / "data.bin", "r+b") as handle:
            handle.seek(int(start))
            handle.write(b"x" * int(stop - start))
        cls.reseal(out)

    @staticmethod
    def sample_file(out: Path, sample: int) -> Path:
        return out / "data.bin"

    def damage(self, out: Path) -> str:
        data = out / ("images.npy" if (out / "images.npy").exists() else "data.bin")
        data.write_bytes(data.read_bytes()[:-100])
        return rf"{data.name}' is \d+ bytes but the manifest says \d+ \(truncated\)"


@pytest.mark.parametrize("workers", [0, 2])
def test_raw_resize_round_trip_is_pixel_exact(mixed_folder: Path, tmp_path: Path, workers: int) -> None:
    out = tmp_path / "mixed.npy"
    manifest = fastdata.convert(mixed_folder, out, format="npy", store="raw", resize="8x6", workers=workers)
    keys, labels, _ = scan_folder(mixed_folder)
    images = np.load(out / "images.npy", mmap_mode="r")
    assert images.shape == (7, 8, 6, 3) and images.dtype == np.uint8
    assert np.load(out / "labels.npy").tolist() == labels
    for i, key in enumerate(keys):
        np.testing.assert_array_equal(images[i], expected_pixels(mixed_folder / key, "RGB", (8, 6)))
    ds = fastdata.MemmapDataset(out)
    image, label = ds[2]
    assert image.shape == (3, 8, 6) and image.dtype == torch.uint8 and label == labels[2]
    np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), images[2])
    assert manifest["count"] == 7 and manifest["image"]["shape"] == [8, 6, 3]
    assert manifest["class_to_idx"] == {"cat": 0, "dog": 1} and manifest["classes"] == ["cat", "dog"]


def test_encoded_keeps_original_bytes(mixed_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "enc.npy"
    fastdata.convert(mixed_folder, out, format="npy", store="encoded", workers=0)
    keys, labels, _ = scan_folder(mixed_folder)
    data = np.fromfile(out / "data.bin", dtype=np.uint8)
    offsets = np.load(out / "offsets.npy")
    assert offsets.tolist()[0] == 0 and len(offsets) == len(keys) + 1
    ds = fastdata.open_dataset(out, image_format="numpy")
    for i, key in enumerate(keys):
        assert data[offsets[i] : offsets[i + 1]].tobytes() == (mixed_folder / key).read_bytes()
        image, label = ds[i]
        np.testing.assert_array_equal(image, expected_pixels(mixed_folder / key, "RGB"))
        assert label == labels[i]


def test_auto_mode_is_grayscale_only_when_every_image_is(tmp_path: Path) -> None:
    root = tmp_path / "gray"
    save(Image.fromarray(pattern(6, 6, 1)[:, :, 0]), root / "a" / "l.png")
    wide = (pattern(6, 6, 2)[:, :, 0].astype(np.uint16) * 257 + 3).astype(np.uint16)
    save(Image.fromarray(wide), root / "a" / "wide.png")
    save(Image.fromarray(pattern(6, 6, 3, channels=2)), root / "b" / "la.png")
    manifest = fastdata.convert(root, tmp_path / "g.npy", workers=0)
    assert manifest["image"]["mode"] == "L" and manifest["image"]["shape"] == [6, 6, 1]
    images = np.load(tmp_path / "g.npy" / "images.npy")
    np.testing.assert_array_equal(images[0, :, :, 0], pattern(6, 6, 1)[:, :, 0])
    np.testing.assert_array_equal(images[1, :, :, 0], (wide >> 8).astype(np.uint8))  # scaled, not clipped
    np.testing.assert_array_equal(images[2, :, :, 0], pattern(6, 6, 3, channels=2)[:, :, 0])
    forced = fastdata.convert(root, tmp_path / "rgb.npy", mode="RGB", workers=0)
    assert forced["image"]["shape"] == [6, 6, 3]
    rgb = np.load(tmp_path / "rgb.npy" / "images.npy")
    np.testing.assert_array_equal(rgb[0], np.repeat(images[0], 3, axis=2))


def test_shorter_side_resize_and_center_crop_match_torchvision(mixed_folder: Path, tmp_path: Path) -> None:
    from torchvision.transforms import v2

    out = tmp_path / "crop.npy"
    fastdata.convert(mixed_folder, out, resize=9, center_crop="7x5", workers=0)
    keys, _, _ = scan_folder(mixed_folder)
    pipeline = v2.Compose([v2.Resize(9, interpolation=v2.InterpolationMode.BILINEAR), v2.CenterCrop((7, 5))])
    images = np.load(out / "images.npy")
    for i, key in enumerate(keys):
        reference = np.asarray(pipeline(Image.open(mixed_folder / key).convert("RGB")))
        np.testing.assert_array_equal(images[i], reference)


def test_mixed_sizes_without_resize_name_the_file(mixed_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ShapeMismatchError) as info:
        fastdata.convert(mixed_folder, tmp_path / "x.npy", workers=0)
    message = str(info.value)
    assert "cat/a.png is 20x30 (HxW) but" in message and "cat/B.JPG is 25x18" in message
    assert "--resize HxW" in message and "--store encoded" in message
    assert not (tmp_path / "x.npy").exists() and not (tmp_path / "x.npy.partial").exists()


def test_existing_output_is_refused_then_overwritten(uniform_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "u.npy"
    fastdata.convert(uniform_folder, out, workers=0)
    with pytest.raises(OutputExistsError, match="already exists. Pass --overwrite"):
        fastdata.convert(uniform_folder, out, workers=0)
    fastdata.convert(uniform_folder, out, workers=0, overwrite=True, resize="4x4")
    assert np.load(out / "images.npy").shape == (12, 4, 4, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u.npy", "uniform"]


def test_corrupt_image_is_named_and_skip_bad_lists_it(uniform_folder: Path, tmp_path: Path) -> None:
    good = (uniform_folder / "bee" / "1.png").read_bytes()
    (uniform_folder / "bee" / "1.png").write_bytes(good[: len(good) // 2])
    (uniform_folder / "cow" / "zero.png").write_bytes(b"")
    with pytest.raises(BadSampleError) as info:
        fastdata.convert(uniform_folder, tmp_path / "bad.npy", workers=0)
    assert "cow/zero.png: cannot read image (not a recognised image file)" in str(info.value)
    assert "--skip-bad" in str(info.value)
    assert list(tmp_path.iterdir()) == [uniform_folder]
    manifest = fastdata.convert(uniform_folder, tmp_path / "ok.npy", workers=0, skip_bad=True)
    assert manifest["count"] == 11
    assert [s["key"] for s in manifest["skipped"]] == ["bee/1.png", "cow/zero.png"]
    assert "truncated" in manifest["skipped"][0]["reason"]
    images = np.load(tmp_path / "ok.npy" / "images.npy")  # header rewritten to the real count
    assert images.shape == (11, 12, 10, 3)
    np.testing.assert_array_equal(images[-1], expected_pixels(uniform_folder / "cow" / "3.png", "RGB"))


def test_foreign_manifest_refused(uniform_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "v.npy"
    fastdata.convert(uniform_folder, out, workers=0)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps(dict(manifest, format="zarr")))
    with pytest.raises(UnknownFormatError, match="Unknown format 'zarr'. Available formats: 'folder', "):
        fastdata.open_dataset(out)
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(fastdata.FastdataError, match="manifest is not valid JSON"):
        fastdata.MemmapDataset(out)


def test_truncated_images_file_names_the_file(uniform_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.npy"
    fastdata.convert(uniform_folder, out, workers=0)
    data = (out / "images.npy").read_bytes()
    message = rf"images\.npy' is {len(data) - 100} bytes but the manifest says {len(data)} \(truncated\)"
    ds = fastdata.MemmapDataset(out)  # opened while the file was whole
    (out / "images.npy").write_bytes(data[:-100])
    with pytest.raises(CorruptDataError, match=message):  # checked again where the file is first mapped
        ds[0]
    with pytest.raises(CorruptDataError, match=message):  # and at open
        fastdata.MemmapDataset(out)


def test_batch_paths_and_pickling(uniform_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "b.npy"
    fastdata.convert(uniform_folder, out, workers=0)
    ds = fastdata.MemmapDataset(out)
    images, labels = ds[[5, 0, 11]]
    assert images.shape == (3, 3, 12, 10) and labels.dtype == torch.int64
    assert labels.tolist() == [1, 0, 2]
    for row, index in enumerate([5, 0, 11]):
        assert torch.equal(images[row], ds[index][0])
    samples = ds.__getitems__([4, 1])
    assert [label for _, label in samples] == [1, 0] and torch.equal(samples[0][0], ds[4][0])
    np_images, np_labels = fastdata.MemmapDataset(out, image_format="numpy")[np.array([1, 2])]
    assert np_images.shape == (2, 12, 10, 3) and np_labels.tolist() == [0, 0]
    assert torch.equal(ds[-1][0], ds[11][0])
    with pytest.raises(IndexError, match="index 12 is out of range for a dataset of 12 samples"):
        ds[12]
    ds[0]  # opens the memmap in this process; pickling must not carry it
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._handles is None and torch.equal(clone[3][0], ds[3][0])
    pil, label = fastdata.MemmapDataset(out, image_format="pil", target_transform=lambda y: y * 10)[4]
    assert isinstance(pil, Image.Image) and pil.size == (10, 12) and label == 10


def test_transforms_apply_on_both_paths(uniform_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "tf.npy"
    fastdata.convert(uniform_folder, out, workers=0)
    ds = fastdata.MemmapDataset(out, transform=lambda x: x.float() / 255, target_transform=lambda y: -y)
    images, labels = ds[[0, 4]]
    assert images.dtype == torch.float32 and labels.tolist() == [0, -1]
    batch = fastdata.MemmapDataset(out, batch_transform=lambda x: x[:, :, :2])
    assert batch[[0, 1]][0].shape == (2, 3, 2, 10)


def test_option_errors_follow_the_style(uniform_folder: Path, tmp_path: Path) -> None:
    cases = [
        (dict(format="hfd5"), UnknownFormatError, "Unknown output format 'hfd5'|Unknown format 'hfd5'. Available formats: "),
        (dict(store="zip"), InvalidOptionError, "Unknown store 'zip' for format 'npy'. Allowed: 'raw', 'encoded'."),
        (dict(mode="CMYK"), InvalidOptionError, "Unknown mode 'CMYK'. Allowed: 'auto', 'RGB', 'L'."),
        (dict(resize="big"), InvalidOptionError, "Invalid --resize"),
        (dict(center_crop="8"), InvalidOptionError, "Invalid --center-crop"),
        (dict(reencode="gif"), InvalidOptionError, "Invalid --reencode 'gif'"),
        (dict(compression="gzip"), InvalidOptionError, "Option 'compression' does not apply to format 'npy'"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            fastdata.convert(uniform_folder, tmp_path / "o.npy", **kwargs)
    assert not (tmp_path / "o.npy").exists()


def test_auto_mode_restarts_as_rgb_when_a_late_image_is_colour(tmp_path: Path) -> None:
    root = tmp_path / "late"
    for i in range(70):  # more than the planner's probe of the first 64 images
        save(Image.fromarray(pattern(5, 5, i)[:, :, 0]), root / "a" / f"{i:03d}.png")
    save(Image.fromarray(pattern(5, 5, 99)), root / "b" / "colour.png")
    progress = []
    manifest = fastdata.convert(root, tmp_path / "late.npy", workers=2, progress=lambda n, total: progress.append(n))
    assert manifest["image"]["mode"] == "RGB" and manifest["count"] == 71
    assert sum(progress) == 71  # the restart rewinds the progress it had reported
    images = np.load(tmp_path / "late.npy" / "images.npy")
    np.testing.assert_array_equal(images[3], np.repeat(pattern(5, 5, 3)[:, :, :1], 3, axis=2))
    np.testing.assert_array_equal(images[70], pattern(5, 5, 99))


def test_classic_transforms_as_docs_reading_says(uniform_folder, tmp_path):
    """docs/reading.md: a ToTensor pipeline fails on the uint8 tensor; with image_format="pil" it
    works, and the v2 pipeline on the tensor gives the same values."""
    from torchvision import transforms
    from torchvision.transforms import v2

    out = tmp_path / "o.npy"
    fastdata.convert(uniform_folder, out, workers=0)
    classic = transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.25] * 3)])
    with pytest.raises(TypeError, match="pic should be PIL Image or ndarray"):
        fastdata.open_dataset(out, transform=classic)[0]
    via_pil = fastdata.open_dataset(out, image_format="pil", transform=classic)[5][0]
    modern = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.25] * 3)])
    via_v2 = fastdata.open_dataset(out, transform=modern)[5][0]
    assert via_pil.dtype == via_v2.dtype == torch.float32 and via_pil.shape == (3, 12, 10)
    torch.testing.assert_close(via_pil, via_v2)
