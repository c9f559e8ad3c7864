"""torchvision datasets whose target is not one class index, as sources of named-field records.

Each sample is a record (``{"image": ..., "mask": ...}``) whose values are what torchvision's
own ``wrap_dataset_for_transforms_v2`` gives for the dataset, so what is read back is what a
``transforms.v2`` user expects: detection boxes as ``tv_tensors.BoundingBoxes`` in XYXY with
their canvas size, ``labels`` as int64 tensors, instance masks as ``tv_tensors.Mask``. Where
the wrapper gives a mask that was a PIL image (VOC, SBD, Oxford pets, Cityscapes semantic) the
PIL image itself is kept with the kind hint ``"mask"``, so its palette survives; its pixels are
the wrapper's ``Mask``. The original annotation is kept beside the boxes as JSON
(VOC's parsed XML, COCO's annotation list), so nothing the dataset had is lost.

One :class:`RecordSpec` per dataset class (the table :data:`RECORDS`) says how its item becomes
a record, which layout readers give back ("tuple" where torchvision returns a flat tuple,
"dict" where the target is a dict) and the kind hints of its fields.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image

from fastdata.sources import fingerprint
from fastdata.sources.base import Protected
from fastdata.fields import CLASS_IDS
from fastdata.images import ReadOptions, check_pixels, exif_transpose
from fastdata.sources.base import Source, class_names

Record = dict[str, Any]

# The ids ``wrap_dataset_for_transforms_v2(VOCDetection)`` gives its ``labels``: index in this list,
# 0 the background no object has (torchvision's own table, which it keeps private; a test checks
# that the wrapper still numbers the classes so).
VOC_DETECTION_CATEGORIES = (
    "__background__", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)


@dataclass(frozen=True)
class RecordSpec:
    """How one torchvision dataset class gives records.

    ``record(source, index)`` builds the record of one sample; ``layout`` is how readers give it
    back; ``kinds`` the kind hints of its fields; ``files`` the constructor arguments
    naming files the source reads besides ``root`` (``annFile``); ``class_ids`` the fields
    whose integers index the dataset's classes (beside a ``label`` field, which always does)."""

    record: Callable[["TorchvisionRecordSource", int], Record]
    layout: str = "tuple"
    kinds: dict[str, str] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    target_keys: Any = None  # what wrap_dataset_for_transforms_v2 is asked for (None: no wrapper)
    class_ids: tuple[str, ...] = ()
    targets: Callable[[Any], list[str]] | None = None
    """For a dataset whose target is a tuple when several target types are asked (pets, CelebA):
    the names of the record's target fields, in order, so readers give ``(image, (a, b))`` back as
    torchvision does (``(image, a)`` for one type)."""

    def structure(self, dataset: Any) -> Any:
        """The nesting readers give back, where it is not the record's flat order."""
        names = self.targets(dataset) if self.targets is not None else []
        return ["image", names] if len(names) > 1 else None


def _tv() -> Any:
    # torchvision is imported where a record is built, never at import time: fastdata's CLI and
    # `import fastdata` stay light, and this module is only used with torchvision installed
    import torchvision
    import torchvision.datasets  # noqa: F401 - the submodules the records use, loaded with it
    import torchvision.transforms.v2.functional  # noqa: F401
    import torchvision.tv_tensors  # noqa: F401

    return torchvision


def _empty_boxes(height: int, width: int, dtype: Any) -> Any:
    import torch

    tv_tensors = _tv().tv_tensors
    return tv_tensors.BoundingBoxes(torch.zeros((0, 4), dtype=dtype), format="XYXY", canvas_size=(height, width))


def _labels_tensor(values: list[int]) -> Any:
    import torch

    return torch.tensor(values, dtype=torch.int64)


# --- one record function per dataset ---------------------------------------------------------


def _segmentation(source: "TorchvisionRecordSource", index: int) -> Record:
    """VOCSegmentation, SBD (mode="segmentation"): the image and its class-id mask (the PIL
    image, palette kept; its pixels are those of the wrapper's ``Mask``)."""
    image, mask = source.dataset[index]
    return {"image": image, "mask": mask}


def _sbd(source: "TorchvisionRecordSource", index: int) -> Record:
    if source.dataset.mode == "segmentation":
        return _segmentation(source, index)
    image, boundaries = source.dataset[index]  # (20, H, W) uint8: no transforms.v2 type for it
    return {"image": image, "boundaries": np.ascontiguousarray(boundaries)}


