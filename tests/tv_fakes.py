"""Roots laid out as torchvision's own test fakes lay them out, written here from scratch.

torchvision's tests build each dataset's root in ``DatasetTestCase.inject_fake_data``
(``test/test_datasets.py``, with ``test/datasets_utils.py``); those files are not in the
installed wheel. Each ``make_*`` below writes the same folders, file names and file formats
as that fake for the same config (image sizes drawn the same way: 3 to 10 pixels a side
unless the fake fixes them), so the real torchvision class reads it as it reads the fake.
Where the fake's class names are placeholders (ImageNet's devkit), the real devkit's kind of
names is written, as the docstring says. Pixels come from a seeded generator: the same root
every run.
"""

from __future__ import annotations

import itertools
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image

_RNG = np.random.default_rng(56)


def image_file(root: Path, name: str, size: int | tuple[int, ...] = 10, **save: Any) -> Path:
    """One image like ``datasets_utils.create_image_file``: ``size`` is a side, (H, W) or
    (C, H, W) with C 1 (L), 3 (RGB) or 4 (RGBA); random pixels."""
    size = (size, size) if isinstance(size, int) else tuple(size)
    channels, height, width = (3, *size) if len(size) == 2 else size
    pixels = _RNG.integers(0, 256, (height, width, channels), dtype=np.uint8)
    root.mkdir(parents=True, exist_ok=True)
    path = root / name
    Image.fromarray(pixels[..., 0] if channels == 1 else pixels).save(path, **save)
    return path


def image_folder(root: Path, name: str | Path, file_name: Callable[[int], str], count: int,
                 size: Any = None) -> list[Path]:
    """``count`` images in ``root / name`` like ``datasets_utils.create_image_folder``: RGB of
    3 to 10 pixels a side (each drawn) unless ``size`` (a size, or a function of the index) says."""
    def drawn(index: int) -> Any:
        if size is None:
            return (3, *_RNG.integers(3, 11, 2).tolist())
        return size(index) if callable(size) else size
    return [image_file(Path(root) / name, file_name(i), drawn(i)) for i in range(count)]


# --- classification datasets whose classes are not one name per index --------------------------

IMAGENET_WNIDS = {"n01440764": ("tench", "Tinca tinca"), "n01443537": ("goldfish", "Carassius auratus")}


def make_imagenet(root: Path, split: str = "train") -> dict[str, Any]:
    """``train/<wnid>/<wnid>_<i>.JPEG`` or ``val/<wnid>/...`` and ``meta.bin`` (the parsed devkit,
    ``torch.save((wnid_to_classes, val_wnids))``) as ImageNetTestCase writes them, with the real
    devkit's names: several per wnid, a tuple (the fake writes ``[1]``)."""
    import torch

    for wnid in IMAGENET_WNIDS:
        count = 3 if split == "train" else 1
        image_folder(root / split, wnid, lambda i, w=wnid: f"{w}_{i}.JPEG", count)
    torch.save((dict(IMAGENET_WNIDS), None), root / "meta.bin")
    return {"split": split}


IMAGENETTE_WNIDS = ["n01440764", "n02102040", "n02979186", "n03000684", "n03028079", "n03394916", "n03417042",
                    "n03425413", "n03445777", "n03888257"]


def make_imagenette(root: Path, split: str = "train", size: str = "full") -> dict[str, Any]:
    """``imagenette2[-320|-160]/<split>/<wnid>/<wnid>_<i>.JPEG``, three images per class."""
    folder = "imagenette2" + ("" if size == "full" else f"-{size.replace('px', '')}")
    for wnid in IMAGENETTE_WNIDS:
        image_folder(root / folder / split, wnid, lambda i, w=wnid: f"{w}_{i}.JPEG", 3)
    return {"split": split, "size": size}


PLACES_CATEGORIES = (("/a/airfield", 0), ("/a/apartment_building/outdoor", 8), ("/b/badlands", 30))
PLACES_FILES = (("Places365_val_00000001.png", 0),
                *((f"{category}/Places365_train_00000001.png", idx) for category, idx in PLACES_CATEGORIES))
PLACES_LISTS = {"train-standard": "places365_train_standard.txt", "train-challenge": "places365_train_challenge.txt",
                "val": "places365_val.txt"}
PLACES_IMAGES = {("train-standard", False): "data_large_standard", ("train-challenge", False): "data_large_challenge",
                 ("val", False): "val_large", ("train-standard", True): "data_256_standard",
                 ("train-challenge", True): "data_256_challenge", ("val", True): "val_256"}


