"""The region decode (:mod:`fastdata.reader.region`, the fused decode's ``"region"`` decoder): the
box's pixels are exactly the whole-image simplejpeg decode's for every subsampling, gray,
progressive and odd sizes at each DCT scale; readers use it on every backend with the same
crops; bad JPEGs give the same one-line errors as without it; a missing library is one clear
error where it is asked for, and a silent fallback where it is not."""

from __future__ import annotations

import ctypes.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("simplejpeg")
pytest.importorskip("torchvision")
from torchvision.transforms import v2  # noqa: E402

import fastdata  # noqa: E402
from conftest import photo  # noqa: E402
from fastdata.errors import CorruptDataError, DependencyMissingError  # noqa: E402
from fastdata.reader import fused, region  # noqa: E402
from fastdata.reader.decoding import Decoder  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _region_loads() -> bool:
    try:
        return region.library() is not None
    except DependencyMissingError:  # FASTDATA_LIBTURBOJPEG names one that does not load
        return False


needs_region = pytest.mark.skipif(not _region_loads(), reason="no libturbojpeg >= 3 (the region extra)")
TRAIN = v2.Compose([v2.RandomResizedCrop(24), v2.RandomHorizontalFlip()])
PLAN = fused.split_transform(TRAIN)[0]
# name -> (height, width, Pillow's save options, gray source)
KINDS = {
    "420": (120, 160, {"subsampling": 2}, False),
    "444": (97, 131, {"subsampling": 0}, False),
    "422": (131, 97, {"subsampling": 1}, False),
    "gray": (113, 150, {}, True),
    "odd-420": (257, 391, {"subsampling": 2}, False),
    "progressive-420": (201, 149, {"subsampling": 2, "progressive": True}, False),
    "progressive-444": (90, 171, {"subsampling": 0, "progressive": True}, False),
}


def jpeg(kind: str, seed: int = 0) -> bytes:
    height, width, options, gray = KINDS[kind]
    image = Image.fromarray(photo(height, width, seed=seed, detail_px=9, edge_rows=3))
    buffer = io.BytesIO()
    (image.convert("L") if gray else image).save(buffer, format="JPEG", quality=90, **options)
    return buffer.getvalue()


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list:
    """The regions :func:`fastdata.reader.region.decode` decoded (None results not counted)."""
    calls: list = []
    decode = region.decode

    def counting(*args):
        pixels = decode(*args)
        if pixels is not None:
            calls.append(args[1:3])
        return pixels

    monkeypatch.setattr(region, "decode", counting)
    return calls


@needs_region
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_box_pixels_are_simplejpegs_at_every_dct_scale(kind: str) -> None:
    data = jpeg(kind, seed=len(kind))
    height, width = fused.jpeg_size(data, "simplejpeg")
    assert fused.jpeg_size(data, "region") == (height, width)
    decoded = 0
    for seed, epoch, index in [(seed, epoch, index) for seed in (0, 3) for epoch in (0, 1) for index in range(6)]:
        draw = PLAN.draw(height, width, fused.generator_for(seed, epoch, index))
        for scale in fused.DCT_SCALES:
            for mode in ("RGB", "BGR", "L"):
                expected = fused.DECODERS["simplejpeg"].box(data, draw, scale, height, width, mode)
                got = region.box(data, draw, scale, height, width, mode)
                if got is None:  # only a box that is the whole image goes the whole-image way
                    assert (draw.height, draw.width) == (height, width)
                    continue
                assert got.dtype == np.uint8 and got.shape == expected.shape, (scale, mode, draw)
                assert np.array_equal(got, expected), (scale, mode, draw)
                decoded += 1
    assert decoded >= 150
    for index in range(8):  # and the whole fused op
        decode = [fused.fused_decode(data, PLAN, generator=fused.generator_for(1, 2, index), decoder=decoder)
                  for decoder in ("region", "simplejpeg")]
        assert torch.equal(*decode)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("region")
    for index, kind in enumerate(["420", "444", "422", "gray", "odd-420", "progressive-420"] * 2):
        (root / f"c{index % 2}").mkdir(exist_ok=True)
        (root / f"c{index % 2}" / f"{index:02d}.jpg").write_bytes(jpeg(kind, seed=index))
    return root


def _epoch(ds, backend: str, num_workers: int) -> torch.Tensor:
    loader = fastdata.loader(ds, batch_size=4, shuffle=False, backend=backend, num_workers=num_workers)
    return torch.cat([images for images, _ in loader])


