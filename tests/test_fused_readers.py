"""The fused decode wired into the readers (``fuse``, ``seed``): every reader of encoded images
fuses a transform's leading crop (+ flip), the crops come from (seed, epoch, index) on every
backend and num_workers, close to decode-then-transform on the same box; ``fuse=False`` and
stored pixels run the transform as before."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("torchvision")
from torchvision.transforms import v2  # noqa: E402
from torchvision.transforms.v2 import functional as F  # noqa: E402

import fastdata  # noqa: E402
from conftest import WRITABLE, convert_to, photo, psnr, run_fastdata  # noqa: E402
from fastdata.formats import get_format  # noqa: E402
from fastdata.reader import fused  # noqa: E402
from fastdata.errors import InvalidOptionError  # noqa: E402

SIZE = 32
MIN_PSNR_DB = 28.0  # as tests/test_fused.py: fused JPEG vs decode-then-crop on the same box
FORMATS = [name for name, store in WRITABLE if store == "encoded"]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """10 JPEGs (75-150 px a side) and 2 PNGs in 2 classes, and that folder converted (encoded)."""
    root = tmp_path_factory.mktemp("fused-readers")
    source = root / "photos"
    for index in range(12):
        height, width = 75 + 7 * index, 150 - 5 * index
        folder = source / ("cat" if index % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        image = Image.fromarray(photo(height, width, seed=index, detail_px=12, edge_rows=3))
        if index in (4, 9):
            image.save(folder / f"{index:02d}.png")
        else:
            image.save(folder / f"{index:02d}.jpg", quality=90)
    out = {"folder": source}
    for name in FORMATS:
        out[name] = convert_to(source, root, name, "encoded")
    return out


def _train(extra: list | None = None) -> v2.Compose:
    return v2.Compose([v2.RandomResizedCrop(SIZE), v2.RandomHorizontalFlip(), *(extra or [])])


def _open(datasets: dict[str, Path], name: str, **options):
    if name == "folder":
        return fastdata.FolderDataset(datasets["folder"], **options)
    return get_format(name).map_dataset(datasets[name], **options)  # tar: the map-style reader


def _source_bytes(datasets: dict[str, Path]) -> list[bytes]:
    """Each sample's file, in the readers' (ImageFolder's) order."""
    folder = fastdata.FolderDataset(datasets["folder"])
    return [Path(os.fsdecode(path)).read_bytes() for path in folder.paths]


@pytest.mark.parametrize("name", ["folder", *FORMATS])
def test_every_encoded_reader_fuses_and_draws_from_seed_epoch_index(datasets, name: str) -> None:
    ds = _open(datasets, name, transform=_train(), seed=7)
    assert ds.decoder.plan == fused.split_transform(_train())[0]
    ds.set_epoch(3)
    images, labels = ds[list(range(12))]
    assert images.shape == (12, 3, SIZE, SIZE) and images.dtype == torch.uint8
    for index, data in enumerate(_source_bytes(datasets)):
        expected = fused.fused_decode(data, ds.decoder.plan, generator=fused.generator_for(7, 3, index))
        assert torch.equal(images[index], expected), index
    assert labels.tolist() == fastdata.FolderDataset(datasets["folder"]).targets


def test_the_fused_crop_is_close_to_decode_then_transform_on_the_same_box(datasets) -> None:
    ds = _open(datasets, "npy", transform=_train(), seed=1)
    ds.set_epoch(0)
    plain = _open(datasets, "npy")
    plan = ds.decoder.plan
    for index, data in enumerate(_source_bytes(datasets)):
        full = plain[index][0]
        draw = plan.draw(*full.shape[-2:], fused.generator_for(1, 0, index))
        expected = F.resized_crop(full, draw.top, draw.left, draw.height, draw.width, [SIZE, SIZE], antialias=True)
        expected = expected.flip(-1) if draw.flip else expected
        got = ds[index][0]
        if data[:4] == b"\x89PNG":
            assert torch.equal(got, expected), index  # decoded in full, then cropped: exact
        else:
            assert psnr(got, expected) >= MIN_PSNR_DB, index


@pytest.mark.parametrize("name", ["npy", "tar"])
def test_crops_are_the_same_on_every_backend_and_num_workers_and_change_per_epoch(datasets, name: str) -> None:
    ds = _open(datasets, name, transform=_train(), seed=5)
    reference = None
    for backend, num_workers in (("torch", 0), ("torch", 2), ("thread", 2), ("process", 2)):
        images = _epochs(ds, backend, num_workers)
        if reference is None:
            reference = images
            assert not torch.equal(images[0], images[1])  # a new epoch, new crops
            for index, data in enumerate(_source_bytes(datasets)):
                expected = fused.fused_decode(data, ds.decoder.plan, generator=fused.generator_for(5, 1, index))
                assert torch.equal(images[1][index], expected)
        else:
            for epoch in range(2):
                assert torch.equal(images[epoch], reference[epoch]), (backend, num_workers, epoch)


def _epochs(ds, backend: str, num_workers: int) -> list[torch.Tensor]:
    """Each sample's image in epochs 0 and 1 of ``fastdata.loader`` (the sampler's order: the
    labels-free way is to read the indices from a second sampler of the same seed)."""
    from fastdata.loading.samplers import BatchIndexSampler

    loader = fastdata.loader(ds, batch_size=5, shuffle=True, seed=11, backend=backend, num_workers=num_workers)
    order = BatchIndexSampler(len(ds), 5, shuffle=True, seed=11)
    out = []
    for _ in range(2):
        images = torch.empty((len(ds), 3, SIZE, SIZE), dtype=torch.uint8)
        batches = list(order)
        got = list(loader)
        assert len(got) == len(batches)
        for indices, (pixels, _) in zip(batches, got):
            images[torch.as_tensor(np.asarray(indices))] = pixels
        out.append(images)
    return out


def test_set_epoch_of_fastdata_loader_reaches_the_reader(datasets) -> None:
    ds = _open(datasets, "hdf5", transform=_train(), seed=2)
    loader = fastdata.loader(ds, batch_size=12, shuffle=False, num_workers=0)
    loader.set_epoch(4)
    (images, _), = list(loader)
    data = _source_bytes(datasets)[6]
    assert torch.equal(images[6], fused.fused_decode(data, ds.decoder.plan, generator=fused.generator_for(2, 4, 6)))


def test_the_rest_of_the_pipeline_runs_after_the_fused_crop(datasets) -> None:
    rest = [v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.25] * 3)]
    ds = _open(datasets, "npy", transform=_train(rest), seed=0)
    cropped = _open(datasets, "npy", transform=_train(), seed=0)
    ds.set_epoch(1)
    cropped.set_epoch(1)
    assert torch.equal(ds[2][0], v2.Compose(rest)(cropped[2][0]))
    images, _ = ds[[0, 1]]
    assert images.dtype == torch.float32 and images.shape == (2, 3, SIZE, SIZE)


