"""torchvision datasets on roots laid out as torchvision's own test fakes (``tv_fakes``), read by
the real torchvision classes, converted from the CLI (``torchvision:NAME``) and from Python
(``fastdata.convert(dataset)``) into every format that keeps fields: each converted dataset
opens, verifies, and gives back what the dataset gives, sample by sample, with the same
structure (a bare tensor stays bare, a None stays None) and the classes as the dataset has them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision.datasets as tv_datasets
from PIL import Image

import fastdata
import tv_fakes
from conftest import FIELD_FORMATS, SUFFIXES
from fastdata.cli import main
from fastdata.errors import CorruptManifestError
from fastdata.formats.tar import TarIndexedDataset


def reader(path: Path, **options: Any) -> Any:
    return TarIndexedDataset(path, **options) if path.suffix == ".tar" else fastdata.open_dataset(path, **options)


def assert_same(got: Any, expected: Any, where: str = "sample") -> None:
    """``got`` is ``expected``: same types and nesting, equal pixels (and modes), arrays, numbers."""
    same_type = isinstance(got, Image.Image) if isinstance(expected, Image.Image) else type(got) is type(expected)
    assert same_type, f"{where}: {type(got).__name__} where the source gave {type(expected).__name__}"
    if isinstance(expected, Image.Image):
        assert (got.mode, got.size, got.tobytes()) == (expected.mode, expected.size, expected.tobytes()), where
    elif isinstance(expected, torch.Tensor):
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape) and torch.equal(got, expected), where
    elif isinstance(expected, np.ndarray):
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape) and np.array_equal(got, expected), where
    elif isinstance(expected, (tuple, list)):
        assert len(got) == len(expected), where
        for position, (a, b) in enumerate(zip(got, expected)):
            assert_same(a, b, f"{where}[{position}]")
    else:
        assert got == expected, where


def convert_both(name: str, root: Path, dataset: Any, out: Path, fmt: str, capsys, *options: str,
                 split: str | None = None) -> list[Path]:
    """``dataset`` converted from the CLI (``torchvision:NAME`` with ``options``) and from Python."""
    cli_out, python_out = out / f"cli{SUFFIXES[fmt]}", out / f"python{SUFFIXES[fmt]}"
    flags = [flag for option in options for flag in ("--source-option", option)] + (["--split", split] if split else [])
    status = main(["convert", f"torchvision:{name}", "--root", str(root), str(cli_out), "--format", fmt,
                   "--store", "encoded", "--workers", "0", *flags])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert captured.out.startswith(f"wrote {len(dataset)} samples to {cli_out}")
    fastdata.convert(dataset, python_out, format=fmt, store="encoded", workers=0)
    return [cli_out, python_out]


def assert_read_back(outputs: list[Path], dataset: Any) -> None:
    for out in outputs:
        assert fastdata.verify(out, deep=True).ok, fastdata.verify(out).problems
        ds = reader(out, image_format="pil")
        assert len(ds) == len(dataset)
        for index in range(len(dataset)):
            assert_same(ds[index], dataset[index], f"{out.name} sample {index}")


@pytest.fixture
def places_without_md5(monkeypatch):
    """torchvision's Places365 compares its devkit files' MD5 with the real download's, which
    files written here cannot match (torchvision's own fakes run with the check patched): only
    that comparison is replaced (by "the file exists")."""
    import torchvision.datasets.places365

    monkeypatch.setattr(torchvision.datasets.places365, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))


# --- classes as the source has them -------------------------------------------------------------

CLASSES = {  # name -> (root maker, the dataset on that root)
    "ImageNet": (tv_fakes.make_imagenet, lambda root: tv_datasets.ImageNet(str(root))),
    "Imagenette": (tv_fakes.make_imagenette, lambda root: tv_datasets.Imagenette(str(root))),
    "Places365": (tv_fakes.make_places365, lambda root: tv_datasets.Places365(str(root))),
    "StanfordCars": (tv_fakes.make_stanford_cars, lambda root: tv_datasets.StanfordCars(str(root))),
}


@pytest.mark.parametrize("fmt", FIELD_FORMATS)
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_classes_with_several_names_or_their_own_numbers_are_kept(tmp_path: Path, capsys, places_without_md5,
                                                                    name: str, fmt: str) -> None:
    """ImageNet and Imagenette give each class a tuple of names (``class_to_idx``: several names
    per index); Places365's fake numbers its three classes 0, 8, 30; StanfordCars' fake names
    three classes alike. Each converts, opens, verifies, and keeps both lists as they were."""
    make, create = CLASSES[name]
    make(tmp_path / "root")
    dataset = create(tmp_path / "root")
    outputs = convert_both(name, tmp_path / "root", dataset, tmp_path, fmt, capsys)
    assert_read_back(outputs, dataset)
    for out in outputs:
        ds = reader(out)
        assert ds.classes == list(dataset.classes) and ds.class_to_idx == dataset.class_to_idx
    if name == "ImageNet":
        assert reader(outputs[0]).classes == [("tench", "Tinca tinca"), ("goldfish", "Carassius auratus")]
        assert main(["info", str(outputs[0])]) == 0
        assert "classes:  2: tench / Tinca tinca, goldfish / Carassius auratus\n" in capsys.readouterr().out
    for out in outputs:  # a class's several names on one line
        assert main(["info", str(out)]) == 0, capsys.readouterr().err


class NegativeClass(torch.utils.data.Dataset):
    """A dataset whose ``class_to_idx`` holds an index no label can have."""

    class_to_idx = {"cat": -1}

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return Image.new("RGB", (4, 4), (index, 0, 0)), 0


def test_an_output_whose_manifest_its_readers_refuse_is_not_published(tmp_path: Path) -> None:
    out = tmp_path / "bad.npy"
    with pytest.raises(CorruptManifestError) as caught:
        fastdata.convert(NegativeClass(), out, workers=0)
    assert str(caught.value).endswith(
        "'class_to_idx' maps 'cat' to -1; expected a class index from 0. Nothing was written to "
        f"{str(out)!r}: this is a fastdata bug; please report it with the source's description.")
    assert not out.exists() and list(tmp_path.iterdir()) == []


# --- array-backed datasets and option text ------------------------------------------------------


@pytest.mark.parametrize("fmt", FIELD_FORMATS)
@pytest.mark.parametrize("what", ["train", "test", "nist"])
def test_qmnist_label_tables_give_the_class_or_the_whole_row(tmp_path: Path, capsys, what: str, fmt: str) -> None:
    """QMNIST's ``.targets`` is an (N, 8) table: its items give the class (``compat=True``, the
    default) or the whole row (``compat=false``, typed as text on the command line)."""
    tv_fakes.make_qmnist(tmp_path / "root", what)
    for compat in (True, False):
        dataset = tv_datasets.QMNIST(str(tmp_path / "root"), what=what, compat=compat)
        out = tmp_path / str(compat)
        outputs = convert_both("QMNIST", tmp_path / "root", dataset, out, fmt, capsys, f"what={what}",
                               f"compat={str(compat).lower()}")
        assert_read_back(outputs, dataset)
    row = reader(out / f"cli{SUFFIXES[fmt]}")[0][1]
    assert (row.dtype, row.shape) == (torch.int64, (8,))  # QMNIST reads its int32 table as int64


@pytest.mark.parametrize("text, split, count", [("false", "test", 1), ("False", "test", 1), ("no", "test", 1),
                                                 ("0", "test", 1), ("true", "train", 2), ("TRUE", "train", 2)])
def test_train_option_text_chooses_the_split(tmp_path: Path, capsys, text: str, split: str, count: int) -> None:
    tv_fakes.make_mnist(tmp_path / "root")
    out = tmp_path / "mnist.npy"
    assert main(["convert", "torchvision:MNIST", "--root", str(tmp_path / "root"), str(out), "--source-option",
                 f"train={text}", "--workers", "0", "--quiet"]) == 0
    expected = tv_datasets.MNIST(str(tmp_path / "root"), train=split == "train")
    ds = fastdata.open_dataset(out, image_format="pil")
    assert ds.manifest["source"]["split"] == split and len(ds) == count
    assert_read_back([out], expected)


@pytest.mark.parametrize("option, message", [
    ("train=flase", "--source-option train='flase': torchvision:MNIST's 'train' takes true or false, which 'flase' "
                    "is not. Give e.g. train=false."),
    ("train=false", "torchvision:MNIST: --split 'train' and --source-option train=False disagree. Give one of them."),
])
def test_option_text_that_is_not_understood_is_refused(tmp_path: Path, capsys, option: str, message: str) -> None:
    tv_fakes.make_mnist(tmp_path / "root")
    out = tmp_path / "mnist.npy"
    assert main(["convert", "torchvision:MNIST", "--root", str(tmp_path / "root"), str(out), "--source-option",
                 option, "--split", "train", "--workers", "0"]) == 1
    assert capsys.readouterr().err == f"fastdata: error: {message}\n"
    assert not out.exists()


# --- structure as the source gives it -------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Image.Image.getdata is deprecated:DeprecationWarning")  # torchvision's reader
@pytest.mark.parametrize("fmt", FIELD_FORMATS)
def test_phototour_patches_come_back_as_bare_tensors(tmp_path: Path, capsys, fmt: str) -> None:
    """PhotoTour's train items are bare uint8 (64, 64) tensors: read back bare, of that shape
    (not a 1-tuple, not a (1, 64, 64) image), one at a time and in batches."""
    tv_fakes.make_phototour(tmp_path / "root")
    dataset = tv_datasets.PhotoTour(str(tmp_path / "root"), "liberty")
    outputs = convert_both("PhotoTour", tmp_path / "root", dataset, tmp_path, fmt, capsys, "name=liberty")
    for out in outputs:
        assert fastdata.verify(out, deep=True).ok
        ds = reader(out)
        for index in range(len(dataset)):
            assert_same(ds[index], dataset[index], f"{out.name} sample {index}")
        batch = next(iter(fastdata.loader(ds, batch_size=5)))
        assert_same(batch, torch.stack([dataset[i] for i in range(5)]))


@pytest.mark.parametrize("fmt", FIELD_FORMATS)
def test_targets_that_are_none_come_back_none(tmp_path: Path, capsys, fmt: str) -> None:
    """OxfordIIITPet with no target types gives ``(image, None)`` (so does CelebA): kept so."""
    import tv_layouts

    tv_layouts.make_pets(tmp_path / "root")
    dataset = tv_datasets.OxfordIIITPet(str(tmp_path / "root"), target_types=[])
    outputs = convert_both("OxfordIIITPet", tmp_path / "root", dataset, tmp_path, fmt, capsys, "target_types=")
    assert_read_back(outputs, dataset)
    assert reader(outputs[0], image_format="pil")[0][1] is None


@pytest.mark.parametrize("fmt", FIELD_FORMATS)
@pytest.mark.parametrize("target_type", ["color", "instance", "semantic"])
def test_cityscapes_targets_as_the_fakes_give_them(tmp_path: Path, capsys, fmt: str, target_type: str) -> None:
    """The color target keeps its alpha (RGBA); the fake's instance and semantic targets are
    colour images (no ids): both paths keep them as the images they are."""
    tv_fakes.make_cityscapes(tmp_path / "root")
    dataset = tv_datasets.Cityscapes(str(tmp_path / "root"), target_type=target_type)
    outputs = convert_both("Cityscapes", tmp_path / "root", dataset, tmp_path, fmt, capsys,
                           f"target_type={target_type}")
    assert_read_back(outputs, dataset)
    assert {reader(out, image_format="pil")[0][1].mode for out in outputs} == {"RGBA" if target_type == "color"
                                                                              else "RGB"}


# --- values torchvision gives that were refused ------------------------------------------------------

STEREO_AND_FLOW = {  # name -> (root maker, the dataset on that root, options); targets None or of each image's size
    "Kitti2012Stereo": (tv_fakes.make_kitti2012_stereo, lambda root, split: tv_datasets.Kitti2012Stereo(root, split)),
    "Kitti2015Stereo": (tv_fakes.make_kitti2015_stereo, lambda root, split: tv_datasets.Kitti2015Stereo(root, split)),
    "KittiFlow": (tv_fakes.make_kitti_flow, lambda root, split: tv_datasets.KittiFlow(root, split)),
    "HD1K": (tv_fakes.make_hd1k, lambda root, split: tv_datasets.HD1K(root, split)),
}


@pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities of TorchVision are deprecated")
@pytest.mark.parametrize("fmt", FIELD_FORMATS)
@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("name", sorted(STEREO_AND_FLOW))
def test_none_targets_and_arrays_of_the_image_size_convert(tmp_path: Path, capsys, name: str, split: str,
                                                          fmt: str) -> None:
    """Stereo datasets' valid masks (always None) and test splits' targets (None) read back
    None; disparities and flows whose size follows each image's store without a hint."""
    make, create = STEREO_AND_FLOW[name]
    make(tmp_path / "root", split)
    dataset = create(str(tmp_path / "root"), split)
    outputs = convert_both(name, tmp_path / "root", dataset, tmp_path, fmt, capsys, split=split)
    assert_read_back(outputs, dataset)


