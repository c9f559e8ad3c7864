"""torchvision datasets beyond classification as sources of named-field records.

Every dataset is written in its real on-disk layout (``tv_layouts``) and read by torchvision's
own class; each record must equal what that class, wrapped by ``wrap_dataset_for_transforms_v2``
where torchvision wraps it, returns for the same index: pixels, mask values and palettes, box
coordinates and their format and canvas, labels, caption strings.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.datasets as tv_datasets
from PIL import Image
from torchvision import tv_tensors
from torchvision.datasets import wrap_dataset_for_transforms_v2 as wrap

import fastdata
from conftest import FIELD_FORMATS, SUFFIXES, run_fastdata
import tv_layouts
from fastdata.conversion.options import parse_source_option
from fastdata.errors import InvalidOptionError
from fastdata.sources import resolve_source
from fastdata.sources.torchvision import coerce_option
from fastdata.sources.torchvision_targets import TorchvisionRecordSource


def same_image(got: Image.Image, expected: Image.Image) -> None:
    assert (got.mode, got.size) == (expected.mode, expected.size)
    assert got.tobytes() == expected.tobytes()
    if expected.mode == "P":
        assert got.getpalette() == expected.getpalette()


def same_tensor(got, expected) -> None:
    assert type(got) is type(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.as_subclass(torch.Tensor), expected.as_subclass(torch.Tensor))
    if isinstance(expected, tv_tensors.BoundingBoxes):
        assert (got.format, got.canvas_size) == (expected.format, expected.canvas_size)


def source_of(name: str, root: Path, split: str | None = None, **options) -> TorchvisionRecordSource:
    source = resolve_source(f"torchvision:{name}", root=root, split=split, source_options=options or None)
    assert isinstance(source, TorchvisionRecordSource)
    assert pickle.loads(pickle.dumps(source)).load_record(0).keys() == source.load_record(0).keys()
    return source


@pytest.fixture
def celeba_without_md5(monkeypatch):
    """torchvision's CelebA compares its text files' MD5 with the real download's, which files
    written here cannot match: only that comparison is replaced (by "the file exists")."""
    import torchvision.datasets.celeba

    monkeypatch.setattr(torchvision.datasets.celeba, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))


# --- segmentation ----------------------------------------------------------------------------


@pytest.mark.parametrize("split, names", [(None, tv_layouts.VOC_NAMES[:3]), ("val", tv_layouts.VOC_NAMES[3:]),
                                          ("trainval", tv_layouts.VOC_NAMES)])
def test_voc_segmentation_records_are_the_image_and_its_palette_mask(tmp_path: Path, split, names) -> None:
    tv_layouts.make_voc(tmp_path)
    source = source_of("VOCSegmentation", tmp_path, split, year="2012")
    reference = tv_datasets.VOCSegmentation(str(tmp_path), year="2012", image_set=split or "train")
    wrapped = wrap(reference)
    assert (source.layout, source.kinds) == ("tuple", {"mask": "mask"})
    assert source.describe() == {"type": "torchvision", "name": "VOCSegmentation", "split": split or "train",
                                 "root": str(tmp_path), "options": {"year": "'2012'"}, "length": len(names)}
    assert len(source) == len(names)
    for index, name in enumerate(names):
        record = source.load_record(index)
        assert list(record) == ["image", "mask"]
        image, mask = reference[index]
        same_image(record["image"], image)
        same_image(record["mask"], mask)
        assert record["mask"].mode == "P" and record["mask"].getpalette()[:6] == [0, 0, 0, 128, 0, 0]
        np.testing.assert_array_equal(np.asarray(record["mask"]), wrapped[index][1].numpy()[0])
        np.testing.assert_array_equal(np.asarray(record["mask"]), tv_layouts.class_mask(tv_layouts.VOC_OBJECTS[name]))
        assert source.load(index)[1] == -1


@pytest.mark.parametrize("mode", ["segmentation", "boundaries"])
def test_sbd_records(tmp_path: Path, mode: str) -> None:
    tv_layouts.make_sbd(tmp_path)
    source = source_of("SBD", tmp_path, mode=mode)
    reference = tv_datasets.SBDataset(str(tmp_path), image_set="train", mode=mode)
    assert len(source) == 3 and source.describe()["split"] == "train"
    for index in range(3):
        record = source.load_record(index)
        image, target = reference[index]
        same_image(record["image"], image)
        if mode == "segmentation":
            same_image(record["mask"], target)
            np.testing.assert_array_equal(np.asarray(record["mask"]), wrap(reference)[index][1].numpy()[0])
            expected = tv_layouts.class_mask(tv_layouts.VOC_OBJECTS[tv_layouts.VOC_NAMES[index]], border=False)
            np.testing.assert_array_equal(np.asarray(record["mask"]), expected)
        else:
            assert list(record) == ["image", "boundaries"]
            assert record["boundaries"].dtype == np.uint8 and record["boundaries"].shape == (20, 24, 32)
            np.testing.assert_array_equal(record["boundaries"], target)
    assert len(source_of("SBD", tmp_path, "val")) == 1


@pytest.mark.parametrize("target_types", ["category", "segmentation", "category,segmentation",
                                          "binary-category,segmentation,category", ""])
def test_oxford_pets_any_target_types(tmp_path: Path, target_types: str) -> None:
    tv_layouts.make_pets(tmp_path)
    source = source_of("OxfordIIITPet", tmp_path, target_types=target_types)
    types = [t for t in target_types.split(",") if t]
    reference = tv_datasets.OxfordIIITPet(str(tmp_path), split="trainval", target_types=types)
    names = {"category": "label", "binary-category": "binary_label", "segmentation": "mask"}
    assert source.describe()["split"] == "trainval" and len(source) == 3
    assert source.class_to_idx == {"Abyssinian": 0, "American Bulldog": 1}
    for index in range(3):
        record = source.load_record(index)
        assert list(record) == ["image"] + ([names[t] for t in types] if types else ["target"])  # (image, None)
        assert types or record["target"] is None
        image, target = reference[index]
        same_image(record["image"], image)
        values = [] if target is None else (list(target) if len(types) > 1 else [target])
        for kind, value in zip(types, values):
            if kind == "segmentation":
                same_image(record["mask"], value)
                assert set(np.unique(np.asarray(record["mask"]))) == {1, 2, 3}
            else:
                assert record[names[kind]] == value and type(record[names[kind]]) is int
        assert source.load(index)[1] == (tv_layouts.PET_IDS[index][1] - 1 if "category" in types else -1)
    assert len(source_of("OxfordIIITPet", tmp_path, "test")) == 2


def test_cityscapes_records_follow_the_wrapper(tmp_path: Path) -> None:
    tv_layouts.make_cityscapes(tmp_path)
    source = source_of("Cityscapes", tmp_path, target_type="semantic,instance,color,polygon")
    reference = tv_datasets.Cityscapes(str(tmp_path), split="train", target_type=["semantic", "instance", "color",
                                                                                  "polygon"])
    wrapped = wrap(tv_datasets.Cityscapes(str(tmp_path), split="train", target_type="semantic"))
    assert len(source) == 3 and source.kinds == {"mask": "mask", "polygon": "json", "masks": "array:ragged"}
    for index in range(3):
        record = source.load_record(index)
        assert list(record) == ["image", "mask", "masks", "labels", "color", "polygon"]
        image, (semantic, instance, color, polygon) = reference[index]
        same_image(record["image"], image)
        same_image(record["mask"], semantic)
        np.testing.assert_array_equal(np.asarray(record["mask"]), wrapped[index][1].numpy()[0])
        same_image(record["color"], color)
        assert record["polygon"] == polygon
        ids = np.unique(np.asarray(instance.convert("I")))
        assert ids.tolist() == [7, 23, 24000, 24001, 26000]
        assert isinstance(record["masks"], tv_tensors.Mask) and record["masks"].dtype == torch.bool
        for mask, instance_id in zip(record["masks"], ids):
            np.testing.assert_array_equal(mask.numpy(), np.asarray(instance.convert("I")) == instance_id)
        assert record["labels"].dtype == torch.int64 and record["labels"].tolist() == [7, 23, 24, 24, 26]
    assert len(source_of("Cityscapes", tmp_path, "val", target_type="semantic")) == 1


# --- detection -------------------------------------------------------------------------------


def test_voc_detection_records_are_the_wrappers_boxes_and_labels(tmp_path: Path) -> None:
    tv_layouts.make_voc(tmp_path)
    source = source_of("VOCDetection", tmp_path, "trainval")
    reference = tv_datasets.VOCDetection(str(tmp_path), image_set="trainval")
    wrapped = wrap(tv_datasets.VOCDetection(str(tmp_path), image_set="trainval"), target_keys={"boxes", "labels"})
    assert (source.layout, source.kinds) == ("dict", {"annotation": "json"})
    assert source.class_to_idx["aeroplane"] == 1 and source.class_to_idx["tvmonitor"] == 20
    for index, name in enumerate(tv_layouts.VOC_NAMES):
        record = source.load_record(index)
        assert list(record) == ["image", "boxes", "labels", "annotation"]
        image, target = reference[index]
        same_image(record["image"], image)
        assert record["annotation"] == target["annotation"]
        objects = tv_layouts.VOC_OBJECTS[name]
        expected = [[x0, y0, x1, y1] for _, x0, y0, x1, y1 in objects]
        assert record["boxes"].tolist() == expected and record["boxes"].canvas_size == (24, 32)
        assert record["labels"].tolist() == [tv_layouts.VOC_CLASSES.index(o[0]) for o in objects]
        if objects:
            _, wrapped_target = wrapped[index]
            same_tensor(record["boxes"], wrapped_target["boxes"])
            same_tensor(record["labels"], wrapped_target["labels"])
        else:  # the wrapper itself fails on an image without objects; the record has empty fields
            assert record["boxes"].shape == (0, 4) and record["boxes"].dtype == torch.int64
            assert record["labels"].shape == (0,) and record["labels"].dtype == torch.int64
            assert record["boxes"].format == tv_tensors.BoundingBoxFormat.XYXY


def test_voc_detection_class_ids_are_the_wrappers_for_every_class(tmp_path: Path) -> None:
    """fastdata's VOC table (torchvision keeps its own private) numbers every one of the 20
    classes as ``wrap_dataset_for_transforms_v2(VOCDetection)`` does: an image with one object of
    each class, in an order that is not the table's, gets the same labels from both."""
    from fastdata.sources.torchvision_targets import VOC_DETECTION_CATEGORIES

    tv_layouts.make_voc(tmp_path)
    classes = tv_layouts.VOC_CLASSES[1:]
    objects = [(name, 1 + i % 20, 1 + i % 10, 12 + i % 20, 13 + i % 10) for i, name in
               enumerate(classes[7:] + classes[:7])]
    xml = tmp_path / "VOCdevkit" / "VOC2012" / "Annotations" / f"{tv_layouts.VOC_NAMES[0]}.xml"
    xml.write_text(tv_layouts.voc_xml(tv_layouts.VOC_NAMES[0], "2012", objects))
    _, target = wrap(tv_datasets.VOCDetection(str(tmp_path), image_set="trainval"), target_keys={"labels"})[0]
    source = source_of("VOCDetection", tmp_path, "trainval")
    assert target["labels"].tolist() == [VOC_DETECTION_CATEGORIES.index(name) for name, *_ in objects]
    assert source.load_record(0)["labels"].tolist() == target["labels"].tolist()
    assert sorted(target["labels"].tolist()) == list(range(1, 21))  # every class, each once
    assert source.class_to_idx == {name: i for i, name in enumerate(VOC_DETECTION_CATEGORIES)}
    assert VOC_DETECTION_CATEGORIES[0] == "__background__" and len(VOC_DETECTION_CATEGORIES) == 21