def _voc_detection(source: "TorchvisionRecordSource", index: int) -> Record:
    try:
        image, target = source.wrapped[index]
    except KeyError as exc:  # no <object> (the wrapper cannot batch an empty list), or a class VOC lacks
        import torch

        image, target = source.raw[index]
        if target["annotation"].get("object"):
            raise ValueError(f"object class {exc.args[0]!r} is not one of VOC's {len(VOC_DETECTION_CATEGORIES) - 1} "
                             f"classes ({', '.join(VOC_DETECTION_CATEGORIES[1:])})") from exc
        target = dict(target, boxes=_empty_boxes(image.height, image.width, torch.int64), labels=_labels_tensor([]))
    return {"image": image, "boxes": target["boxes"], "labels": target["labels"], "annotation": target["annotation"]}


def _coco_detection(source: "TorchvisionRecordSource", index: int) -> Record:
    import torch

    tv_tensors = _tv().tv_tensors
    with warnings.catch_warnings():  # pycocotools' RLE decoder under numpy 2; its masks are right
        warnings.filterwarnings("ignore", "__array__ implementation doesn't accept a copy keyword", DeprecationWarning)
        image, target = source.wrapped[index]
    coco = source.dataset.coco
    annotations = coco.loadAnns(coco.getAnnIds(source.dataset.ids[index]))
    if "boxes" not in target:  # an image without annotations: empty fields, not missing ones
        height, width = image.height, image.width
        return {"image": image, "image_id": int(target["image_id"]),
                "boxes": _empty_boxes(height, width, torch.float32), "labels": _labels_tensor([]),
                "masks": tv_tensors.Mask(torch.zeros((0, height, width), dtype=torch.uint8)),
                "annotations": annotations}
    boxes = target["boxes"]
    if boxes.dtype != torch.float32:  # COCO's boxes are floats; a file written with whole numbers too
        boxes = tv_tensors.wrap(boxes.to(torch.float32), like=boxes)
    return {"image": image, "image_id": int(target["image_id"]), "boxes": boxes,
            "labels": target["labels"].to(torch.int64), "masks": target["masks"], "annotations": annotations}


def _captions(source: "TorchvisionRecordSource", index: int) -> Record:
    """Flickr8k, Flickr30k, CocoCaptions: the image and its list of captions."""
    image, captions = source.dataset[index]
    return {"image": image, "captions": [str(caption) for caption in captions]}


_PET_NAMES = {"category": "label", "binary-category": "binary_label", "segmentation": "mask"}


def _pet_targets(dataset: Any) -> list[str]:
    return [_PET_NAMES[kind] for kind in dataset._target_types]


def _celeba_targets(dataset: Any) -> list[str]:
    return list(dataset.target_type)


def _pet(source: "TorchvisionRecordSource", index: int) -> Record:
    image, target = source.dataset[index]
    types = source.dataset._target_types
    if not types:  # no target types: torchvision gives (image, None)
        return {"image": image, "target": None}
    values = list(target) if len(types) > 1 else [target]
    return {"image": image, **{_PET_NAMES[kind]: value for kind, value in zip(types, values)}}


def _celeba(source: "TorchvisionRecordSource", index: int) -> Record:
    """CelebA: ``attr`` (40,) and ``landmarks`` (10,) int64 as the dataset gives them,
    ``identity`` an int, ``bbox`` converted to XYXY ``BoundingBoxes`` as the wrapper does (the
    boxes are those of the uncropped images, so they may fall outside the aligned ones:
    kept as they are, see torchvision's CelebA docs)."""
    F = _tv().transforms.v2.functional
    tv_tensors = _tv().tv_tensors
    image, target = source.dataset[index]
    types = source.dataset.target_type
    if not types:  # no target types: torchvision gives (image, None)
        return {"image": image, "target": None}
    values = list(target) if len(types) > 1 else [target]
    record: Record = {"image": image}
    for kind, value in zip(types, values):
        if kind == "bbox":
            value = F.convert_bounding_box_format(
                tv_tensors.BoundingBoxes(value, format="XYWH", canvas_size=(image.height, image.width)),
                new_format="XYXY")
        elif kind == "identity":
            value = int(value)
        record[kind] = value
    return record


