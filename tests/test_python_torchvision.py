"""torchvision datasets given to ``fastdata.convert`` from Python, as docs/fields.md shows them:
COCO and VOC detection wrapped by ``wrap_dataset_for_transforms_v2`` (images without objects
included), VOC segmentation's palette masks kept as class ids, nested targets kept nested."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.datasets as tv_datasets
from PIL import Image
from torchvision import tv_tensors
from torchvision.datasets import wrap_dataset_for_transforms_v2 as wrap

import fastdata
import tv_layouts
from fastdata.fields import FieldError
from fastdata.formats.tar import TarIndexedDataset


def reader(path: Path, **options):
    return TarIndexedDataset(path, **options) if path.suffix == ".tar" else fastdata.open_dataset(path, **options)


@pytest.fixture(scope="module")
def coco_layout(tmp_path_factory) -> dict:
    return tv_layouts.make_coco(tmp_path_factory.mktemp("coco"))


@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")
@pytest.mark.parametrize("keys", [("boxes", "labels"), ("image_id", "boxes", "labels", "masks", "area")])
def test_the_docs_coco_example_converts_images_without_annotations(coco_layout, tmp_path: Path, keys) -> None:
    coco = wrap(tv_datasets.CocoDetection(coco_layout["root"], coco_layout["annFile"]), target_keys=keys)
    assert set(coco[1][1]) == {"image_id"}  # the wrapper leaves an image without annotations without its keys
    out = tmp_path / "coco.tar"
    fastdata.convert(coco, out, store="encoded", workers=0)  # docs/fields.md, "Detection"
    ds = TarIndexedDataset(out)
    for index in (0, 2, 3):
        image, target = ds[index]
        expected_image, expected = coco[index]
        assert list(target) == [key for key in ("image_id", "boxes", "masks", "labels", "area") if key in keys]
        for key in keys:
            if isinstance(expected[key], torch.Tensor):
                assert type(target[key]) is type(expected[key]) and torch.equal(target[key], expected[key])
            else:
                assert target[key] == expected[key]
        assert target["boxes"].canvas_size == expected["boxes"].canvas_size
    image, target = ds[1]
    assert image.shape == (3, 24, 24) and target["boxes"].shape == (0, 4) and target["boxes"].dtype == torch.float32
    assert target["boxes"].canvas_size == (24, 24) and target["labels"].tolist() == []
    if "masks" in keys:
        assert target["masks"].shape == (0, 24, 24) and target["image_id"] == 87038 and target["area"] == []
    batch = next(iter(fastdata.loader(ds, batch_size=4)))
    assert [len(boxes) for boxes in batch[1]["boxes"]] == [2, 0, 1, 2]
    assert fastdata.verify(out, deep=True).ok


def test_wrapped_voc_detection_converts_an_image_without_objects(tmp_path: Path) -> None:
    tv_layouts.make_voc(tmp_path / "voc")
    voc = wrap(tv_datasets.VOCDetection(str(tmp_path / "voc"), year="2012", image_set="val"))
    with pytest.raises(KeyError):
        voc[1]  # 2011_000003 has no <object>: the wrapper fails on it
    out = tmp_path / "voc.npy"
    fastdata.convert(voc, out, workers=0)
    image, target = fastdata.open_dataset(out)[1]
    assert target["boxes"].shape == (0, 4) and target["boxes"].dtype == torch.int64 and target["labels"].tolist() == []
    image, target = fastdata.open_dataset(out)[0]
    assert torch.equal(target["boxes"], voc[0][1]["boxes"]) and torch.equal(target["labels"], voc[0][1]["labels"])


@pytest.mark.parametrize("store", ["raw", "encoded"])
def test_voc_segmentation_from_python_keeps_the_class_ids(tmp_path: Path, store: str) -> None:
    tv_layouts.make_voc(tmp_path / "voc")
    voc = tv_datasets.VOCSegmentation(str(tmp_path / "voc"), year="2012", image_set="train")
    out = tmp_path / "seg.npy"
    fastdata.convert(voc, out, store=store, workers=0)  # as the CLI's torchvision:VOCSegmentation
    for index in range(len(voc)):
        expected_image, expected_mask = voc[index]
        image, mask = fastdata.open_dataset(out)[index]
        assert type(mask) is tv_tensors.Mask and mask.dtype == torch.uint8
        np.testing.assert_array_equal(mask.numpy(), np.array(expected_mask))  # ids (0, 15, 255, ...), not colours
        _, pil_mask = fastdata.open_dataset(out, image_format="pil")[index]
        assert pil_mask.mode == "P" and pil_mask.getpalette() == expected_mask.getpalette()
        assert pil_mask.tobytes() == expected_mask.tobytes()
    assert set(np.unique(fastdata.open_dataset(out)[0][1].numpy())) == {0, 1, 15, 255}


def test_pets_from_python_keep_their_nested_target(tmp_path: Path) -> None:
    tv_layouts.make_pets(tmp_path / "pets")
    pets = tv_datasets.OxfordIIITPet(str(tmp_path / "pets"), target_types=["category", "segmentation"])
    out = tmp_path / "pets.h5"
    fastdata.convert(pets, out, workers=0)
    image, (label, trimap) = fastdata.open_dataset(out)[2]
    expected_image, (expected_label, expected_trimap) = pets[2]
    np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), np.array(expected_image))
    assert label == expected_label == 1 and type(label) is int
    np.testing.assert_array_equal(trimap.numpy()[0], np.array(expected_trimap))  # an L image: kept as an image


class FirstWithoutTarget:
    """A dataset whose first item looks like (image, label) and whose others hold a target dict."""

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int):
        image = Image.fromarray(np.zeros((4, 4, 3), np.uint8))
        return (image, 7) if index == 0 else (image, {"boxes": np.zeros((index, 4), np.float32)})


def test_an_item_unlike_the_first_pair_says_so_without_advising_skip_bad(tmp_path: Path) -> None:
    with pytest.raises(FieldError) as caught:
        fastdata.convert(FirstWithoutTarget(), tmp_path / "x.npy", workers=0)
    assert str(caught.value) == (
        "sample 1: is an (image, dict) pair, but the first readable sample is an (image, int label) pair, so the samples "
        "were taken for (image, label) pairs. Give every sample the same fields: one without annotations still has "
        "every key (None, or an empty array, for an empty field).")
    assert not (tmp_path / "x.npy").exists()
