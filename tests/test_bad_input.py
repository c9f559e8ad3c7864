"""Bad input, every source: a clear error naming the file (or index) and the fix, nothing left
at the output path; ``--skip-bad`` converts the rest and lists every skipped item."""

from __future__ import annotations

import io
import os
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import fastdata
from conftest import WRITABLE, pattern, run_fastdata, save
from fastdata.errors import BadSampleError



def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def huge_gray_png(width: int, height: int) -> bytes:
    """A valid all-black grayscale PNG of any size (its rows of zeros compress to almost nothing)."""
    rows = zlib.compressobj(9)
    data = b"".join(rows.compress(b"\x00" * (width + 1)) for _ in range(height)) + rows.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", data) + png_chunk(b"IEND", b"")


def jpeg_bytes(image: Image.Image, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", **kwargs)
    return buffer.getvalue()


BAD = {
    "truncated.jpg": lambda: jpeg_bytes(Image.fromarray(pattern(32, 32, 1)))[:300],
    "truncated.png": lambda: (lambda b: b[: len(b) // 2])(png_of(pattern(16, 16, 2))),
    "empty.png": lambda: b"",
    "text.jpg": lambda: b"this is not an image\n",
}
REASONS = {
    "truncated.jpg": "image file is truncated",
    "truncated.png": "image file is truncated",
    "empty.png": "not a recognised image file",
    "text.jpg": "not a recognised image file",
}


def png_of(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Good images (with unusual modes) in class 'good', one bad file per kind in class 'zbad'."""
    root = tmp_path / "corpus"
    save(Image.fromarray(pattern(10, 10, 3)), root / "good" / "rgb.png")
    save(Image.fromarray(pattern(10, 10, 4)).convert("CMYK"), root / "good" / "cmyk.jpg", quality=95)
    wide = (pattern(10, 10, 5)[:, :, 0].astype(np.uint16) * 257).astype(np.uint16)
    save(Image.fromarray(wide), root / "good" / "gray16.png")
    palette = Image.fromarray(pattern(10, 10, 6)).convert("P")
    palette.info["transparency"] = 0
    save(palette, root / "good" / "palette-transparent.png", transparency=0)
    save(Image.fromarray(pattern(10, 10, 7, channels=2)), root / "good" / "la.png")
    (root / "zbad").mkdir(parents=True)
    for name, make in BAD.items():
        (root / "zbad" / name).write_bytes(make())
    return root


def test_each_bad_file_is_named_and_nothing_is_written(corpus: Path, tmp_path: Path) -> None:
    for name in BAD:
        only = tmp_path / f"only-{name}"
        save(Image.fromarray(pattern(10, 10, 1)), only / "good" / "ok.png")
        (only / "bad").mkdir()
        (only / "bad" / name).write_bytes(BAD[name]())
        with pytest.raises(BadSampleError) as info:
            fastdata.convert(only, tmp_path / "out.npy", workers=0)
        message = str(info.value)
        assert message.startswith(f"{only}/bad/{name}: cannot ") and REASONS[name] in message, message
        assert message.endswith("Re-run with --skip-bad (skip_bad=True) to leave it out.")
        assert not (tmp_path / "out.npy").exists() and not (tmp_path / "out.npy.partial").exists()


@pytest.mark.parametrize("fmt,store", WRITABLE, ids=[f"{f}-{s}" for f, s in WRITABLE])
def test_skip_bad_lists_every_skipped_item(corpus: Path, tmp_path: Path, fmt: str, store: str) -> None:
    manifest = fastdata.convert(corpus, tmp_path / "out", format=fmt, store=store, resize="10x10", workers=0,
                                skip_bad=True)
    assert manifest["count"] == 5
    assert [(s["key"], REASONS[s["key"].split("/")[1]] in s["reason"]) for s in manifest["skipped"]] == [
        (f"zbad/{name}", True) for name in sorted(BAD)
    ]


def test_unusual_modes_convert_predictably(corpus: Path, tmp_path: Path) -> None:
    fastdata.convert(corpus, tmp_path / "m.npy", workers=0, skip_bad=True)
    ds = fastdata.open_dataset(tmp_path / "m.npy", image_format="numpy")
    images = {key: ds[i][0] for i, key in enumerate(["cmyk.jpg", "gray16.png", "la.png", "palette-transparent.png", "rgb.png"])}
    good = corpus / "good"
    np.testing.assert_array_equal(images["cmyk.jpg"], np.asarray(Image.open(good / "cmyk.jpg").convert("RGB")))
    wide = np.asarray(Image.open(good / "gray16.png")).astype(np.uint32)
    np.testing.assert_array_equal(images["gray16.png"], np.repeat((wide >> 8).astype(np.uint8)[:, :, None], 3, 2))
    np.testing.assert_array_equal(images["la.png"], np.asarray(Image.open(good / "la.png").convert("L").convert("RGB")))
    expected = np.asarray(Image.open(good / "palette-transparent.png").convert("RGBA").convert("RGB"))
    np.testing.assert_array_equal(images["palette-transparent.png"], expected)


def test_exif_orientation_is_an_explicit_option(tmp_path: Path) -> None:
    root = tmp_path / "exif"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    save(Image.fromarray(pattern(8, 16, 1)), root / "a" / "rotated.jpg", exif=exif, quality=95)
    stored = Image.open(root / "a" / "rotated.jpg")
    fastdata.convert(root, tmp_path / "plain.npy", workers=0)
    fastdata.convert(root, tmp_path / "turned.npy", workers=0, exif_transpose=True)
    plain = np.load(tmp_path / "plain.npy" / "images.npy")[0]
    turned = np.load(tmp_path / "turned.npy" / "images.npy")[0]
    np.testing.assert_array_equal(plain, np.asarray(stored.convert("RGB")))  # off by default, like torchvision
    np.testing.assert_array_equal(turned, np.asarray(ImageOps.exif_transpose(stored).convert("RGB")))
    assert plain.shape == (8, 16, 3) and turned.shape == (16, 8, 3)


def test_pixel_limit_refuses_before_decoding(tmp_path: Path) -> None:
    root = tmp_path / "bomb"
    (root / "a").mkdir(parents=True)
    # 10,000 x 9,000 = 90,000,000 pixels: just over Pillow's limit, where Pillow itself only warns
    (root / "a" / "big.png").write_bytes(huge_gray_png(10_000, 9_000))
    with pytest.raises(BadSampleError) as info:
        fastdata.convert(root, tmp_path / "x.npy", workers=0)
    assert f"{root}/a/big.png: cannot read image (10000x9000 = 90,000,000 pixels, over the limit of 89,478,485" in str(info.value)
    assert "pass --max-pixels 90000000 (max_pixels=90000000) to allow it" in str(info.value)
    save(Image.fromarray(pattern(100, 100, 1)), root / "b" / "small.png")
    shutil.rmtree(root / "a")
    with pytest.raises(BadSampleError, match=r"100x100 = 10,000 pixels, over the limit of 5,000"):
        fastdata.convert(root, tmp_path / "x.npy", workers=0, max_pixels=5000)
    assert fastdata.convert(root, tmp_path / "x.npy", workers=0, max_pixels=10_000)["count"] == 1


def test_broken_symlink_symlink_loop_and_odd_names(tmp_path: Path) -> None:
    root = tmp_path / "links"
    save(Image.fromarray(pattern(6, 6, 1)), root / "a" / "ok.png")
    os.symlink(root / "a" / "missing.png", root / "a" / "broken.png")
    os.symlink(root / "a" / "self.png", root / "a" / "self.png")  # a file symlink loop
    os.symlink(root, root / "a" / "up")  # a folder loop
    save(Image.fromarray(pattern(6, 6, 2)), root / "b" / "ñandú 画像.png")
    odd = os.fsencode(str(root / "b")) + b"/caf\xe9.png"  # not UTF-8
    with open(odd, "wb") as handle:
        handle.write(png_of(pattern(6, 6, 3)))
    with pytest.raises(BadSampleError, match=r"links/a/broken.png: cannot read image \(file not found \(broken symlink\?\)\)"):
        fastdata.convert(root, tmp_path / "x.npy", workers=0)
    manifest = fastdata.convert(root, tmp_path / "x.npy", workers=0, skip_bad=True)
    assert [s["key"] for s in manifest["skipped"]] == ["a/broken.png", "a/self.png"]
    # a/up leads back to the root: its folders are walked once (a itself is not re-entered)
    keys = fastdata.sources.scan_folder(root)[0]
    assert keys == ["a/broken.png", "a/ok.png", "a/self.png", "a/up/b/caf\udce9.png", "a/up/b/ñandú 画像.png",
                    "b/caf\udce9.png", "b/ñandú 画像.png"]
    assert manifest["count"] == 5
    result = run_fastdata("info", tmp_path / "x.npy")
    assert result.returncode == 0


class Flaky(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, index):
        if index == 3:
            raise ValueError("label file is corrupt")
        if index == 4:
            return "not an image", 1
        return np.full((4, 4, 3), index, dtype=np.uint8), index % 2


def test_dataset_that_raises_or_returns_a_wrong_type(tmp_path: Path) -> None:
    with pytest.raises(BadSampleError, match=r"sample 3: cannot load sample \(label file is corrupt\)"):
        fastdata.convert(Flaky(), tmp_path / "x.npy", workers=0, mode="RGB", resize="4x4")
    manifest = fastdata.convert(Flaky(), tmp_path / "x.npy", workers=0, skip_bad=True)
    assert manifest["skipped"] == [
        {"key": "3", "reason": "label file is corrupt"},
        {"key": "4", "reason": "expected a PIL image, uint8 ndarray or tensor, got str"},
    ]
    assert np.load(tmp_path / "x.npy" / "labels.npy").tolist() == [0, 1, 0, 1]