@pytest.mark.parametrize("fmt", FIELD_FORMATS)
def test_crestereo_and_sbd_boundaries_convert(tmp_path: Path, capsys, fmt: str) -> None:
    tv_fakes.make_crestereo(tmp_path / "stereo")
    dataset = tv_datasets.CREStereo(str(tmp_path / "stereo"))
    assert_read_back(convert_both("CREStereo", tmp_path / "stereo", dataset, tmp_path / "a", fmt, capsys), dataset)
    tv_fakes.make_sbd(tmp_path / "sbd")
    dataset = tv_datasets.SBDataset(str(tmp_path / "sbd"), mode="boundaries")
    assert_read_back(convert_both("SBD", tmp_path / "sbd", dataset, tmp_path / "b", fmt, capsys, "mode=boundaries"),
                     dataset)


@pytest.mark.parametrize("fmt", FIELD_FORMATS)
def test_voc_fake_colour_masks_of_another_size_convert_alike(tmp_path: Path, capsys, fmt: str) -> None:
    """The fake's SegmentationClass files are colour images of their own size (no class ids):
    the CLI keeps them as images, as Python does (a palette mask of another size is refused on
    both paths: test_tv_fields)."""
    tv_fakes.make_voc_segmentation(tmp_path / "root")
    dataset = tv_datasets.VOCSegmentation(str(tmp_path / "root"), year="2012")
    assert_read_back(convert_both("VOCSegmentation", tmp_path / "root", dataset, tmp_path, fmt, capsys, "year=2012"),
                     dataset)