_CITYSCAPES_NAMES = {"semantic": "mask", "color": "color", "polygon": "polygon"}
_ID_MODES = ("I;16", "I;16B", "I;16L", "I", "L")  # the instance-id images the wrapper reads


def _cityscapes(source: "TorchvisionRecordSource", index: int) -> Record:
    """Cityscapes: ``semantic`` as a class-id mask, ``instance`` as the wrapper's ``masks``
    (one boolean mask per instance id, (K, H, W) as COCO's, where the wrapper gives (K, 1, H, W))
    and ``labels`` (the class of each: id // 1000 for ids >= 1000), ``color`` as an RGBA image,
    ``polygon`` as JSON."""
    import torch

    image, target = source.dataset[index]
    types = source.dataset.target_type
    values = list(target) if len(types) > 1 else [target]
    record: Record = {"image": image}
    for kind, value in zip(types, values):
        if kind == "instance" and value.mode not in _ID_MODES:  # no instance ids (a colour image): kept as it is
            record["instance"] = value
        elif kind == "instance":
            wrapped = source.instance_wrapper(value)
            masks = wrapped["masks"]  # (K, 1, H, W): the wrapper stacks (1, H, W) masks; (K, H, W) like COCO's
            record["masks"] = _tv().tv_tensors.wrap(masks.reshape(masks.shape[0], *masks.shape[-2:]), like=masks)
            record["labels"] = wrapped["labels"].to(torch.int64).reshape(-1)
        else:
            record[_CITYSCAPES_NAMES[kind]] = value
    return record


RECORDS: dict[str, RecordSpec] = {
    "VOCSegmentation": RecordSpec(_segmentation, kinds={"mask": "mask"}),
    "SBDataset": RecordSpec(_sbd, kinds={"mask": "mask"}),
    "VOCDetection": RecordSpec(_voc_detection, layout="dict", kinds={"annotation": "json"},
                               target_keys={"annotation", "boxes", "labels"}, class_ids=("labels",)),
    "CocoDetection": RecordSpec(_coco_detection, layout="dict", kinds={"annotations": "json", "masks": "array:ragged"},
                                files=("annFile",), target_keys={"image_id", "boxes", "labels", "masks"}),
    "CocoCaptions": RecordSpec(_captions, kinds={"captions": "text_list"}, files=("annFile",)),
    "Flickr8k": RecordSpec(_captions, kinds={"captions": "text_list"}, files=("ann_file",)),
    "Flickr30k": RecordSpec(_captions, kinds={"captions": "text_list"}, files=("ann_file",)),
    "OxfordIIITPet": RecordSpec(_pet, kinds={"mask": "mask"}, targets=_pet_targets),
    "CelebA": RecordSpec(_celeba, targets=_celeba_targets),
    "Cityscapes": RecordSpec(_cityscapes, kinds={"mask": "mask", "polygon": "json", "masks": "array:ragged"}),
}


# --- datasets wrapped by wrap_dataset_for_transforms_v2 in Python ---------------------------

# class -> the target keys its detection wrapper gives, in the wrapper's order, and its default ones
_WRAPPER_KEYS = {
    "CocoDetection": (("image_id", "boxes", "masks", "labels", "segmentation", "area", "iscrowd", "bbox",
                       "category_id"), frozenset({"image_id", "boxes", "labels"})),
    "VOCDetection": (("annotation", "boxes", "labels"), frozenset({"boxes", "labels"})),
}


def wrapped_detection(dataset: Any) -> str | None:
    """The class (``CocoDetection``, ``VOCDetection``) of the detection dataset that torchvision's
    ``wrap_dataset_for_transforms_v2`` wrapped into ``dataset``, or None."""
    if not any(cls.__name__ == "VisionDatasetTVTensorWrapper" for cls in type(dataset).__mro__):
        return None
    inner = getattr(dataset, "_dataset", None)
    return next((cls.__name__ for cls in type(inner).__mro__ if cls.__name__ in _WRAPPER_KEYS), None)


def wrapped_target_keys(dataset: Any) -> list[str]:
    """The target keys ``dataset`` (a :func:`wrapped_detection` one) was asked for, in the wrapper's order."""
    available, default = _WRAPPER_KEYS[wrapped_detection(dataset)]
    try:
        given = object.__getattribute__(dataset, "_target_keys")
    except AttributeError:
        given = None
    wanted = default if given is None else set(available) if given == "all" else set(given)
    return [key for key in available if key in wanted]


