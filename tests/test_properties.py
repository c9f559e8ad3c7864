"""Property tests: random small image folders round-trip through every format and store.

Each example is a folder of 1..6 images (1..64 px a side, modes L/RGB/RGBA/P/LA, PNG or JPEG,
random classes). ``raw`` must equal PIL's own decode, converted to the resolved mode (RGB unless
every image is grayscale) and resized; ``encoded`` must store each file's bytes unchanged (read
back with plain numpy, h5py or tarfile) and decode to what PIL decodes from the same file.
"""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image
from torch.utils.data import IterableDataset

import fastdata
from conftest import WRITABLE
from fastdata.testing import CONTRACTS
from fastdata.formats import get_format

FORMATS = sorted({name for name, _ in WRITABLE})
CLASS_NAMES = ["ant", "Bee", "cow", "dé"]  # upper case sorts first; a non-ASCII name
GRAYSCALE = {"L", "LA"}


for _name in FORMATS:  # each format's own test file, where its FormatContract hooks live
    importlib.import_module(f"test_{_name}")


def stored_bytes(name: str, out: Path) -> list[bytes]:
    """Each sample's stored bytes, read without fastdata: the format's own test file knows how
    (its FormatContract's ``stored_bytes`` hook)."""
    return CONTRACTS[name].stored_bytes(out)


# --- strategies -----------------------------------------------------------------------------


@st.composite
def image_specs(draw, grayscale: bool = False) -> dict:
    codec = draw(st.sampled_from(["PNG", "JPEG"]))
    modes = ["L", "LA"] if grayscale else ["L", "RGB", "RGBA", "P", "LA"]
    if codec == "JPEG":
        modes = [mode for mode in modes if mode in ("L", "RGB")]  # what JPEG can hold
    return {
        "codec": codec,
        "mode": draw(st.sampled_from(modes)),
        "width": draw(st.integers(1, 64)),
        "height": draw(st.integers(1, 64)),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "smooth": draw(st.booleans()),  # noise, or a gradient (compresses like a photo)
        "quality": draw(st.integers(30, 95)),
        "label": draw(st.integers(0, len(CLASS_NAMES) - 1)),
    }


# Half the sets are grayscale only (so the resolved mode is L): among random modes that is rare.
image_sets = st.booleans().flatmap(lambda grayscale: st.lists(image_specs(grayscale), min_size=1, max_size=6))


def spec(codec: str, mode: str, label: int = 0, *, width: int = 7, height: int = 5, seed: int = 0) -> dict:
    return {"codec": codec, "mode": mode, "width": width, "height": height, "seed": seed, "smooth": seed % 2 == 0,
            "quality": 80, "label": label}


# Always tried, whatever hypothesis draws: grayscale with alpha (L), every PNG mode with a JPEG (RGB).
GRAY_SET = [spec("PNG", "LA", 1, seed=1), spec("PNG", "L", 0, seed=2), spec("JPEG", "L", 1, width=1, height=64)]
COLOUR_SET = [spec("PNG", mode, label, seed=seed) for seed, (mode, label) in
              enumerate([("L", 3), ("LA", 2), ("RGB", 1), ("RGBA", 0), ("P", 3)])] + [spec("JPEG", "RGB", 2, width=64)]


def make_image(spec: dict) -> Image.Image:
    rng = np.random.default_rng(spec["seed"])
    height, width = spec["height"], spec["width"]
    channels = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "P": 3}[spec["mode"]]
    if spec["smooth"]:
        ys, xs = np.mgrid[0:height, 0:width]
        slopes = rng.integers(1, 9, size=(2, channels))
        pixels = (xs[..., None] * slopes[0] + ys[..., None] * slopes[1] + rng.integers(0, 256, channels)) % 256
    else:
        pixels = rng.integers(0, 256, size=(height, width, channels))
    pixels = pixels.astype(np.uint8)
    if spec["mode"] == "L":
        return Image.fromarray(pixels[:, :, 0])
    if spec["mode"] == "P":
        return Image.fromarray(pixels).quantize(colors=int(rng.integers(2, 257)))
    return Image.fromarray(pixels)  # LA, RGB, RGBA from the channel count


def write_folder(root: Path, specs: list[dict]) -> list[tuple[Path, int]]:
    """Write the images in ImageFolder layout; return (file, label) in ImageFolder order."""
    files = []
    for number, spec in enumerate(specs):
        suffix = ".png" if spec["codec"] == "PNG" else ".jpg"
        path = root / CLASS_NAMES[spec["label"]] / f"{number:02d}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        options = {"quality": spec["quality"]} if spec["codec"] == "JPEG" else {}
        make_image(spec).save(path, format=spec["codec"], **options)
        files.append(path)
    classes = sorted({path.parent.name for path in files})  # only folders that hold an image exist
    ordered = sorted(files, key=lambda path: (path.parent.name, path.name))
    return [(path, classes.index(path.parent.name)) for path in ordered]