def test_without_an_epoch_crops_come_from_torchs_global_generator(datasets) -> None:
    ds = _open(datasets, "npy", transform=_train())
    data = _source_bytes(datasets)[0]
    torch.manual_seed(123)
    got = ds[0][0]
    torch.manual_seed(123)
    assert torch.equal(got, fused.fused_decode(data, ds.decoder.plan))


def test_fuse_false_decodes_then_runs_the_whole_transform(datasets) -> None:
    transform = _train()
    ds = _open(datasets, "npy", transform=transform, fuse=False)
    assert ds.decoder.plan is None
    plain = _open(datasets, "npy")
    for index in (0, 4, 7):
        torch.manual_seed(index)
        got = ds[index][0]
        torch.manual_seed(index)
        assert torch.equal(got, transform(plain[index][0]))


def test_resize_center_crop_is_fused_and_exact_for_png(datasets) -> None:
    transform = v2.Compose([v2.Resize(40), v2.CenterCrop(SIZE)])
    ds = _open(datasets, "tar", transform=transform)
    assert ds.decoder.plan.kind == "resize_center_crop"
    plain = _open(datasets, "tar")
    images, _ = ds[list(range(12))]
    sources = _source_bytes(datasets)
    for index in range(12):
        expected = transform(plain[index][0])
        if sources[index][:4] == b"\x89PNG":
            assert torch.equal(images[index], expected)
        else:
            assert psnr(images[index], expected) >= MIN_PSNR_DB