COCO_RLE_WARNING = "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"  # pycocotools


@pytest.mark.filterwarnings(COCO_RLE_WARNING)
def test_coco_detection_records_are_the_wrappers_boxes_labels_and_masks(tmp_path: Path) -> None:
    info = tv_layouts.make_coco(tmp_path)
    source = source_of("CocoDetection", info["root"], annFile=info["annFile"])
    reference = tv_datasets.CocoDetection(str(info["root"]), info["annFile"])
    wrapped = wrap(tv_datasets.CocoDetection(str(info["root"]), info["annFile"]),
                   target_keys={"image_id", "boxes", "labels", "masks"})
    assert (source.layout, source.kinds) == ("dict", {"annotations": "json", "masks": "array:ragged"})
    assert source.class_to_idx == {}  # COCO's ids have gaps: they are the source's categories
    assert source.describe()["categories"] == {"1": "person", "18": "dog", "44": "bottle"}
    assert source.describe()["split"] is None
    assert [p.what for p in source.protected()] == ["dataset root folder", "annotation file (annFile)"]
    for index, image_id in enumerate([37777, 87038, 252219, 397133]):
        record = source.load_record(index)
        assert list(record) == ["image", "image_id", "boxes", "labels", "masks", "annotations"]
        image, annotations = reference[index]
        same_image(record["image"], image)
        assert record["image_id"] == image_id and record["annotations"] == annotations
        _, target = wrapped[index]
        if annotations:
            for key in ("boxes", "labels", "masks"):
                same_tensor(record[key], target[key])
            xywh = [a["bbox"] for a in annotations]
            assert record["boxes"].tolist() == [[x, y, x + w, y + h] for x, y, w, h in xywh]
        else:  # no annotation: the wrapper gives only image_id; the record has the fields, empty
            assert target == {"image_id": image_id}
            assert record["boxes"].shape == (0, 4) and record["boxes"].dtype == torch.float32
            assert record["boxes"].canvas_size == (24, 24)
            assert record["labels"].shape == (0,) and record["masks"].shape == (0, 24, 24)
    crowd = source.load_record(0)["masks"]
    assert crowd.dtype == torch.uint8 and crowd.sum().item() == 2 * 63
    assert torch.equal(crowd[0], crowd[1])  # the same region as uncompressed and compressed RLE