def make_places365(root: Path, split: str = "train-standard", small: bool = False) -> dict[str, Any]:
    """``categories_places365.txt`` (three categories numbered 0, 8, 30, as the fake's), the
    split's file list, and its image folder (black images, 256 x 256 when small)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "categories_places365.txt").write_text("".join(f"{name} {idx}\n" for name, idx in PLACES_CATEGORIES))
    (root / PLACES_LISTS[split]).write_text("".join(f"{name} {idx}\n" for name, idx in PLACES_FILES))
    height, width = (256, 256) if small else (512, 520)
    for name, _ in PLACES_FILES:
        path = root / PLACES_IMAGES[(split, small)] / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((height, width, 3), np.uint8)).save(path)
    return {"split": split, "small": small}


def make_stanford_cars(root: Path, split: str = "train") -> dict[str, Any]:
    """``stanford_cars/`` with ``cars_train`` or ``cars_test`` images, the annotations ``.mat``
    (class, fname records) and ``devkit/cars_meta.mat`` whose class names are all
    ``random_name``, as the fake's: one name for three classes."""
    import scipy.io

    count = {"train": 5, "test": 7}[split]
    base = root / "stanford_cars"
    (base / "devkit").mkdir(parents=True, exist_ok=True)
    folder, annotations = (("cars_train", base / "devkit" / "cars_train_annos.mat") if split == "train"
                           else ("cars_test", base / "cars_test_annos_withlabels.mat"))
    names = [f"{i:5d}.jpg" for i in range(count)]
    image_folder(base, folder, lambda i: names[i], count)
    classes = np.array([1, 2, 3, 1, 2, 3, 1][:count], np.uint8)
    scipy.io.savemat(annotations, {"annotations": np.rec.fromarrays([classes, names], names=["class", "fname"])})
    scipy.io.savemat(base / "devkit" / "cars_meta.mat", {"class_names": ["random_name"] * 3})
    return {"split": split}


# --- array-backed datasets -------------------------------------------------------------------------


def _idx_file(path: Path, array: np.ndarray) -> None:
    """An IDX file (MNIST's format): magic (dtype code, dimensions), the sizes, big-endian data."""
    codes = {np.dtype(np.uint8): 8, np.dtype(np.int32): 12}
    header = (codes[array.dtype] * 256 + array.ndim).to_bytes(4, "big")
    header += b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + array.astype(array.dtype.newbyteorder(">")).tobytes())


def make_mnist(root: Path, name: str = "MNIST") -> dict[str, Any]:
    """``<name>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` as MNISTTestCase writes them
    (train: 2 images, test: 1), both splits (the class checks that all four files exist)."""
    raw = root / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, count in (("train", 2), ("t10k", 1)):
        _idx_file(raw / f"{prefix}-images-idx3-ubyte", _RNG.integers(0, 256, (count, 28, 28), dtype=np.uint8))
        _idx_file(raw / f"{prefix}-labels-idx1-ubyte", _RNG.integers(0, 10, count).astype(np.uint8))
    return {}


def make_qmnist(root: Path, what: str = "train") -> dict[str, Any]:
    """``QMNIST/raw/qmnist-<what>-images-idx3-ubyte`` (N, 28, 28) and ``-labels-idx2-int``, an
    (N, 8) int32 table (class, NIST writer id, ...), as QMNISTTestCase writes them."""
    count = {"nist": 3, "train": 2}.get(what, 1)
    prefix = "xnist" if what == "nist" else f"qmnist-{'test' if what.startswith('test') else what}"
    raw = root / "QMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    _idx_file(raw / f"{prefix}-images-idx3-ubyte", _RNG.integers(0, 256, (count, 28, 28), dtype=np.uint8))
    labels = _RNG.integers(0, 2**31 - 1, (count, 8)).astype(np.int32)
    labels[:, 0] = np.arange(count) % 10
    _idx_file(raw / f"{prefix}-labels-idx2-int", labels)
    return {"what": what}


