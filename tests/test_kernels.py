"""The read path's per-image kernels never enter torch's intra-op thread pool
(:mod:`fastdata.reader.kernels`): asserted structurally, by the threads an intra-op region
starts, not by timing. With torch's OpenMP backend, the first parallel region a thread enters
starts that thread's team (``get_num_threads() - 1`` new OS threads, alive while it lives); so
the read path runs in a fresh thread under ``torch.set_num_threads(8)``, and the process's
thread count before and after tells whether it entered one. A control run of a kernel that
does parallelise shows the probe can fail."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("torchvision")
from torchvision.transforms import v2  # noqa: E402
from torchvision.transforms.v2 import functional as F  # noqa: E402

import fastdata  # noqa: E402
from fastdata.reader import fused, kernels, region  # noqa: E402

SIZE = 48
_PROBE = os.path.isdir("/proc/self/task") and "OpenMP" in torch.__config__.parallel_info()


def _photo(height: int, width: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(height // 10, 2), max(width // 10, 2), 3), dtype=np.uint8)
    return np.array(Image.fromarray(small).resize((width, height), Image.BICUBIC))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """6 JPEGs (large enough for a DCT-scaled decode) and a PNG, in 2 classes."""
    root = tmp_path_factory.mktemp("kernels")
    for index in range(7):
        height, width = 300 + 20 * index, 420 - 15 * index
        target = root / ("a" if index % 2 else "b")
        target.mkdir(exist_ok=True)
        image = Image.fromarray(_photo(height, width, index))
        image.save(target / f"{index}.png") if index == 3 else image.save(target / f"{index}.jpg", quality=90)
    return root


def _threads_started(work: Callable[[], None]) -> int:
    """How many OS threads ``work`` left running, run in a fresh thread under 8 torch threads
    (an intra-op region starts 7; they live as long as that thread)."""
    seen: list[set] = []
    errors: list[BaseException] = []
    done = threading.Event()
    finish = threading.Event()

    def run() -> None:
        try:
            seen.append(set(os.listdir("/proc/self/task")))
            work()
            seen.append(set(os.listdir("/proc/self/task")))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        done.set()
        finish.wait(30)  # alive until counted: its team, if any, lives as long

    previous = torch.get_num_threads()
    torch.set_num_threads(8)
    thread = threading.Thread(target=run)
    try:
        thread.start()
        assert done.wait(120), "the read path hung"
    finally:
        finish.set()
        thread.join(30)
        torch.set_num_threads(previous)
    if errors:
        raise errors[0]
    return len(seen[1] - seen[0])  # new thread ids (a thread of another test ending is not counted)


needs_probe = pytest.mark.skipif(not _PROBE, reason="counts threads through /proc with torch's OpenMP backend")


@needs_probe
def test_the_probe_sees_an_intra_op_region() -> None:
    pixels = torch.zeros((3, 300, 300), dtype=torch.uint8)
    assert _threads_started(lambda: pixels.flip(-1)) > 0  # an elementwise kernel over 270,000 values


TRAIN = v2.Compose([v2.RandomResizedCrop(SIZE), v2.RandomHorizontalFlip(p=0.5)])
EVAL = v2.Compose([v2.Resize(SIZE + 8), v2.CenterCrop(SIZE)])
NEAREST = v2.Compose([v2.RandomResizedCrop(SIZE, interpolation=v2.InterpolationMode.NEAREST_EXACT),
                      v2.RandomHorizontalFlip(p=1.0)])


@needs_probe
@pytest.mark.parametrize("serial_torch", [True, False], ids=["torch-kernel", "pillow-kernel"])
@pytest.mark.parametrize("options", [
    {"transform": TRAIN}, {"transform": EVAL}, {"transform": NEAREST},
    {"decoder": "fast", "resize": SIZE + 8, "center_crop": SIZE}, {"resize": SIZE + 8, "center_crop": SIZE},
], ids=["fused-train", "fused-eval", "fused-nearest", "fast-resize", "pil-resize"])
def test_the_read_path_starts_no_intra_op_region(folder: Path, options: dict, serial_torch: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("simplejpeg")
    if serial_torch and not kernels.torch_resizes_serially():
        pytest.skip("torch has no vectorised uint8 resize on this CPU")
    monkeypatch.setattr(kernels, "torch_resizes_serially", lambda: serial_torch)
    ds = fastdata.FolderDataset(folder, **options)
    assert (ds.decoder.plan is not None) == ("transform" in options)
    if ds.decoder.plan is not None and region.library() is not None:
        assert ds.decoder.fused_library == "region"  # its TurboJPEG calls are in the probe too
    ds.set_epoch(1)
    batches = []
    assert _threads_started(lambda: batches.append(ds[np.arange(len(ds))])) == 0
    images, labels = batches[0]
    assert images.shape == (len(ds), 3, SIZE, SIZE) and images.dtype == torch.uint8
    assert labels.tolist() == ds.labels.tolist()


@pytest.mark.skipif(not kernels.torch_resizes_serially(), reason="torch's vectorised uint8 kernel is x86 AVX2/AVX512")
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize("shape,size", [((173, 251, 3), (61, 89)), ((375, 500, 3), (224, 224)), ((40, 33, 1), (97, 20)),
                                        ((7, 300, 3), (224, 224))])
@pytest.mark.parametrize("view", ["whole", "cropped"])
@pytest.mark.parametrize("scratch", [False, True], ids=["new", "scratch"])
def test_the_torch_kernel_equals_torchvisions_resize_and_gives_hwc_rows(mode: str, antialias: bool, shape: tuple,
                                                                      size: tuple, view: str, scratch: bool) -> None:
    """Fed channels-last, torch's kernel gives torchvision's pixels (its resize of the planar
    CHW tensor) as contiguous HWC, copied into a batch row whole; written into the thread's
    scratch output (the aten op with ``out=``) too."""
    pixels = np.random.default_rng(3).integers(0, 256, (shape[0], shape[1] + 9, shape[2]), dtype=np.uint8)
    pixels = pixels[:, 4:4 + shape[1]] if view == "cropped" else np.ascontiguousarray(pixels[:, :shape[1]])
    expected = F.resize(torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1), list(size),
                        antialias=antialias, interpolation=v2.InterpolationMode(mode))
    got = kernels.resize(pixels, size, interpolation=mode, antialias=antialias, scratch=scratch)
    assert got.flags.c_contiguous and got.shape == (*size, shape[2])
    assert np.array_equal(got, expected.permute(1, 2, 0).numpy())


@pytest.mark.skipif(not kernels.torch_resizes_serially(), reason="torch's vectorised uint8 kernel is x86 AVX2/AVX512")
def test_a_scratch_resize_reuses_its_threads_output_and_a_plain_one_never_does() -> None:
    rng = np.random.default_rng(4)
    first, second = (rng.integers(0, 256, (50, 60, 3), dtype=np.uint8) for _ in range(2))
    a = kernels.resize(first, (20, 30), scratch=True)
    want_a = kernels.resize(first, (20, 30))
    b = kernels.resize(second, (20, 30), scratch=True)
    assert np.shares_memory(a, b) and np.array_equal(b, kernels.resize(second, (20, 30)))
    assert not np.shares_memory(want_a, kernels.resize(first, (20, 30)))  # no scratch: a new array each time
    other = []
    thread = threading.Thread(target=lambda: other.append(kernels.resize(first, (20, 30), scratch=True)))
    thread.start()
    thread.join()
    assert not np.shares_memory(other[0], b) and np.array_equal(other[0], want_a)  # one scratch per thread
    c = kernels.resize(first, (21, 30), scratch=True)  # another size: another output
    assert c.shape == (21, 30, 3) and np.array_equal(c, kernels.resize(first, (21, 30)))


@pytest.mark.parametrize("layout", ["contiguous", "cropped", "grey cropped", "mirrored"])
def test_contiguous_copies_a_view_without_changing_a_pixel(layout: str) -> None:
    decoded = np.random.default_rng(6).integers(0, 256, (30, 41, 3), dtype=np.uint8)
    pixels = {"contiguous": decoded, "cropped": decoded[3:25, 5:36], "grey cropped": decoded[3:25, 5:36, :1],
              "mirrored": decoded[:, ::-1]}[layout]
    got = kernels._contiguous(pixels)
    assert got.flags.c_contiguous and got.flags.writeable and np.array_equal(got, pixels)
    assert (got is pixels) == (layout == "contiguous")
    if layout != "contiguous":
        assert not np.shares_memory(got, decoded)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_the_pillow_kernel_is_within_one_grey_level_of_torchs(mode: str) -> None:
    pixels = _photo(173, 251, 5)
    expected = F.resize(torch.from_numpy(pixels).permute(2, 0, 1), [61, 89], antialias=True,
                        interpolation=v2.InterpolationMode(mode))
    got = kernels._smooth_pillow(pixels, (61, 89), mode, True)
    assert got.shape == (61, 89, 3)
    assert np.abs(got.astype(int) - expected.permute(1, 2, 0).numpy().astype(int)).max() <= 1


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("shape", [(173, 251, 3), (40, 33, 1), (7, 300, 3)])
@pytest.mark.parametrize("size", [(61, 89), (224, 224), (5, 3)])
def test_the_nearest_kernels_equal_torchs(mode: str, shape: tuple, size: tuple) -> None:
    pixels = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    expected = torch.nn.functional.interpolate(torch.from_numpy(pixels).permute(2, 0, 1)[None], size=size, mode=mode)
    assert np.array_equal(kernels.resize(pixels, size, interpolation=mode), expected[0].permute(1, 2, 0).numpy())


@pytest.mark.parametrize("flip", [False, True], ids=["copy", "mirror"])
@pytest.mark.parametrize("layout", ["hwc", "planar", "cropped"])
def test_place_copies_any_layout_exactly(layout: str, flip: bool) -> None:
    rng = np.random.default_rng(5)
    planar = rng.integers(0, 256, (3, 20, 30), dtype=np.uint8)
    pixels = {"hwc": np.ascontiguousarray(planar.transpose(1, 2, 0)), "planar": planar.transpose(1, 2, 0),
              "cropped": np.ascontiguousarray(planar.transpose(1, 2, 0))[2:17, 3:29]}[layout]
    expected = pixels[:, ::-1] if flip else pixels
    batch = np.zeros((2, *pixels.shape), dtype=np.uint8)
    kernels.place(pixels, batch[1], flip=flip)
    assert np.array_equal(batch[1], expected) and not batch[0].any()
    copied = kernels.place(pixels, None, flip=flip)
    assert copied.flags.c_contiguous and np.array_equal(copied, expected)
    if layout == "hwc" and not flip:  # rows of whole pixels into a contiguous row: memmove, the GIL held
        assert kernels._memmove() is not None


@pytest.mark.parametrize("flip", [False, True], ids=["copy", "mirror"])
@pytest.mark.parametrize("layout", ["hwc", "planar", "cropped", "grey"])
def test_place_puts_reversed_channels_back_in_order(layout: str, flip: bool) -> None:
    """BGR in, RGB out (the fused decode decodes an image it mirrors as BGR): mirrored or not,
    from rows of whole pixels (one copy of each row backwards) or any other layout."""
    rng = np.random.default_rng(6)
    planar = rng.integers(0, 256, (1 if layout == "grey" else 3, 20, 30), dtype=np.uint8)
    rgb = np.ascontiguousarray(planar.transpose(1, 2, 0))
    bgr = {"hwc": np.ascontiguousarray(rgb[:, :, ::-1]), "planar": planar[::-1].transpose(1, 2, 0),
           "cropped": np.ascontiguousarray(rgb[:, :, ::-1])[2:17, 3:29], "grey": rgb}[layout]
    expected = {"cropped": rgb[2:17, 3:29]}.get(layout, rgb)
    expected = expected[:, ::-1] if flip else expected
    batch = np.zeros((2, *bgr.shape), dtype=np.uint8)
    kernels.place(bgr, batch[1], flip=flip, reversed_channels=True)
    assert np.array_equal(batch[1], expected) and not batch[0].any()
    copied = kernels.place(bgr, None, flip=flip, reversed_channels=True)
    assert copied.flags.c_contiguous and np.array_equal(copied, expected)
    other = (bgr.shape[0], bgr.shape[1] * bgr.shape[2] // 2, 2)  # rows of as many values, other pixels
    with pytest.raises(ValueError, match=r"cannot place pixels of shape \(\d+, \d+, [13]\) into a row of shape"):
        kernels.place(bgr, np.zeros(other, np.uint8), flip=flip, reversed_channels=True)


def test_the_copy_holding_the_gil_writes_only_into_a_writable_contiguous_row_of_its_size() -> None:
    """memmove checks nothing: a read-only row (a dataset opened read-only), a strided one (a
    column of a batch) or one of another size must go to numpy's copy, never be written past."""
    pixels = np.random.default_rng(7).integers(0, 256, (4, 5, 3), dtype=np.uint8)
    read_only = np.zeros_like(pixels)
    read_only.flags.writeable = False
    strided = np.zeros((4, 10, 3), np.uint8)[:, ::2]
    smaller, larger = np.zeros((4, 4, 3), np.uint8), np.zeros((5, 5, 3), np.uint8)
    for out in (read_only, strided, smaller, larger):
        assert kernels._copy_holding_gil(out, pixels) is False and not out.any()
    assert kernels._copy_holding_gil(strided.base[:, :5], pixels) is False  # contiguous rows, strided batch
    with pytest.raises(ValueError, match="^assignment destination is read-only$"):
        kernels.place(pixels, read_only)
    assert not read_only.any()
    batch = np.zeros((2, 4, 10, 3), np.uint8)
    assert kernels.place(pixels, batch[1, :, ::2]) is not None  # numpy's strided copy, exact
    assert np.array_equal(batch[1, :, ::2], pixels) and not batch[1, :, 1::2].any() and not batch[0].any()
    row = np.zeros_like(pixels)
    assert kernels._copy_holding_gil(row, pixels) is True and np.array_equal(row, pixels)


def test_the_fused_crop_draws_the_same_with_either_kernel(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel changes pixels by at most a grey level, never the box or the flip."""
    data = next(folder.glob("a/*.jpg")).read_bytes()
    plan = fused.split_transform(TRAIN)[0]
    images = []
    for serial in (True, False):
        monkeypatch.setattr(kernels, "torch_resizes_serially", lambda serial=serial: serial)
        images.append(fused.fused_decode(data, plan, generator=fused.generator_for(3, 1, 4)).numpy().astype(int))
    assert np.abs(images[0] - images[1]).max() <= 1


def test_process_workers_run_with_one_intra_op_thread(folder: Path) -> None:
    """As DataLoader workers do: a transform in a process worker sees one torch thread."""
    ds = fastdata.FolderDataset(folder, transform=_ThreadCount(), fuse=False)
    loader = fastdata.loader(ds, batch_size=7, num_workers=1, backend="process")
    (counts, _), = list(loader)
    assert counts.tolist() == [1] * 7


class _ThreadCount:
    """A picklable transform whose output is torch's intra-op thread count where it runs."""

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return torch.tensor(torch.get_num_threads())
