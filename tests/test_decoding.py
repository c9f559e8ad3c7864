"""Read-time decoding: resize and center crop with torchvision semantics on the Pillow path
(pixel-equal to doing it by hand), the opt-in fast JPEG path (close to it, measured), decoding
straight into a batch buffer, and the errors."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastdata
from conftest import save
from fastdata.decoding import Decoder
from fastdata.demo import demo_image
from fastdata.errors import DependencyMissingError, InvalidOptionError


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """12 JPEGs and 4 PNGs of ~60-90 px, two classes."""
    rng = np.random.default_rng(0)
    root = tmp_path / "photos"
    for i in range(16):
        height, width = (int(v) for v in rng.integers(60, 91, 2))
        image = demo_image(rng, height, width, i % 2)
        save(image, root / f"c{i % 2}" / f"{i:02d}.{'png' if i % 4 == 3 else 'jpg'}", **({} if i % 4 == 3 else {"quality": 90}))
    return root


def by_hand(path: Path) -> np.ndarray:
    """What torchvision's Resize(48) + CenterCrop(40) do to a PIL image."""
    image = Image.open(path).convert("RGB")
    width, height = image.size
    size = (48, int(48 * height / width)) if width <= height else (int(48 * width / height), 48)
    image = image.resize(size, Image.BILINEAR)
    left, top = round((image.width - 40) / 2), round((image.height - 40) / 2)
    return np.asarray(image.crop((left, top, left + 40, top + 40)))


def test_pil_decoding_with_resize_and_crop_is_pixel_equal_to_pillow(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.npy"
    fastdata.convert(photos, out, store="encoded", workers=0)
    folder = fastdata.FolderDataset(photos)
    keys = [Path(p.decode()) for p in folder.paths]
    for reader in (fastdata.MemmapDataset(out, resize=48, center_crop="40x40", image_format="numpy"),
                   fastdata.FolderDataset(photos, resize=48, center_crop=(40, 40), image_format="numpy")):
        for index, key in enumerate(keys):
            np.testing.assert_array_equal(reader[index][0], by_hand(key))
        images, _ = reader[[0, 3, 7]]  # fixed size: a collated batch
        assert images.shape == (3, 40, 40, 3)


def test_decoding_into_a_batch_buffer_equals_a_list(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.npy"
    fastdata.convert(photos, out, store="encoded", workers=0)
    reader = fastdata.MemmapDataset(out, resize=32, center_crop=32)
    buffers = []

    def allocate(shape, dtype):
        buffers.append(np.empty(shape, dtype))
        return buffers[-1]

    indices = np.arange(16)
    images, labels = reader.get_batch(indices, allocate=allocate)
    assert len(buffers) == 1 and images.numpy().base is not None
    assert np.shares_memory(images.numpy(), buffers[0])  # written in place, no stacking copy
    reference, _ = reader.get_batch(indices)
    assert np.array_equal(images.numpy(), reference.numpy())


def test_fast_jpeg_decoding_is_close_to_pillow(photos: Path, tmp_path: Path) -> None:
    pytest.importorskip("simplejpeg")
    out = tmp_path / "p.npy"
    fastdata.convert(photos, out, store="encoded", workers=0)
    exact = fastdata.MemmapDataset(out, resize=48, center_crop=40, image_format="numpy")
    fast = fastdata.MemmapDataset(out, resize=48, center_crop=40, decoder="fast", image_format="numpy")
    differences = []
    names = [Path(p.decode()).name for p in fastdata.FolderDataset(photos).paths]  # the conversion's order
    for index, name in enumerate(names):
        mine, theirs = fast[index][0].astype(int), exact[index][0].astype(int)
        assert mine.shape == theirs.shape == (40, 40, 3)
        if name.endswith(".png"):  # PNGs take the Pillow path either way
            assert np.array_equal(mine, theirs)
        else:
            differences.append(np.abs(mine - theirs).mean())
    assert 0 < max(differences) < 4  # a few levels out of 255 on average: different IDCT and resize


def test_bad_decoding_options(photos: Path, tmp_path: Path, monkeypatch) -> None:
    raw = tmp_path / "r.npy"
    fastdata.convert(photos, raw, resize="32x32", workers=0)
    with pytest.raises(InvalidOptionError, match=r"^resize, center_crop and decoder apply to datasets of encoded "
                                                 r"images; this one stores decoded pixels \(--store raw\)"):
        fastdata.MemmapDataset(raw, resize=16)
    with pytest.raises(InvalidOptionError, match=r"^Unknown decoder 'turbo'. Allowed: 'pil', 'fast'.$"):
        Decoder.make("RGB", decoder="turbo")
    with pytest.raises(InvalidOptionError, match=r"^Invalid resize '0x3'"):
        Decoder.make("RGB", resize="0x3")
    monkeypatch.setitem(sys.modules, "simplejpeg", None)
    with pytest.raises(DependencyMissingError, match=r"pip install 'torch-fastdata\[jpeg\]'"):
        Decoder.make("RGB", decoder="fast")


def test_pil_output_is_the_decoded_image_itself(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.npy"
    fastdata.convert(photos, out, store="encoded", workers=0)
    image, _ = fastdata.MemmapDataset(out, image_format="pil")[0]
    reference = Image.open(io.BytesIO((photos / "c0" / "00.jpg").read_bytes())).convert("RGB")
    assert isinstance(image, Image.Image) and image.size == reference.size
    assert np.array_equal(np.asarray(image), np.asarray(reference))