def make_phototour(root: Path, name: str = "liberty") -> dict[str, Any]:
    """``<name>/patches0000.bmp ...`` (one 64 x 64 grey patch each), ``info.txt``,
    ``m50_100000_100000_0.txt`` (every pair), zipped to ``<name>.zip`` as PhotoTourTestCase does."""
    count = 5
    files = image_folder(root, name, lambda i: f"patches{i:04d}.bmp", count, size=(1, 64, 64))
    point_ids = [0, 1, 1, 3, 4]
    (root / name / "info.txt").write_text("".join(f"{point} 0\n" for point in point_ids))
    pairs = "".join(f"{a} {point_ids[a]} 0 {b} {point_ids[b]} 0\n" for a, b in itertools.combinations(range(count), 2))
    (root / name / "m50_100000_100000_0.txt").write_text(pairs)
    with zipfile.ZipFile(root / f"{name}.zip", "w") as archive:
        for file in [*files, root / name / "info.txt", root / name / "m50_100000_100000_0.txt"]:
            archive.write(file, arcname=file.relative_to(root))
    return {"name": name}


# --- stereo and optical flow: targets of the image's size, None in test splits ----------------------


def make_kitti2012_stereo(root: Path, split: str = "train") -> dict[str, Any]:
    """``Kitti2012/<split>ing/colored_0``, ``colored_1`` (RGB 200 x 100) and for train
    ``disp_noc`` (grey): the disparity is read, the valid mask is always None."""
    count = {"train": 4, "test": 3}[split]
    base = root / "Kitti2012" / f"{split}ing"
    for folder in ("colored_0", "colored_1"):
        image_folder(base, folder, lambda i: f"{i:06d}_10.png", count, size=(3, 100, 200))
    if split == "train":
        image_folder(base, "disp_noc", lambda i: f"{i:06d}.png", count, size=(1, 100, 200))
    return {"split": split}


def make_kitti2015_stereo(root: Path, split: str = "train") -> dict[str, Any]:
    """``Kitti2015/<split>ing/image_2``, ``image_3`` and for train ``disp_occ_0``, ``disp_occ_1``."""
    count = {"train": 4, "test": 6}[split]
    base = root / "Kitti2015" / f"{split}ing"
    for folder in ("image_2", "image_3"):
        image_folder(base, folder, lambda i: f"{i:06d}_10.png", count, size=(3, 100, 200))
    if split == "train":
        for folder in ("disp_occ_0", "disp_occ_1"):
            image_folder(base, folder, lambda i: f"{i:06d}.png", count, size=(1, 100, 200))
    return {"split": split}


def make_crestereo(root: Path) -> dict[str, Any]:
    """``CREStereo/<category>/<i>_left.jpg``, ``_right.jpg``, ``_left.disp.png``, ``_right.disp.png``
    (100 x 100; the disparity grey): the valid mask is always None."""
    for category, count in {"tree": 2, "shapenet": 3, "reflective": 6, "hole": 5}.items():
        for i in range(count):
            for side in ("left", "right"):
                image_file(root / "CREStereo" / category, f"{i}_{side}.jpg", (100, 100))
                image_file(root / "CREStereo" / category, f"{i}_{side}.disp.png", (1, 100, 100))
    return {}


def make_kitti_flow(root: Path, split: str = "train") -> dict[str, Any]:
    """``KittiFlow/{training,testing}/image_2/<i>_10.png, <i>_11.png`` and ``training/flow_occ``:
    every image of its own drawn size, so the flow and its valid mask follow the image's."""
    count = 2 if split == "train" else 3
    for folder in ("training", "testing"):
        for frame in ("10", "11"):
            image_folder(root / "KittiFlow" / folder, "image_2", lambda i, f=frame: f"{i}_{f}.png", count)
    image_folder(root / "KittiFlow" / "training", "flow_occ", lambda i: f"{i}_10.png", count)
    return {"split": split}


def make_hd1k(root: Path, split: str = "train") -> dict[str, Any]:
    """``hd1k/hd1k_input/image_2``, ``hd1k_flow_gt/flow_occ`` (``<seq>_<i>.png``) and
    ``hd1k_challenge/image_2`` (``<seq>_10.png``, ``<seq>_11.png``)."""
    for seq in range(4 if split == "train" else 3):
        image_folder(root / "hd1k" / "hd1k_input", "image_2", lambda i: f"{seq:06d}_{i}.png", 3)
        image_folder(root / "hd1k" / "hd1k_flow_gt", "flow_occ", lambda i: f"{seq:06d}_{i}.png", 3)
        for frame in ("10", "11"):
            image_folder(root / "hd1k" / "hd1k_challenge", "image_2", lambda i, f=frame: f"{seq:06d}_{f}.png", 1)
    return {"split": split}