# --- captions and attributes ------------------------------------------------------------------


@pytest.mark.parametrize("name, make, captions", [("Flickr8k", tv_layouts.make_flickr8k, tv_layouts.FLICKR8K),
                                                  ("Flickr30k", tv_layouts.make_flickr30k, tv_layouts.FLICKR30K)])
def test_flickr_records_hold_the_five_captions(tmp_path: Path, name, make, captions) -> None:
    info = make(tmp_path)
    source = source_of(name, info["root"], ann_file=info["ann_file"])
    reference = getattr(tv_datasets, name)(str(info["root"]), info["ann_file"])
    assert len(source) == len(captions) and source.kinds == {"captions": "text_list"}
    for index in range(len(source)):
        record = source.load_record(index)
        image, expected = reference[index]
        assert list(record) == ["image", "captions"]
        same_image(record["image"], image)
        assert record["captions"] == expected == captions[sorted(captions)[index].removesuffix(".jpg")
                                                          if name == "Flickr8k" else sorted(captions)[index]]
        assert len(record["captions"]) == 5
    assert "犬が二匹遊んでいる" in sum((source.load_record(i)["captions"] for i in range(len(source))), []) \
        or name == "Flickr30k"


@pytest.mark.parametrize("split, indices", [(None, [0, 1, 2]), ("valid", [3, 4]), ("test", [5, 6]), ("all", range(7))])
def test_celeba_attributes_identity_boxes_landmarks(tmp_path: Path, celeba_without_md5, split, indices) -> None:
    tv_layouts.make_celeba(tmp_path)
    types = ["attr", "identity", "bbox", "landmarks"]
    source = source_of("CelebA", tmp_path, split, target_type="attr,identity,bbox,landmarks")
    reference = tv_datasets.CelebA(str(tmp_path), split=split or "train", target_type=types)
    boxes_only = wrap(tv_datasets.CelebA(str(tmp_path), split=split or "train", target_type="bbox"))
    assert len(source) == len(indices) and source.describe()["split"] == (split or "train")
    for index, row in enumerate(indices):
        record = source.load_record(index)
        image, (attr, identity, bbox, landmarks) = reference[index]
        assert list(record) == ["image"] + types
        same_image(record["image"], image)
        assert record["attr"].dtype == torch.int64 and torch.equal(record["attr"], attr)
        assert record["identity"] == int(identity) == 2880 + row % 3
        wrapped_image, wrapped_box = boxes_only[index]
        wrapped_image.close()  # CelebA opens its images lazily
        same_tensor(record["bbox"], wrapped_box)
        x, y, w, h = 95 + row, 71, 226 - row, 313
        assert record["bbox"].tolist() == [[x, y, x + w, y + h]]  # outside the aligned image: kept as it is
        assert torch.equal(record["landmarks"], landmarks)


# --- splits and source options ---------------------------------------------------------------