def wrapped_item(dataset: Any, index: int) -> tuple[Any, dict[str, Any]]:
    """Item ``index`` of a :func:`wrapped_detection` dataset, as the wrapper gives it for an image
    with objects; for one without, which the wrapper gives without the keys asked for (COCO: only
    ``image_id``) or fails on (VOC: ``KeyError``), every key asked for with its empty value: zero
    boxes (XYXY, the image's canvas), labels and (K, H, W) masks, empty lists of COCO's own keys."""
    import torch

    name = wrapped_detection(dataset)
    try:
        with warnings.catch_warnings():  # pycocotools' RLE decoder under numpy 2; its masks are right
            warnings.filterwarnings("ignore", "__array__ implementation doesn't accept a copy keyword", DeprecationWarning)
            image, target = dataset[index]
    except KeyError:
        image, target = dataset._dataset[index]  # VOC: the raw sample (the wrapper turned its transforms off)
        if target.get("annotation", {}).get("object"):
            raise  # objects of a class VOC lacks: the wrapper's own error
    keys = wrapped_target_keys(dataset)
    if all(key in target for key in keys):
        return image, target
    height, width = image.height, image.width
    empty = {"boxes": _empty_boxes(height, width, torch.float32 if name == "CocoDetection" else torch.int64),
             "labels": _labels_tensor([]),
             "masks": _tv().tv_tensors.Mask(torch.zeros((0, height, width), dtype=torch.uint8))}
    return image, {key: target[key] if key in target else empty.get(key, []) for key in keys}


