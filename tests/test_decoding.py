"""Read-time decoding: resize and center crop with torchvision semantics on the Pillow path
(pixel-equal to doing it by hand), the opt-in fast JPEG path (close to it, measured), decoding
straight into a batch buffer, and the errors."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from conftest import save
from fastdata.reader.decoding import Decoder
from fastdata.bench.demo import demo_image
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


def _extraneous_bytes(data: bytes, marker: bytes) -> bytes:
    """``data`` with the fewest stray bytes before its first ``marker`` that libjpeg-turbo notices
    (its bit reader may take a few before the end-of-image marker): it recovers and warns
    ("Corrupt JPEG data: 1 extraneous bytes before marker ..."), as for some ImageNet files."""
    import simplejpeg

    at = data.index(marker)
    for count in range(1, 16):
        damaged = data[:at] + b"\x00" * count + data[at:]
        try:
            simplejpeg.decode_jpeg(damaged)  # strict mode: the warning is a ValueError
        except ValueError:
            return damaged
    raise AssertionError("libjpeg-turbo did not warn")


@pytest.fixture
def warned_jpegs(tmp_path: Path) -> Path:
    """A folder of three 40x48 JPEGs: a clean one, one with stray bytes before its end-of-image
    marker (libjpeg warns while decoding) and one with stray bytes before its quantisation
    table (libjpeg warns while reading the header)."""
    simplejpeg = pytest.importorskip("simplejpeg")
    rng = np.random.default_rng(1)
    root = tmp_path / "warned"
    for index, name in enumerate(("a_clean", "b_end", "c_header")):
        path = save(demo_image(rng, 40, 48, index % 2), root / "c0" / f"{name}.jpg", quality=90)
        clean = path.read_bytes()
        if name == "b_end":
            path.write_bytes(_extraneous_bytes(clean, b"\xff\xd9"))
            with pytest.raises(ValueError, match=r"^Corrupt JPEG data: 1 extraneous bytes before marker 0xd9$"):
                simplejpeg.decode_jpeg(path.read_bytes())  # strict mode: the warning is an error
        if name == "c_header":
            path.write_bytes(_extraneous_bytes(clean, b"\xff\xdb"))
            with pytest.raises(ValueError, match=r"^Corrupt JPEG data: 1 extraneous bytes before marker 0xdb$"):
                simplejpeg.decode_jpeg_header(path.read_bytes())
        decoded = Image.open(path)
        decoded.load()  # Pillow decodes it, to the same pixels as the clean file
        assert np.array_equal(np.asarray(decoded), np.asarray(Image.open(io.BytesIO(clean))))
    return root


def test_jpegs_libjpeg_only_warns_about_read_with_every_decoder(warned_jpegs: Path, tmp_path: Path,
                                                                region_off: None) -> None:
    """With the whole-image decoders (the region decode may stop before stray bytes at the end:
    tests/test_region_decode.py)."""
    from torchvision.transforms import v2

    from fastdata.reader.fused import fused_decode, generator_for, split_transform

    out = tmp_path / "w.npy"
    fastdata.convert(warned_jpegs, out, store="encoded", workers=0)
    assert fastdata.verify(out, deep=True).problems == ()
    exact = fastdata.MemmapDataset(out, resize=32, center_crop=24, image_format="numpy")
    fast = fastdata.MemmapDataset(out, resize=32, center_crop=24, decoder="fast", image_format="numpy")
    for index in (1, 2):  # the warned files take the Pillow path: Pillow's pixels
        assert np.array_equal(fast[index][0], exact[index][0])
    train = v2.RandomResizedCrop(24)
    fused = fastdata.MemmapDataset(out, transform=train)
    fused.set_epoch(0)
    images, labels = fused[[0, 1, 2]]
    assert images.shape == (3, 3, 24, 24) and labels.tolist() == [0, 0, 0]
    plan = split_transform(train)[0]
    for index, name in ((1, "b_end"), (2, "c_header")):  # decoded by Pillow's draft on the same box
        data = (warned_jpegs / "c0" / f"{name}.jpg").read_bytes()
        expected = fused_decode(data, plan, generator=generator_for(0, 0, index), decoder="pil")
        assert torch.equal(images[index].as_subclass(torch.Tensor), expected), name


@pytest.mark.parametrize("damage", ["truncated", "garbled"])
def test_a_broken_jpeg_is_one_corrupt_data_error_with_every_decoder(damage: str) -> None:
    pytest.importorskip("simplejpeg")
    from fastdata.errors import CorruptDataError
    from fastdata.reader.fused import Fusion, FusedPlan

    buffer = io.BytesIO()
    demo_image(np.random.default_rng(2), 40, 48, 0).save(buffer, format="JPEG", quality=90)
    data = buffer.getvalue()
    broken = data[: len(data) // 2] if damage == "truncated" else data[:200] + b"\xff\x00" * 50 + data[300:]
    pillow_says = {"truncated": r"image file is truncated \(\d+ bytes not processed\)",
                   "garbled": "broken data stream when reading image file"}[damage]
    fused = Decoder("RGB", fusion=Fusion(FusedPlan("random_resized_crop", (24, 24))))
    for decoder, options in ((Decoder.make("RGB", decoder="fast"), {}), (fused, {"indices": [7], "epoch": 0})):
        with pytest.raises(CorruptDataError) as caught:
            decoder.decode_all([broken], lambda row: "'d.npy' sample 7", Path("d.npy"), **options)
        assert re.fullmatch(rf"'d.npy' sample 7: cannot decode image \({pillow_says}\)\. Run 'fastdata verify "
                            r"d.npy', or convert the source again\.", str(caught.value))