def test_split_errors_list_the_datasets_own_values(tmp_path: Path) -> None:
    tv_layouts.make_voc(tmp_path / "voc")
    tv_layouts.make_pets(tmp_path / "pets")
    info = tv_layouts.make_flickr30k(tmp_path / "f30k")
    cases = [
        ("VOCSegmentation", tmp_path / "voc", "test", {},
         "Unknown split 'test' for torchvision:VOCSegmentation. Allowed: 'train', 'trainval', 'val'."),
        ("OxfordIIITPet", tmp_path / "pets", "train", {},
         "Unknown split 'train' for torchvision:OxfordIIITPet. Allowed: 'trainval', 'test'."),
        ("CelebA", tmp_path, "val", {}, "Unknown split 'val' for torchvision:CelebA. Allowed: 'train', 'valid', "
                                        "'test', 'all'."),
        ("Cityscapes", tmp_path, "train_extra", {},
         "Unknown split 'train_extra' for torchvision:Cityscapes. Allowed: 'train', 'val', 'test'."),
        ("SBD", tmp_path, "test", {}, "Unknown split 'test' for torchvision:SBD. Allowed: 'train', 'val', "
                                      "'train_noval'."),
        ("Flickr30k", info["root"], "train", {"ann_file": info["ann_file"]},
         "torchvision:Flickr30k has no split, so --split 'train' does not apply; its samples are those of its "
         "annotation file (--source-option ann_file=PATH). Drop --split train (split='train')."),
        ("VOCSegmentation", tmp_path / "voc", "val", {"image_set": "train"},
         "torchvision:VOCSegmentation: --split 'val' and --source-option image_set='train' disagree. "
         "Give one of them."),
        ("Flickr30k", info["root"], None, {}, "torchvision:Flickr30k needs its 'ann_file' argument. Give it with "
                                              "--source-option ann_file=VALUE."),
    ]
    for name, root, split, options, message in cases:
        with pytest.raises(InvalidOptionError) as caught:
            resolve_source(f"torchvision:{name}", root=root, split=split, source_options=options)
        assert str(caught.value) == message
    # VOC 2007 also has a test set; image_set given as a source option is the split
    assert resolve_source("torchvision:VOCSegmentation", root=tmp_path / "voc",
                          source_options={"image_set": "val"}).describe()["split"] == "val"


def test_source_option_text_becomes_the_type_the_constructor_expects() -> None:
    assert parse_source_option("year=2012") == ("year", "2012")
    voc, pets, fake = tv_datasets.VOCSegmentation, tv_datasets.OxfordIIITPet, tv_datasets.FakeData
    assert coerce_option(voc, "year", "2012") == "2012"
    assert coerce_option(voc, "year", 2012) == 2012  # Python values pass as given
    assert coerce_option(pets, "target_types", "category,segmentation") == ["category", "segmentation"]
    assert coerce_option(pets, "target_types", "segmentation") == "segmentation"
    assert coerce_option(tv_datasets.CelebA, "target_type", "attr,bbox") == ["attr", "bbox"]
    assert coerce_option(fake, "size", "5") == 5
    assert coerce_option(fake, "image_size", "(1, 4, 4)") == (1, 4, 4)
    assert coerce_option(tv_datasets.MNIST, "download", "false") is False
    assert coerce_option(tv_datasets.Flickr30k, "ann_file", "123.token") == "123.token"
    # text parameters that look like numbers stay text
    assert coerce_option(tv_datasets.Kinetics, "num_classes", "400") == "400"
    assert coerce_option(tv_datasets.STL10, "split", "1") == "1"
    assert coerce_option(tv_datasets.STL10, "folds", "1") == 1


def test_voc_year_text_stays_text_from_the_command_line(tmp_path: Path, capsys) -> None:
    """VOC compares year with its own strings: year=2007 must reach it as "2007" (an int 2007
    would be refused by torchvision's verify_str_arg)."""
    from fastdata.cli import main

    tv_layouts.make_voc(tmp_path / "voc", year="2007")
    source = resolve_source("torchvision:VOCDetection", root=tmp_path / "voc", source_options={"year": "2007"})
    assert source.describe()["options"] == {"year": "'2007'"}
    out = tmp_path / "voc.npy"
    assert main(["convert", "torchvision:VOCDetection", "--root", str(tmp_path / "voc"), str(out), "--source-option",
                 "year=2007", "--workers", "0"]) == 0, capsys.readouterr().err
    assert fastdata.open_dataset(out).manifest["source"]["options"] == {"year": "'2007'"}


def test_classic_datasets_keep_their_splits(mnist_root: Path) -> None:
    assert resolve_source("torchvision:MNIST", root=mnist_root).describe()["split"] == "train"
    assert len(resolve_source("torchvision:MNIST", root=mnist_root, split="test")) == 15
    with pytest.raises(InvalidOptionError, match=r"^Unknown split 'val' for torchvision:MNIST\. Allowed: 'train', "
                                                 r"'test'\.$"):
        resolve_source("torchvision:MNIST", root=mnist_root, split="val")


# --- fastdata preview -------------------------------------------------------------------------


def test_preview_draws_every_box_in_its_class_colour_on_its_object(tmp_path: Path) -> None:
    from fastdata.preview import LINE_HEIGHT, PALETTE, PADDING, cell_origin, render

    tv_layouts.make_voc(tmp_path)
    source = source_of("VOCDetection", tmp_path, "trainval")
    records = [source.load_record(i) for i in range(5)]
    names = {index: name for name, index in source.class_to_idx.items()}
    render(records, class_names=names, cell_size=96, columns=5).save(tmp_path / "grid.png")
    with Image.open(tmp_path / "grid.png") as png:
        grid = np.asarray(png.convert("RGB"))
    strip = LINE_HEIGHT + 4  # one line a cell: "boxes: K"
    assert grid.shape == (PADDING + 96 + strip + PADDING, PADDING + 5 * (96 + PADDING), 3)
    scale = 96 / 32
    checked = 0
    for position, name in enumerate(tv_layouts.VOC_NAMES):
        x, y = cell_origin(position, columns=5, cell_size=96, strip=strip)
        for cls, x0, y0, x1, y1 in tv_layouts.VOC_OBJECTS[name]:
            colour = PALETTE[tv_layouts.VOC_CLASSES.index(cls) % len(PALETTE)]
            bottom = (y + round(y1 * scale), x + round((x0 + x1) / 2 * scale))  # the middle of the bottom edge
            assert tuple(grid[bottom]) == colour, (name, cls)
            inside = (y + round((y0 + y1) / 2 * scale), x + round((x0 + x1) / 2 * scale) + 1)
            assert tuple(grid[inside]) != colour, (name, cls)  # an outline, not filled
            checked += 1
    assert checked == 7
    # the image itself: scaled 3x with nearest neighbour where no box is drawn
    x, y = cell_origin(4, columns=5, cell_size=96, strip=strip)
    np.testing.assert_array_equal(grid[y:y + 72:3, x:x + 96:3], np.asarray(records[4]["image"]))