@pytest.mark.parametrize("fmt", FIELD_FORMATS)
def test_cityscapes_16_bit_instance_ids_from_python_keep_their_values(tmp_path: Path, fmt: str) -> None:
    """The real layout's 16-bit instance ids (class * 1000 + instance): from Python they are kept
    exactly and read back as the ``I;16`` image the dataset gives (they were cut to 8 bits)."""
    import tv_layouts

    tv_layouts.make_cityscapes(tmp_path / "root")
    dataset = tv_datasets.Cityscapes(str(tmp_path / "root"), target_type="instance")
    out = tmp_path / f"city{SUFFIXES[fmt]}"
    fastdata.convert(dataset, out, format=fmt, store="encoded", workers=0)
    assert_read_back([out], dataset)
    ids = reader(out, image_format="pil")[0][1]
    assert ids.mode == "I;16" and sorted(np.unique(np.asarray(ids)).tolist()) == [7, 23, 24000, 24001, 26000]


def test_dataset_folder_has_no_command_line_form(tmp_path: Path, capsys) -> None:
    """DatasetFolder needs a loader function: the CLI says so and how to convert it instead."""
    tv_fakes.image_folder(tmp_path / "root", "a", lambda i: f"a_{i}.png", 2)
    assert main(["convert", "torchvision:DatasetFolder", "--root", str(tmp_path / "root"), str(tmp_path / "o.npy"),
                 "--workers", "0"]) == 1
    assert capsys.readouterr().err == (
        "fastdata: error: torchvision:DatasetFolder needs a function as its 'loader' argument, which the command line "
        "cannot give: convert it from Python, fastdata.convert(DatasetFolder(root, loader, ...), OUTPUT) (an image "
        "folder converts from the command line as it is: fastdata convert FOLDER OUTPUT).\n")
    dataset = tv_datasets.DatasetFolder(str(tmp_path / "root"), tv_datasets.folder.pil_loader, extensions=("png",))
    fastdata.convert(dataset, tmp_path / "python.npy", store="encoded", workers=0)
    assert_read_back([tmp_path / "python.npy"], dataset)