def resolved_mode(files: list[tuple[Path, int]]) -> str:
    modes = []
    for path, _ in files:
        with Image.open(path) as image:
            modes.append(image.mode)
    assert set(modes) <= {"L", "LA", "RGB", "RGBA", "P"}  # the file keeps the mode it was made in
    return "L" if set(modes) <= GRAYSCALE else "RGB"


def pil_pixels(path: Path, mode: str, size: tuple[int, int] | None = None) -> np.ndarray:
    """PIL's own decode of ``path`` in ``mode`` (HWC), resized to (H, W) with BILINEAR if given."""
    with Image.open(path) as image:
        image = image.convert(mode)
    if size is not None:
        image = image.resize((size[1], size[0]), Image.BILINEAR)
    array = np.asarray(image)
    return array[:, :, None] if array.ndim == 2 else array


def open_map_style(name: str, out: Path):
    reader = get_format(name).map_dataset
    ds = reader(out, image_format="numpy")
    assert not isinstance(ds, IterableDataset)
    return ds


def read_iterable(name: str, out: Path) -> list[tuple[np.ndarray, int]] | None:
    """Every sample from the format's own reader when that is iterable, in order; else None."""
    reader = get_format(name).dataset
    if not issubclass(reader, IterableDataset):
        return None
    return list(reader(out, shuffle=False, image_format="numpy"))


# --- properties -----------------------------------------------------------------------------

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", FORMATS)
@SETTINGS
@given(specs=image_sets, height=st.integers(1, 16), width=st.integers(1, 16))
@example(specs=GRAY_SET, height=9, width=4)
@example(specs=COLOUR_SET, height=1, width=16)
def test_raw_is_pil_decode_converted_and_resized(name: str, specs: list[dict], height: int, width: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root, out = Path(tmp) / "images", Path(tmp) / "out"
        files = write_folder(root, specs)
        mode = resolved_mode(files)
        manifest = fastdata.convert(root, out, format=name, store="raw", resize=f"{height}x{width}", workers=0)
        assert manifest["count"] == len(files) and manifest["image"]["mode"] == mode
        expected = [(pil_pixels(path, mode, (height, width)), label) for path, label in files]
        ds = open_map_style(name, out)
        assert len(ds) == len(files)
        for index, (pixels, label) in enumerate(expected):
            image, got_label = ds[index]
            np.testing.assert_array_equal(image, pixels, err_msg=f"{files[index][0].name} ({mode})")
            assert got_label == label
        iterated = read_iterable(name, out)
        if iterated is not None:
            assert len(iterated) == len(expected)
            for (image, got_label), (pixels, label) in zip(iterated, expected):
                np.testing.assert_array_equal(image, pixels)
                assert got_label == label


@pytest.mark.parametrize("name", FORMATS)
@SETTINGS
@given(specs=image_sets)
@example(specs=GRAY_SET)
@example(specs=COLOUR_SET)
def test_encoded_keeps_the_file_bytes_and_decodes_like_pil(name: str, specs: list[dict]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root, out = Path(tmp) / "images", Path(tmp) / "out"
        files = write_folder(root, specs)
        mode = resolved_mode(files)
        manifest = fastdata.convert(root, out, format=name, store="encoded", workers=0)
        assert manifest["count"] == len(files) and manifest["image"]["mode"] == mode
        classes = sorted({path.parent.name for path, _ in files})
        assert manifest["class_to_idx"] == {name: index for index, name in enumerate(classes)}
        assert stored_bytes(name, out) == [path.read_bytes() for path, _ in files]
        ds = open_map_style(name, out)
        assert len(ds) == len(files)
        for index, (path, label) in enumerate(files):
            image, got_label = ds[index]
            # PNG: pixel-exact; JPEG: the same decoder on the same bytes gives the same pixels
            np.testing.assert_array_equal(image, pil_pixels(path, mode), err_msg=f"{path.name} ({mode})")
            assert got_label == label
        iterated = read_iterable(name, out)
        if iterated is not None:
            assert [label for _, label in iterated] == [label for _, label in files]
            for (image, _), (path, _) in zip(iterated, files):
                np.testing.assert_array_equal(image, pil_pixels(path, mode))


def test_strategies_cover_every_mode_and_codec() -> None:
    """The generators make what they claim: each mode survives saving in its codec."""
    with tempfile.TemporaryDirectory() as tmp:
        for number, (codec, mode) in enumerate(
            [("PNG", "L"), ("PNG", "RGB"), ("PNG", "RGBA"), ("PNG", "P"), ("PNG", "LA"), ("JPEG", "L"), ("JPEG", "RGB")]
        ):
            (path, _), = write_folder(Path(tmp) / str(number), [spec(codec, mode, seed=number, width=5, height=3)])
            with Image.open(path) as image:
                assert (image.format, image.mode, image.size) == (codec, mode, (5, 3))