@pytest.mark.filterwarnings(COCO_RLE_WARNING)
def test_preview_draws_masks_and_captions(tmp_path: Path) -> None:
    from fastdata.preview import LINE_HEIGHT, MASK_ALPHA, PALETTE, cell_origin, render

    tv_layouts.make_voc(tmp_path)
    source = source_of("VOCSegmentation", tmp_path, "trainval")
    record = source.load_record(0)
    render([record], cell_size=32).save(tmp_path / "mask.png")
    with Image.open(tmp_path / "mask.png") as png:
        grid = np.asarray(png.convert("RGB")).astype(int)
    assert grid.shape == (36, 36, 3)  # one cell, no text
    x, y = cell_origin(0, columns=1, cell_size=32)
    image, mask = np.asarray(record["image"]).astype(int), np.asarray(record["mask"])
    for cls in (1, 15):  # aeroplane, person: blended with their colour
        row, col = np.argwhere(mask == cls)[0]
        expected = (1 - MASK_ALPHA) * image[row, col] + MASK_ALPHA * np.array(PALETTE[cls])
        assert np.abs(grid[y + row, x + col] - expected).max() <= 1
    row, col = np.argwhere(mask == 0)[0]
    np.testing.assert_array_equal(grid[y + row, x + col], image[row, col])  # background: not drawn
    row, col = np.argwhere(mask == 255)[0]
    np.testing.assert_array_equal(grid[y + row, x + col], image[row, col])  # VOC's void border: not drawn

    info = tv_layouts.make_flickr30k(tmp_path / "f30k")
    captions = source_of("Flickr30k", info["root"], ann_file=info["ann_file"])
    picture = render([captions.load_record(0), captions.load_record(1)], cell_size=160)
    lines = 5 * 2  # five captions, each wrapped to at most two lines at 26 characters
    assert picture.size == (2 + 2 * 162, 2 + 160 + 4 + LINE_HEIGHT * lines + 2)
    strip = np.asarray(picture.convert("L"))[2 + 160:, 2:162]
    assert (strip < 128).sum() > 200  # the captions' text is there


def test_preview_command_on_a_classic_dataset(tmp_path: Path, capsys) -> None:
    from fastdata.cli import main
    from fastdata.preview import LINE_HEIGHT, cell_origin

    fake = tv_datasets.FakeData(size=6, image_size=(3, 12, 16), num_classes=3, random_offset=2)
    fastdata_out = tmp_path / "fake.npy"
    import fastdata

    fastdata.convert(fake, fastdata_out, workers=0)
    png = tmp_path / "grid.png"
    assert main(["preview", str(fastdata_out), "--index", "1:6", "--out", str(png), "--cell-size", "32"]) == 0
    strip = LINE_HEIGHT + 4
    assert capsys.readouterr().out == f"wrote {png} ({2 + 4 * 34}x{2 + 2 * (32 + strip + 2)})\n"
    with Image.open(png) as picture:
        grid = np.asarray(picture.convert("RGB"))
    for position, index in enumerate(range(1, 6)):
        x, y = cell_origin(position, columns=4, cell_size=32, strip=strip)
        np.testing.assert_array_equal(grid[y:y + 24:2, x:x + 32:2], np.asarray(fake[index][0]))
        label_row = grid[y + 32 + 2:y + 32 + strip, x:x + 32]
        assert (label_row.min(axis=-1) < 100).any()  # "label: N" written under it
    assert not (tmp_path / "grid.png.partial").exists()
    for flags, message in [(["--index", "9"], "--index '9': sample 9 is out of range; the dataset has 6 samples (0..5)."),
                           (["--index", "7:9"], "--index '7:9' selects no sample of the 6. Use e.g. 0:16."),
                           (["--index", "a-b"], "Invalid --index 'a-b'. Use START:STOP (e.g. 0:16), one index, or a "
                                                "comma list."),
                           (["--cell-size", "8"], "Invalid --cell-size 8. Use 16 or more pixels."),
                           (["--columns", "0"], "Invalid --columns 0. Use a positive integer."),
                           (["--out", str(tmp_path / "g.jpg")], f"--out {str(tmp_path / 'g.jpg')!r} is not a .png file. "
                                                                "Give a name ending in .png, e.g. grid.png.")]:
        argv = ["preview", str(fastdata_out), "--out", str(png), *flags]
        assert main(argv) == 1
        assert capsys.readouterr().err == f"fastdata: error: {message}\n"


# --- end to end: convert, then read back through every format ---------------------------------


FORMATS = [(SUFFIXES[name], store) for store in ("encoded", "raw") for name in FIELD_FORMATS]  # (output name ending, store)


def read_back(out: Path):
    import fastdata

    return fastdata.TarIndexedDataset(out) if out.suffix == ".tar" else fastdata.open_dataset(out)


def pixels_of(image) -> np.ndarray:
    return np.asarray(image) if isinstance(image, Image.Image) else image.permute(1, 2, 0).numpy()


@pytest.mark.parametrize("suffix, store", FORMATS)
def test_voc_segmentation_converts_and_reads_back_pixel_equal(tmp_path: Path, suffix: str, store: str) -> None:
    import fastdata

    tv_layouts.make_voc(tmp_path / "voc")
    out = tmp_path / f"voc{suffix}"
    manifest = fastdata.convert("torchvision:VOCSegmentation", out, root=tmp_path / "voc", split="trainval",
                                source_options={"year": "2012"}, store=store, workers=0)
    assert manifest["count"] == 5 and manifest["source"]["split"] == "trainval"
    reference = tv_datasets.VOCSegmentation(str(tmp_path / "voc"), image_set="trainval")
    ds = read_back(out)
    for index in range(5):
        image, mask = ds[index]
        expected_image, expected_mask = reference[index]
        assert isinstance(image, tv_tensors.Image) and isinstance(mask, tv_tensors.Mask)
        np.testing.assert_array_equal(pixels_of(image), np.asarray(expected_image))
        np.testing.assert_array_equal(mask.numpy(), np.asarray(expected_mask))
        assert mask.dtype == torch.uint8
    palette = fastdata.open_dataset(out, image_format="pil")[0][1] if suffix != ".tar" else None
    if palette is not None:
        assert palette.mode == "P" and palette.getpalette() == reference[0][1].getpalette()