@needs_region
def test_readers_use_it_with_the_same_crops_on_every_backend(folder: Path, counted: list) -> None:
    ds = fastdata.FolderDataset(folder, transform=TRAIN, seed=4)
    assert ds.decoder.fused_library == "region"
    blobs = [Path(os.fsdecode(path)).read_bytes() for path in ds.paths]
    expected = torch.stack([fused.fused_decode(data, PLAN, generator=fused.generator_for(4, 0, index),
                                               decoder="simplejpeg") for index, data in enumerate(blobs)])
    for backend, num_workers in (("torch", 0), ("thread", 2), ("process", 2)):
        assert torch.equal(_epoch(ds, backend, num_workers), expected), backend
    assert len(counted) >= len(blobs)  # the serial and thread backends decoded regions (in this process)


@needs_region
def test_switched_off_it_reads_the_same_through_simplejpeg(folder: Path, region_off, counted: list,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ds = fastdata.FolderDataset(folder, transform=TRAIN, seed=4)
    assert ds.decoder.fused_library == "simplejpeg"
    images = _epoch(ds, "torch", 0)
    assert counted == []
    monkeypatch.delenv(region.ENV)
    region.library.cache_clear()
    assert torch.equal(_epoch(fastdata.FolderDataset(folder, transform=TRAIN, seed=4), "torch", 0), images)
    assert counted


@needs_region
def test_a_truncated_jpeg_gives_the_same_one_line_error_as_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file cut short takes the whole-image way whatever the box (it has no end-of-image
    marker), so it fails as before even where the box lies above the cut."""
    data = jpeg("odd-420", seed=5)
    truncated = data[: len(data) * 2 // 3]
    decoder = Decoder("RGB", fusion=fused.Fusion(PLAN))
    messages = []
    for setting in (None, "none"):
        if setting is None:
            monkeypatch.delenv(region.ENV, raising=False)
        else:
            monkeypatch.setenv(region.ENV, setting)
        region.library.cache_clear()
        assert decoder.fused_library == ("region" if setting is None else "simplejpeg")
        for index in range(12):
            with pytest.raises(CorruptDataError) as caught:
                decoder.decode_all([truncated], lambda row: "'d.npy' sample 7", Path("d.npy"), indices=[index],
                                   epoch=0)
            messages.append(str(caught.value))
    region.library.cache_clear()
    assert len(set(messages)) == 1 and "\n" not in messages[0]
    assert re.fullmatch(r"'d.npy' sample 7: cannot decode image \(image file is truncated \(\d+ bytes not "
                        r"processed\)\)\. Run 'fastdata verify d.npy', or convert the source again\.", messages[0])


@needs_region
def test_damage_in_the_data_is_seen_where_the_box_reaches_it() -> None:
    """Damage inside the compressed data: where the box reaches it, TurboJPEG warns and the file
    takes today's way (simplejpeg's strict mode refuses it too, Pillow decides: here it decodes
    it); a box above it never reads it (the region decode stops after the box's last row) and
    gets the clean file's pixels."""
    clean = jpeg("odd-420", seed=5)
    at = len(clean) - 400
    garbled = clean[:at] + b"\xff\x00" * 100 + clean[at + 200:]  # the last rows' data
    height, width = fused.jpeg_size(clean)
    bottom, top = fused.Draw(height - 40, 0, 40, 60, False), fused.Draw(0, 0, 40, 60, False)
    assert region.box(garbled, bottom, 1, height, width, "RGB") is None  # TurboJPEG warned
    assert np.array_equal(fused.DECODERS["region"].box(garbled, bottom, 1, height, width, "RGB"),
                          fused.DECODERS["pil"].box(garbled, bottom, 1, height, width, "RGB"))
    assert np.array_equal(fused.DECODERS["region"].box(garbled, top, 1, height, width, "RGB"),
                          fused.DECODERS["simplejpeg"].box(clean, top, 1, height, width, "RGB"))


@needs_region
def test_damage_after_the_box_is_not_seen_damage_in_the_header_goes_to_pillow() -> None:
    """Stray bytes before the end-of-image marker (libjpeg warns only on reading that far, as
    for some ImageNet files): a box above the last row decodes to the clean file's pixels. Stray
    bytes in the header: TurboJPEG warns, and the file takes today's way (Pillow's draft)."""
    clean = jpeg("420", seed=1)
    end = clean[:-2] + b"\x00" + clean[-2:]
    at = clean.index(b"\xff\xdb")
    header = clean[:at] + b"\x00" + clean[at:]
    height, width = fused.jpeg_size(clean)
    draw = fused.Draw(8, 16, 40, 60, False)
    assert np.array_equal(region.box(end, draw, 2, height, width, "RGB"),
                          region.box(clean, draw, 2, height, width, "RGB"))
    assert region.header(header) is None and region.box(header, draw, 2, height, width, "RGB") is None
    assert np.array_equal(fused.DECODERS["region"].box(header, draw, 2, height, width, "RGB"),
                          fused.DECODERS["pil"].box(header, draw, 2, height, width, "RGB"))


def test_a_library_path_that_does_not_load_is_one_clear_error(monkeypatch, tmp_path: Path, folder: Path) -> None:
    missing = tmp_path / "libturbojpeg.so.0"
    monkeypatch.setenv(region.ENV, str(missing))
    region.library.cache_clear()
    try:
        with pytest.raises(DependencyMissingError) as caught:
            fastdata.FolderDataset(folder, transform=TRAIN)  # up front, when the reader is made
        message = str(caught.value)
        assert message.startswith(f"{region.ENV}={missing}: cannot use it for the region decode (")
        assert message.endswith("Point it to a libturbojpeg from libjpeg-turbo 3.0 or newer, unset it to use the one "
                                "pip install 'torch-fastdata[region]' or, in a checkout of fastdata, pip install "
                                "'.[region]' installs, or set it to 'none' to decode without the region decode.")
        assert "\n" not in message
        monkeypatch.setenv(region.ENV, ctypes.util.find_library("c"))  # loads, but is no libturbojpeg
        region.library.cache_clear()
        with pytest.raises(DependencyMissingError, match="it exports no tj3Init"):
            region.library()
    finally:
        region.library.cache_clear()


def test_asked_for_by_name_without_the_library_it_names_the_install(region_off) -> None:
    assert fused.default_decoder() == "simplejpeg"
    with pytest.raises(DependencyMissingError, match=re.escape(
            "The region decode needs a libturbojpeg 3.0 or newer, and none was found. Install it with: pip install "
            "'torch-fastdata[region]' or, in a checkout of fastdata, pip install '.[region]' (or point "
            "FASTDATA_LIBTURBOJPEG to one).")):
        fused.fused_decode(jpeg("420"), PLAN, decoder="region")


@needs_region
def test_only_the_decode_itself_lets_go_of_the_gil() -> None:
    """Every other tj3 call (handle, header, parameters: microseconds each) keeps the GIL: each
    release would let another loader thread in, and taking it back costs a context switch."""
    lib = region.library()
    releasing = {name for name in region._SIGNATURES
                 if not getattr(lib, name)._flags_ & ctypes._FUNCFLAG_PYTHONAPI}
    assert releasing == {"tj3Decompress8"} and len(region._SIGNATURES) > 5


@needs_region
def test_the_turbojpeg_module_is_never_imported() -> None:
    """The wheel's module is named like PyTurboJPEG's: only its bundled library is loaded."""
    code = ("import sys\nfrom fastdata.reader import fused, region\n"
            "print(fused.default_decoder(), region.library() is not None, 'turbojpeg' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "region True False\n"


@needs_region
def test_many_regions_at_mixed_scales_in_threads_decode_the_same_as_alone() -> None:
    """Each image gets a fresh TurboJPEG instance: reusing one across DCT scales of 4:2:0 images
    crashed the 3.0 beta library the wheel ships (``jpeg_skip_scanlines`` on freed memory). Run
    in a child process, so a crash is a failure rather than the end of the test run."""
    code = (
        "import sys, io, threading\nsys.path.insert(0, 'tests')\nimport numpy as np\n"
        "from test_region_decode import jpeg\nfrom fastdata.reader import region\n"
        "blobs = [jpeg(kind, seed) for seed in range(4) for kind in ('420', '422', 'odd-420')]\n"
        "sizes = [region.header(data) for data in blobs]\n"
        "def regions(seed):\n"
        "    rng = np.random.default_rng(seed)\n"
        "    for rep in range(200):  # the crash: full-width rows of 4:2:0 images, scales 1 and 2 alternating\n"
        "        index, scale = rep % len(blobs), (1, 2)[rep % 2]\n"
        "        height, width = (-(-size // scale) for size in sizes[index])\n"
        "        top = int(rng.integers(0, height - 1))\n"
        "        yield index, scale, (top, 0, int(rng.integers(top + 1, height + 1)), width)\n"
        "expected = {seed: [region.decode(blobs[i], s, r, 'RGB') for i, s, r in regions(seed)] for seed in range(2)}\n"
        "same = []\n"
        "def work(seed):\n"
        "    same.append(all(np.array_equal(region.decode(blobs[i], s, r, 'RGB'), want)\n"
        "                    for (i, s, r), want in zip(regions(seed), expected[seed])))\n"
        "threads = [threading.Thread(target=work, args=(seed,)) for seed in range(2)]\n"
        "[thread.start() for thread in threads]\n[thread.join() for thread in threads]\n"
        "print(same)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "[True, True]\n"