def test_the_iterable_tar_reader_fuses_with_its_epoch(datasets) -> None:
    ds = fastdata.TarDataset(datasets["tar"], transform=_train(), seed=9, shuffle=False)
    ds.set_epoch(2)
    sources = _source_bytes(datasets)
    for index, (image, _) in enumerate(ds):
        expected = fused.fused_decode(sources[index], ds.decoder.plan, generator=fused.generator_for(9, 2, index))
        assert torch.equal(image, expected), index


def test_stored_pixels_run_the_transform_as_usual(datasets, tmp_path: Path) -> None:
    raw = tmp_path / "raw.npy"
    fastdata.convert(datasets["folder"], raw, store="raw", resize="48x48", workers=0)
    transform = _train()
    ds = fastdata.open_dataset(raw, transform=transform)
    plain = fastdata.open_dataset(raw)
    assert ds.decoder.plan is None
    torch.manual_seed(3)
    got = ds[5][0]
    torch.manual_seed(3)
    assert torch.equal(got, transform(plain[5][0]))


def test_a_new_transform_after_construction_gets_a_new_plan(datasets) -> None:
    ds = _open(datasets, "npy")
    assert ds.decoder.plan is None
    ds.transform = _train()
    assert ds.decoder.plan is not None and ds[0][0].shape == (3, SIZE, SIZE)
    ds.transform = None
    assert ds.decoder.plan is None and ds[0][0].shape[-2:] != (SIZE, SIZE)


@pytest.mark.parametrize("options", [{"image_format": "pil"}, {"resize": 64}])
def test_not_fused_where_the_output_is_not_a_decoded_tensor(datasets, options: dict) -> None:
    ds = _open(datasets, "npy", transform=_train(), **options)
    assert ds.decoder.plan is None and ds.options.fusion() is None


@pytest.mark.parametrize(("options", "message"), [
    ({"fuse": "yes"}, "Invalid fuse 'yes'. Use True (fuse the transform's leading crop into the decode) or False "
                      "(decode, then transform)."),
    ({"seed": 1.5}, "Invalid seed 1.5. Use an integer."),
])
def test_bad_fuse_options_are_refused(datasets, options: dict, message: str) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        _open(datasets, "npy", **options)
    assert str(caught.value) == message


def test_the_png_members_are_pngs(datasets) -> None:
    """The fixture's premise: samples 4 and 9 (by file name) are PNGs, decoded by the fallback."""
    kinds = [data[:4] == b"\x89PNG" for data in _source_bytes(datasets)]
    assert sum(kinds) == 2
    assert Image.open(io.BytesIO(_source_bytes(datasets)[kinds.index(True)])).format == "PNG"


def test_bench_and_tune_say_where_the_decode_is_fused(datasets) -> None:
    from fastdata.cli.bench import fused_line
    from fastdata.cli.tune import fused_note

    rows = [{"status": "ok", "format": "npy", "store": "encoded", "read_path": "fast", "fused_decode": "random_resized_crop"},
            {"status": "ok", "format": "folder", "store": "-", "read_path": "standard", "fused_decode": "random_resized_crop"},
            {"status": "ok", "format": "npy", "store": "raw", "read_path": "fast", "fused_decode": None},
            {"status": "ok", "format": "probe", "store": "-", "read_path": "transfer", "fused_decode": None}]
    assert fused_line(rows) == ("fused decode: folder, npy encoded decode the transform's leading RandomResizedCrop "
                                "(+ flip) with the JPEG (fuse=True); not fused (stored pixels): npy raw")
    assert fused_line(rows[2:]) is None
    assert fused_note(_open(datasets, "npy", transform=_train())) == (
        "fused decode: the transform's leading RandomResizedCrop (+ flip) is decoded with each JPEG (fuse=True; "
        "docs/reading.md)")
    assert fused_note(_open(datasets, "npy", transform=_train(), fuse=False)) is None


def test_tune_augment_needs_a_crop_size(datasets) -> None:
    result = run_fastdata("tune", datasets["npy"], "--transform", "augment")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "fastdata: error: --transform augment needs the crop size: pass --resize HxW (or S)."