@pytest.mark.parametrize("suffix, store", FORMATS[:3])
@pytest.mark.filterwarnings(COCO_RLE_WARNING)
def test_coco_detection_converts_and_reads_back_equal(tmp_path: Path, suffix: str, store: str) -> None:
    import fastdata

    info = tv_layouts.make_coco(tmp_path / "coco")
    out = tmp_path / f"coco{suffix}"
    fastdata.convert("torchvision:CocoDetection", out, root=info["root"], source_options={"annFile": info["annFile"]},
                     store=store, workers=0)
    source = source_of("CocoDetection", info["root"], annFile=info["annFile"])
    ds = read_back(out)
    assert len(ds) == 4
    for index in range(4):
        got, expected = ds[index], source.load_record(index)
        assert list(got) == ["image", "image_id", "boxes", "labels", "masks", "annotations"]
        np.testing.assert_array_equal(pixels_of(got["image"]), np.asarray(expected["image"]))
        assert got["image_id"] == expected["image_id"] and got["annotations"] == expected["annotations"]
        for key in ("boxes", "labels", "masks"):
            same_tensor(got[key], expected[key])  # bit-equal, same tv_tensor type, format and canvas


@pytest.mark.parametrize("suffix, store", FORMATS[:3])
def test_voc_detection_and_flickr_convert_and_read_back_equal(tmp_path: Path, suffix: str, store: str) -> None:
    import fastdata

    tv_layouts.make_voc(tmp_path / "voc")
    fastdata.convert("torchvision:VOCDetection", tmp_path / f"det{suffix}", root=tmp_path / "voc", split="trainval",
                     store=store, workers=0)
    source = source_of("VOCDetection", tmp_path / "voc", "trainval")
    ds = read_back(tmp_path / f"det{suffix}")
    for index in range(5):
        got, expected = ds[index], source.load_record(index)
        same_tensor(got["boxes"], expected["boxes"])
        same_tensor(got["labels"], expected["labels"])
        assert got["annotation"] == expected["annotation"]
    info = tv_layouts.make_flickr30k(tmp_path / "f30k")
    fastdata.convert("torchvision:Flickr30k", tmp_path / f"cap{suffix}", root=info["root"],
                     source_options={"ann_file": info["ann_file"]}, store=store, workers=0)
    reference = tv_datasets.Flickr30k(str(info["root"]), info["ann_file"])
    ds = read_back(tmp_path / f"cap{suffix}")
    for index in range(2):
        image, captions = ds[index]
        expected_image, expected_captions = reference[index]
        np.testing.assert_array_equal(pixels_of(image), np.asarray(expected_image))
        assert captions == expected_captions and len(captions) == 5


@pytest.mark.parametrize("suffix, store", [(".npy", "raw"), (".h5", "encoded"), (".tar", "encoded")])
def test_voc_detection_output_verifies(tmp_path: Path, suffix: str, store: str) -> None:
    """The manifest's 21 classes name the ``labels`` field's ids; the label column (no ``label``
    field) is -1 for every sample, which verify must not report as out of range."""
    import fastdata

    tv_layouts.make_voc(tmp_path / "voc")
    out = tmp_path / f"det{suffix}"
    fastdata.convert("torchvision:VOCDetection", out, root=tmp_path / "voc", split="trainval", store=store,
                     resize="32x32" if store == "raw" else None, workers=0)
    manifest = out / "manifest.json" if out.is_dir() else None
    if manifest is not None:
        assert len(json.loads(manifest.read_text())["classes"]) == 21
    report = fastdata.verify(out, deep=True)
    assert report.ok, report.problems