def make_sbd(root: Path) -> dict[str, Any]:
    """``img/2008_<i>.jpg``, ``cls/2008_<i>.mat`` (``GTcls``: 20 sparse ``Boundaries``, a
    ``Segmentation``) of 1 to 3 pixels a side, each image its own size, and the split files."""
    import scipy.io
    import scipy.sparse

    splits = {"train": (0, 1, 2), "train_noval": (0, 2), "val": (3,)}
    root.mkdir(parents=True, exist_ok=True)
    for split, indices in splits.items():
        (root / f"{split}.txt").write_text("".join(f"2008_{i:06d}\n" for i in indices))
    (root / "cls").mkdir(parents=True, exist_ok=True)
    sizes = [(1, 3), (3, 2), (2, 2), (3, 1)]
    for index, (height, width) in enumerate(sizes):
        boundaries = [[scipy.sparse.csc_matrix(_RNG.integers(0, 2, (height, width), dtype=np.uint8))]
                      for _ in range(20)]
        segmentation = _RNG.integers(0, 21, (height, width), dtype=np.uint8)
        scipy.io.savemat(root / "cls" / f"2008_{index:06d}.mat",
                         {"GTcls": {"Boundaries": boundaries, "Segmentation": segmentation}})
        image_file(root / "img", f"2008_{index:06d}.jpg", (3, height, width))
    return {}


def make_voc_segmentation(root: Path, year: str = "2012") -> dict[str, Any]:
    """``VOCdevkit/VOC<year>`` with ``JPEGImages`` and ``SegmentationClass`` of independently
    drawn sizes (a mask need not have its image's size) and the image-set files."""
    base = root / ("TrainVal" if year == "2011" else "") / "VOCdevkit" / f"VOC{year}"
    sets = {"train": (0, 1, 2), "val": (3, 4)}
    sets["trainval"] = sets["train"] + sets["val"]
    for kind in ("Main", "Segmentation"):
        (base / "ImageSets" / kind).mkdir(parents=True, exist_ok=True)
        for name, indices in sets.items():
            (base / "ImageSets" / kind / f"{name}.txt").write_text("".join(f"{i:06d}\n" for i in indices))
    image_folder(base, "JPEGImages", lambda i: f"{i:06d}.jpg", 5)
    image_folder(base, "SegmentationClass", lambda i: f"{i:06d}.png", 5)
    return {"year": year}


def make_cityscapes(root: Path, mode: str = "fine", split: str = "train") -> dict[str, Any]:
    """``gt{Fine,Coarse}/<split>/<city>/<city>_000000_000000_gt<Mode>_{instanceIds,labelIds}.png``
    (RGB, 10 x 10: the fake's ids are colour images), ``..._color.png`` (RGBA) and
    ``..._polygons.json``, and ``leftImg8bit/<split>/<city>/..._leftImg8bit.png`` (drawn sizes);
    two cities for train, one otherwise, as CityScapesTestCase writes them."""
    import json

    cities = ["bochum", "bremen"] if split == "train" else ["bochum"]
    polygons = {"imgHeight": 1024, "imgWidth": 2048, "objects": [
        {"label": "sky", "polygon": [[1241, 0], [1234, 156], [1478, 197], [1611, 172], [1606, 0]]}]}
    for gt, splits in (("Coarse", ("train", "train_extra", "val")), ("Fine", ("train", "test", "val"))):
        for folder in splits:
            for city in cities:
                base = root / f"gt{gt}" / folder / city
                image_file(base, f"{city}_000000_000000_gt{gt}_instanceIds.png")
                image_file(base, f"{city}_000000_000000_gt{gt}_labelIds.png")
                image_file(base, f"{city}_000000_000000_gt{gt}_color.png", (4, 10, 10))
                (base / f"{city}_000000_000000_gt{gt}_polygons.json").write_text(json.dumps(polygons))
    for folder in ("test", "train_extra", "train", "val"):
        for city in cities:
            image_folder(root / "leftImg8bit" / folder, city, lambda i, c=city: f"{c}_000000_000000_leftImg8bit.png", 1)
    return {"mode": mode, "split": split}


def make_inaturalist(root: Path, version: str = "2021_train") -> dict[str, Any]:
    """``<version>/<id>_<kingdom>_<phylum>_..._<species>/image_000<i>.jpg``, three per category."""
    for category in ("00000_Akingdom_0phylum_Aclass_Aorder_Afamily_Agenus_Aspecies",
                     "00001_Akingdom_1phylum_Aclass_Border_Afamily_Bgenus_Aspecies",
                     "00002_Akingdom_2phylum_Cclass_Corder_Cfamily_Cgenus_Cspecies"):
        image_folder(root / version, category, lambda i: f"image_{i + 1:04d}.jpg", 3)
    return {"version": version}