@pytest.mark.filterwarnings("ignore:Image.Image.getdata is deprecated:DeprecationWarning")  # torchvision's reader
@pytest.mark.parametrize("fmt", FIELD_FORMATS)
def test_tuples_of_numbers_and_0d_tensors_come_back_as_given(tmp_path: Path, capsys, fmt: str) -> None:
    """INaturalist with several target types gives a tuple of ints (read back a tuple, not a
    list); PhotoTour's test split gives (patch, patch, 0-d int64 tensor) (read back a tensor)."""
    tv_fakes.make_inaturalist(tmp_path / "nat")
    dataset = tv_datasets.INaturalist(str(tmp_path / "nat"), target_type=["kingdom", "phylum", "full"])
    assert_read_back(convert_both("INaturalist", tmp_path / "nat", dataset, tmp_path / "a", fmt, capsys,
                                  "target_type=kingdom,phylum,full"), dataset)
    tv_fakes.make_phototour(tmp_path / "tour")
    dataset = tv_datasets.PhotoTour(str(tmp_path / "tour"), "liberty", train=False)
    outputs = convert_both("PhotoTour", tmp_path / "tour", dataset, tmp_path / "b", fmt, capsys, "name=liberty",
                           "train=false")
    for out in outputs:
        ds = reader(out)
        for index in range(len(dataset)):
            assert_same(ds[index], dataset[index], f"{out.name} sample {index}")