def test_resize_keeps_every_box_on_its_object_as_preview_shows(tmp_path: Path, capsys) -> None:
    """CLI end to end: convert with --resize (raw), then 'fastdata preview' draws each stored
    box where the object is: the boxes read back are the originals scaled 2x, and the grid has
    each box's colour on its bottom edge."""
    from fastdata.cli import main
    from fastdata.preview import LINE_HEIGHT, PALETTE, cell_origin

    tv_layouts.make_voc(tmp_path / "voc")
    out = tmp_path / "det.h5"
    assert main(["convert", "torchvision:VOCDetection", "--root", str(tmp_path / "voc"), "--split", "trainval",
                 "--source-option", "year=2012", str(out), "--resize", "48x64", "--quiet", "--workers", "0"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote 5 samples to {out}")
    ds = read_back(out)
    for index, name in enumerate(tv_layouts.VOC_NAMES):
        boxes = ds[index]["boxes"]
        assert boxes.canvas_size == (48, 64)
        assert boxes.tolist() == [[2 * x0, 2 * y0, 2 * x1, 2 * y1] for _, x0, y0, x1, y1 in tv_layouts.VOC_OBJECTS[name]]
    png = tmp_path / "grid.png"
    assert main(["preview", str(out), "--out", str(png), "--cell-size", "128", "--columns", "5"]) == 0
    with Image.open(png) as picture:
        grid = np.asarray(picture.convert("RGB"))
    strip = LINE_HEIGHT + 4
    for position, name in enumerate(tv_layouts.VOC_NAMES):
        x, y = cell_origin(position, columns=5, cell_size=128, strip=strip)
        for cls, x0, y0, x1, y1 in tv_layouts.VOC_OBJECTS[name]:  # stored 2x, drawn 2x more: 4x the original
            assert tuple(grid[y + 4 * y1, x + 2 * (x0 + x1)]) == PALETTE[tv_layouts.VOC_CLASSES.index(cls) % len(PALETTE)], \
                (name, cls)


@pytest.mark.filterwarnings(COCO_RLE_WARNING)
def test_worker_processes_and_resume_give_the_same_dataset(tmp_path: Path) -> None:
    """The record source crosses to conversion workers by pickle (its transforms-v2 wrapper is
    made again in each), and --resume finds the finished output unchanged (same fingerprint)."""
    import fastdata

    info = tv_layouts.make_coco(tmp_path / "coco")
    kwargs = dict(root=info["root"], source_options={"annFile": info["annFile"]}, store="encoded")
    serial = fastdata.convert("torchvision:CocoDetection", tmp_path / "serial.tar", workers=0, **kwargs)
    pooled = fastdata.convert("torchvision:CocoDetection", tmp_path / "pooled.tar", workers=2, **kwargs)
    again = fastdata.convert("torchvision:CocoDetection", tmp_path / "pooled.tar", workers=2, resume=True, **kwargs)
    assert again["manifest_blake2b"] == pooled["manifest_blake2b"]
    shards = sorted((tmp_path / "serial.tar").glob("*.tar"))
    assert [s.read_bytes() for s in shards] == [(tmp_path / "pooled.tar" / s.name).read_bytes() for s in shards]
    assert serial["source"]["categories"] == {"1": "person", "18": "dog", "44": "bottle"}
    from fastdata.preview import preview  # a tar dataset previews through TarIndexedDataset

    assert preview(tmp_path / "pooled.tar", index="0:4", cell_size=32).size == (2 + 4 * 34, 2 + 32 + 4 + 13 * 2 + 2)


def test_cli_pets_with_target_types_and_celeba(tmp_path: Path, capsys, celeba_without_md5) -> None:
    import fastdata
    from fastdata.cli import main

    tv_layouts.make_pets(tmp_path / "pets")
    out = tmp_path / "pets.npy"
    assert main(["convert", "torchvision:OxfordIIITPet", "--root", str(tmp_path / "pets"), "--split", "test",
                 "--source-option", "target_types=category,segmentation", str(out), "--quiet", "--workers", "0"]) == 0
    capsys.readouterr()
    reference = tv_datasets.OxfordIIITPet(str(tmp_path / "pets"), split="test", target_types=["category", "segmentation"])
    ds = fastdata.open_dataset(out)
    for index in range(2):
        image, (label, mask) = ds[index]  # torchvision's structure: (image, (label, mask))
        expected_image, (expected_label, expected_mask) = reference[index]
        assert label == expected_label and isinstance(mask, tv_tensors.Mask)
        np.testing.assert_array_equal(mask.numpy(), np.asarray(expected_mask))
        np.testing.assert_array_equal(pixels_of(image), np.asarray(expected_image))
    assert main(["convert", "torchvision:OxfordIIITPet", "--root", str(tmp_path / "pets"), str(tmp_path / "x.npy"),
                 "--split", "train", "--quiet"]) == 1
    assert capsys.readouterr().err == ("fastdata: error: Unknown split 'train' for torchvision:OxfordIIITPet. "
                                       "Allowed: 'trainval', 'test'.\n")
    assert not (tmp_path / "x.npy").exists()

    tv_layouts.make_celeba(tmp_path / "celeba")
    fastdata.convert("torchvision:CelebA", tmp_path / "celeba.h5", root=tmp_path / "celeba", split="valid",
                     source_options={"target_type": "attr,bbox,landmarks"}, workers=0)
    reference = tv_datasets.CelebA(str(tmp_path / "celeba"), split="valid", target_type=["attr", "bbox", "landmarks"])
    source = source_of("CelebA", tmp_path / "celeba", "valid", target_type="attr,bbox,landmarks")
    ds = fastdata.open_dataset(tmp_path / "celeba.h5")
    for index in range(2):
        image, (attr, bbox, landmarks) = ds[index]
        expected_image, (expected_attr, _, expected_landmarks) = reference[index]
        np.testing.assert_array_equal(pixels_of(image), np.asarray(expected_image))  # (and closes the file)
        assert torch.equal(attr, expected_attr) and torch.equal(landmarks, expected_landmarks)
        same_tensor(bbox, source.load_record(index)["bbox"])


def test_coco_captions_records(tmp_path: Path) -> None:
    info = tv_layouts.make_coco_captions(tmp_path)
    source = source_of("CocoCaptions", info["root"], annFile=info["annFile"])
    reference = tv_datasets.CocoCaptions(str(info["root"]), info["annFile"])
    assert len(source) == 4 and source.kinds == {"captions": "text_list"}
    for index, image_id in enumerate([37777, 87038, 252219, 397133]):
        record = source.load_record(index)
        image, captions = reference[index]
        same_image(record["image"], image)
        assert record["captions"] == captions == [f"caption {n} of image {image_id}" for n in range(5)]


def test_a_mask_of_another_size_than_its_image_is_refused_naming_the_sample(tmp_path: Path, capsys) -> None:
    from fastdata.cli import main

    tv_layouts.make_voc(tmp_path / "voc")
    bad = tmp_path / "voc" / "VOCdevkit" / "VOC2012" / "SegmentationClass" / "2007_000039.png"
    small = Image.new("P", (16, 12))
    small.putpalette(tv_layouts.voc_palette())
    small.save(bad)
    out = tmp_path / "voc.npy"
    assert main(["convert", "torchvision:VOCSegmentation", "--root", str(tmp_path / "voc"), str(out), "--quiet",
                 "--workers", "0"]) == 1
    image = tmp_path / "voc" / "VOCdevkit" / "VOC2012" / "JPEGImages" / "2007_000039.jpg"
    err = capsys.readouterr().err
    assert err.startswith(f"fastdata: error: {image}: field 'mask' is a 16x12 mask but its image 'image' is 32x24")
    assert len(err.splitlines()) == 1 and not out.exists()


def test_voc_images_of_different_sizes_name_the_cause_and_the_docs_command_converts_them(tmp_path: Path,
                                                                                        capsys) -> None:
    """Real VOC images differ in size: raw storage (the default) says so, naming the images and
    the fix, not their masks; the command docs/converting.md shows (``--store encoded``) converts."""
    from fastdata.cli import main

    tv_layouts.make_voc(tmp_path / "voc")
    base = tmp_path / "voc" / "VOCdevkit" / "VOC2012"
    tv_layouts.picture(1, 30, 40).save(base / "JPEGImages" / "2007_000039.jpg", quality=95)
    mask = Image.fromarray(tv_layouts.class_mask(tv_layouts.VOC_OBJECTS["2007_000039"], 30, 40), "P")
    mask.putpalette(tv_layouts.voc_palette())
    mask.save(base / "SegmentationClass" / "2007_000039.png")
    command = ["convert", "torchvision:VOCSegmentation", "--root", str(tmp_path / "voc"), "--source-option",
               "year=2012", "--quiet", "--workers", "0"]
    assert main([*command, str(tmp_path / "raw.h5")]) == 1
    assert capsys.readouterr().err == (
        f"fastdata: error: {base / 'JPEGImages' / '2007_000039.jpg'} is 30x40 (HxW) but "
        f"{base / 'JPEGImages' / '2007_000032.jpg'} is 24x32; raw storage needs one image size. Use --resize HxW "
        "(resize='HxW'), or --resize S (resize='S') with --center-crop HxW (center_crop='HxW'), or --store encoded "
        "(store='encoded').\n")
    out = tmp_path / "voc-seg.h5"
    assert main([*command, str(out), "--store", "encoded"]) == 0  # docs/converting.md
    image, got = fastdata.open_dataset(out)[1]
    assert image.shape == (3, 30, 40) and got.shape == (30, 40)
    np.testing.assert_array_equal(got.numpy(), np.array(mask))


def test_a_missing_pycocotools_is_one_error_with_the_install_command(tmp_path: Path, monkeypatch) -> None:
    from fastdata.errors import DependencyMissingError

    info = tv_layouts.make_coco(tmp_path)
    monkeypatch.setitem(__import__("sys").modules, "pycocotools", None)
    with pytest.raises(DependencyMissingError) as caught:
        resolve_source("torchvision:CocoDetection", root=info["root"], source_options={"annFile": info["annFile"]})
    assert str(caught.value) == ("torchvision:CocoDetection needs the pycocotools package, which is not installed. "
                                 "Install it with: pip install 'torch-fastdata[coco]' or, in a checkout of fastdata, "
                                 "pip install '.[coco]'")


class NestedBoxes(torch.utils.data.Dataset):
    """(image, {"boxes", "labels"}) as a transforms-v2 user writes a detection dataset."""

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int):
        image = tv_tensors.Image(torch.full((3, 20, 30), 40 * index, dtype=torch.uint8))
        boxes = tv_tensors.BoundingBoxes(torch.tensor([[2.0, 3.0, 12.0, 15.0 - index]]), format="XYXY",
                                         canvas_size=(20, 30))
        return image, {"boxes": boxes, "labels": torch.tensor([index + 1])}


def test_preview_of_a_python_detection_dataset_in_any_structure(tmp_path: Path) -> None:
    import fastdata
    from fastdata.preview import LINE_HEIGHT, PALETTE, cell_origin, preview

    fastdata.convert(NestedBoxes(), tmp_path / "nested.npy", workers=0)
    picture = np.asarray(preview(tmp_path / "nested.npy", cell_size=60))
    strip = LINE_HEIGHT + 4
    assert picture.shape == (2 + 60 + strip + 2, 2 + 3 * 62, 3)
    for index in range(3):
        x, y = cell_origin(index, columns=3, cell_size=60, strip=strip)
        assert tuple(picture[y + 2 * (15 - index), x + 14]) == PALETTE[index + 1]  # bottom edge, scale 2
        assert tuple(picture[y + 20, x + 14]) == (40 * index,) * 3  # inside: the image, untouched


def test_cityscapes_and_coco_through_the_command_line_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """A fresh interpreter: nothing of torchvision is imported beforehand (as for a user), and
    pycocotools' progress lines do not reach stdout."""
    import fastdata

    tv_layouts.make_cityscapes(tmp_path / "city")
    info = tv_layouts.make_coco(tmp_path / "coco")
    runs = [["torchvision:Cityscapes", "--root", str(tmp_path / "city"), "--source-option",
             "target_type=semantic,instance,polygon", str(tmp_path / "city.h5"), "--resize", "12x16"],
            ["torchvision:CocoDetection", "--root", str(info["root"]), "--source-option", f"annFile={info['annFile']}",
             str(tmp_path / "coco.tar"), "--store", "encoded"]]
    for arguments in runs:
        result = run_fastdata("convert", *arguments, "--quiet", "--workers", "0", timeout=300)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("wrote ") and len(result.stdout.splitlines()) == 1, result.stdout
    image, mask, masks, labels, polygon = fastdata.open_dataset(tmp_path / "city.h5")[0]
    assert image.shape == (3, 12, 16) and mask.shape == (12, 16) and masks.shape == (5, 12, 16)
    assert masks.dtype == torch.bool and labels.tolist() == [7, 23, 24, 24, 26]
    reference = tv_datasets.Cityscapes(str(tmp_path / "city"), target_type="polygon")
    assert polygon == json.loads(Path(reference.targets[0][0]).read_text())
    assert fastdata.TarIndexedDataset(tmp_path / "coco.tar")[0]["masks"].shape == (2, 20, 28)


def test_a_voc_object_of_an_unknown_class_is_an_error_not_an_empty_sample(tmp_path: Path, capsys) -> None:
    from fastdata.cli import main

    tv_layouts.make_voc(tmp_path / "voc")
    xml = tmp_path / "voc" / "VOCdevkit" / "VOC2012" / "Annotations" / "2007_000039.xml"
    xml.write_text(xml.read_text().replace("<name>tvmonitor</name>", "<name>unicorn</name>"))
    assert main(["convert", "torchvision:VOCDetection", "--root", str(tmp_path / "voc"), str(tmp_path / "d.npy"),
                 "--quiet", "--workers", "0"]) == 1
    image = tmp_path / "voc" / "VOCdevkit" / "VOC2012" / "JPEGImages" / "2007_000039.jpg"
    assert capsys.readouterr().err.startswith(f"fastdata: error: {image}: cannot load sample (object class 'unicorn' "
                                              "is not one of VOC's 20 classes (aeroplane, bicycle, ")
    assert not (tmp_path / "d.npy").exists()