class TorchvisionRecordSource(Source):
    """A torchvision dataset of :data:`RECORDS` as a source of named-field records.

    :meth:`load_record` gives one sample's record; :meth:`load` gives its image and its
    ``label`` field where it has an integer one, else -1, for code that knows only the classic
    pair. The dataset's transforms-v2 wrapper is made where it is first needed, in each
    process, and is never pickled."""

    def __init__(self, dataset: Any, *, name: str, description: dict[str, Any], options: dict[str, Any]):
        self.dataset = dataset
        self.name = name
        self.record_type = type(dataset).__name__
        self.keys = [str(i) for i in range(len(dataset))]
        self.labels = None
        self.classes, self.class_to_idx = _class_names(dataset)
        self.layout = self.spec.layout
        self.structure = self.spec.structure(dataset)
        self.kinds = dict(self.spec.kinds)
        self.field_meta = {name: {CLASS_IDS: True} for name in self.spec.class_ids} if self.class_to_idx else {}
        self.options = dict(options)
        self._description = description
        self._wrapped: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_wrapped"] = None
        return state

    # --- what the record functions use ---------------------------------------------------

    @property
    def spec(self) -> RecordSpec:
        return RECORDS[self.record_type]

    @property
    def raw(self) -> Any:
        return self.dataset

    @property
    def wrapped(self) -> Any:
        """``wrap_dataset_for_transforms_v2(dataset, target_keys)``, made once per process."""
        if self._wrapped is None:
            wrap = _tv().datasets.wrap_dataset_for_transforms_v2
            self._wrapped = wrap(self.dataset, target_keys=self.spec.target_keys)
        return self._wrapped

    def instance_wrapper(self, mask: Image.Image) -> dict[str, Any]:
        """Cityscapes' instance-id image as ``wrap_dataset_for_transforms_v2`` gives it: ``masks``
        (one boolean ``tv_tensors.Mask`` per id, (K, 1, H, W)) and ``labels`` (id // 1000 for ids
        >= 1000, cityscapesScripts' convention). Built here with public ``tv_tensors``: the public
        wrapper refuses a dataset whose ``target_type`` has ``polygon`` or ``color``, fails on the
        16-bit instance PNGs Pillow opens as ``I;16`` (torch cannot compare uint16), and its
        per-type code is private. tests/test_tv_fields.py checks every mask and label exactly."""
        import torch

        if mask.mode == "I;16":  # Pillow opens the 16-bit PNGs so; torch cannot compare uint16
            mask = mask.convert("I")
        data = _tv().tv_tensors.Mask(torch.from_numpy(np.array(mask))[None])  # (1, H, W), as the wrapper's
        ids = data.unique()
        if not len(ids):
            return {"masks": _tv().tv_tensors.Mask(torch.zeros((0, *data.shape), dtype=torch.bool)),
                    "labels": torch.zeros(0, dtype=torch.int64)}
        masks = _tv().tv_tensors.Mask(torch.stack([data.as_subclass(torch.Tensor) == i for i in ids]))
        labels = torch.where(ids >= 1000, ids // 1000, ids)
        return {"masks": masks, "labels": labels}

    # --- the Source protocol -------------------------------------------------------------

    def sample_name(self, index: int) -> str:
        path = _image_path(self.dataset, index)
        return path if path is not None else f"sample {index}"

    def describe(self) -> dict[str, Any]:
        described = dict(self._description, length=len(self.keys))
        categories = categories_of(self.dataset)
        if categories:
            described["categories"] = categories
        return described

    def fingerprint(self) -> dict[str, Any]:
        return fingerprint.of_items(len(self), self._item_digest)

    def _item_digest(self, index: int) -> bytes:
        try:
            record = self.load_record(index)
        except Exception as exc:  # noqa: BLE001 - a bad item is part of what the source is
            return f"error {type(exc).__name__}: {exc}".encode()
        return b"".join(_value_digest(name, value) for name, value in record.items())

    def protected(self) -> list[Protected]:
        found = []
        root = getattr(self.dataset, "root", None)
        if isinstance(root, (str, os.PathLike)) and str(root) and Path(root).exists():
            found.append(Protected(Path(root), "dataset root folder", inside_ok=True))
        for option in self.spec.files:
            path = self.options.get(option)
            if isinstance(path, (str, os.PathLike)) and Path(path).is_file():
                found.append(Protected(Path(path), f"annotation file ({option})"))
        return found

    def load_record(self, index: int, read: ReadOptions | None = None) -> Record:
        read = read or ReadOptions()
        record = self.spec.record(self, index)
        for value in record.values():
            if isinstance(value, Image.Image):
                value.load()  # torchvision opens lazily: read now, and the file is closed
        image = record["image"]
        check_pixels(image, read.max_pixels)
        if read.exif_transpose:
            record["image"] = exif_transpose(image)
        return record

    def load(self, index: int, read: ReadOptions | None = None) -> tuple[Image.Image, int]:
        record = self.load_record(index, read)
        label = record.get("label", -1)
        return record["image"], label if isinstance(label, int) else -1


def _value_digest(name: str, value: Any) -> bytes:
    """Bytes that change when a field's value does (for the fingerprint)."""
    head = name.encode() + b"\0"
    if isinstance(value, Image.Image):
        return head + f"{value.mode} {value.size}\n".encode() + value.tobytes()
    if hasattr(value, "numpy"):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        return head + f"{value.dtype} {value.shape}\n".encode() + np.ascontiguousarray(value).tobytes()
    return head + json.dumps(value, sort_keys=True, default=str).encode() + b"\n"


def _image_path(dataset: Any, index: int) -> str | None:
    """The image file of sample ``index`` where the dataset lists its files (error messages)."""
    for attribute in ("images", "_images", "filename"):
        paths = getattr(dataset, attribute, None)
        if isinstance(paths, list) and index < len(paths):
            return str(paths[index])
    ids = getattr(dataset, "ids", None)
    if isinstance(ids, list) and index < len(ids) and isinstance(ids[index], str):
        return ids[index]
    return None


def categories_of(dataset: Any) -> dict[str, str]:
    """COCO's category names by id (as text, for JSON), which its ``labels`` hold; else empty."""
    if type(dataset).__name__ != "CocoDetection":
        return {}
    return {str(key): str(category["name"]) for key, category in sorted(dataset.coco.cats.items())}


def _class_names(dataset: Any) -> tuple[list[Any] | None, dict[str, int]]:
    """The classes and class names by the ids the records' labels hold: the dataset's own
    (:func:`~fastdata.sources.base.class_names`), none for COCO, the VOC detection classes the
    wrapper numbers its labels by."""
    name = type(dataset).__name__
    if name == "CocoDetection":  # ids with gaps (1..90): kept as the source's "categories", not as classes
        return None, {}
    if name == "VOCDetection":
        return None, {category: index for index, category in enumerate(VOC_DETECTION_CATEGORIES)}
    if not isinstance(getattr(dataset, "class_to_idx", None), dict):
        return None, {}
    return class_names(dataset)
