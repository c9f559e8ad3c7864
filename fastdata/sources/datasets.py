"""Map-style datasets as conversion sources: any dataset of ``(image, label)``
(:class:`DatasetSource`), array-backed ones read without PIL (:class:`ArraySource`: MNIST family,
CIFAR), and datasets written by ``fastdata convert`` (:class:`FastdataSource`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fastdata.sources import fingerprint
from fastdata.errors import EmptySourceError, InvalidOptionError
from fastdata.images import ReadOptions, check_pixels, exif_transpose, to_pil
from fastdata.sources.base import Protected, class_names
from fastdata.fields import FieldError, Schema
from fastdata.fields.values import check_value, digest_value, flatten, flatten_as, kind_of
from fastdata.sources.base import Source
from fastdata.sources.torchvision_targets import wrapped_detection, wrapped_item, wrapped_target_keys


class DatasetSource(Source):
    """Any map-style dataset: items ``(image, label)`` (the classic sample), or records of named
    fields (:mod:`fastdata.fields`): a tuple, a dict, a tuple holding a dict (torchvision's
    ``wrap_dataset_for_transforms_v2``), of PIL images, ``tv_tensors``, arrays, numbers, text,
    JSON data and bytes. ``names`` names a tuple's positions; ``kinds`` hints kinds."""

    def __init__(self, dataset: Any, description: dict[str, Any] | None = None, *,
                 names: list[str] | None = None, kinds: dict[str, str] | None = None):
        self.dataset = dataset
        self.names = list(names) if names else getattr(dataset, "fastdata_names", None)
        self.kinds = dict(kinds or getattr(dataset, "fastdata_kinds", None) or {})
        self.keys = [str(i) for i in range(len(dataset))]
        self.labels = None
        self.classes, self.class_to_idx = class_names(dataset)
        self._description = description or {
            "type": "dataset",
            "class": f"{type(dataset).__module__}.{type(dataset).__qualname__}",
        }

    def describe(self) -> dict[str, Any]:
        return dict(self._description, length=len(self.keys))

    def fingerprint(self) -> dict[str, Any]:
        return fingerprint.of_items(len(self), self._item_digest)

    def _item_digest(self, index: int) -> bytes:
        try:
            if self.record_schema() is None:
                image, label = self.load(index)
            else:
                return self._record_digest(index)
        except Exception as exc:  # noqa: BLE001 - a bad item is part of what the source is
            return f"error {type(exc).__name__}: {exc}".encode()
        return f"{image.mode} {image.size} {label}\n".encode() + image.tobytes()

    def _record_digest(self, index: int) -> bytes:
        values = self.load_record(index)
        parts = []
        for name, value in values.items():
            made = kind_of(name, value, self.kinds.get(name), self.sample_name(index), None)
            if made is None:
                parts.append(f"{name} None\n".encode())
                continue
            checked = check_value(made, value, self.sample_name(index))
            parts.append(f"{name} {made.kind} {made.dtype} {made.shape}\n".encode() + digest_value(made, checked))
        return b"".join(parts)

    def item(self, index: int) -> Any:
        """The dataset's item ``index``, as this source takes it."""
        return self.dataset[index]

    def record_schema(self) -> Any:
        """None when items are the classic ``(image, label)``; else the flattened item's layout
        (decided by the first item, once)."""
        if not hasattr(self, "_classic"):
            item = None
            for index in range(min(len(self), 8)):  # the first item that loads decides
                try:
                    item = self.item(index)
                    break
                except Exception:  # noqa: BLE001 - a bad item is reported where samples are loaded
                    continue
            if item is None:
                self._classic = True  # the classic path names the bad samples (and --skip-bad skips them)
                return None
            values, layout, structure = flatten(item, self.names)
            for value in values.values():
                if isinstance(value, Image.Image) and value.width * value.height <= (ReadOptions().max_pixels or 0):
                    value.load()  # torchvision opens images lazily: read, so their files are closed
            self._classic = _classic_pair(values, layout)
            self.layout, self.structure = layout, structure
            first_name, first = next(iter(values.items()), (None, None))
            if layout == "tuple" and first_name not in self.kinds and str(getattr(first, "dtype", "")) in (
                    "uint8", "torch.uint8") and getattr(first, "ndim", 0) in (2, 3) and \
                    not type(first).__module__.startswith("torchvision"):
                self.kinds[first_name] = "image"  # a tuple's first uint8 array is its image, as in torchvision
        return None if self._classic else (self.layout, self.structure)

    @property
    def is_classic(self) -> bool:
        if type(self).load_record is not DatasetSource.load_record:  # a subclass that makes records itself
            return False
        return self.record_schema() is None

    def load_record(self, index: int, read: ReadOptions | None = None) -> dict[str, Any]:
        read = read or ReadOptions()
        values, layout, structure = flatten(self.item(index), self.names)
        if _classic_pair(values, layout) and self.record_schema() is None:
            image, label = self.load(index, read)
            return {"image": image, "label": label}
        for name, value in values.items():
            if isinstance(value, Image.Image) or type(value).__name__ in ("Image", "Mask"):
                if isinstance(value, Image.Image):
                    check_pixels(value, read.max_pixels)
                    value.load()  # torchvision opens images lazily: read now, and the file is closed
                    if read.exif_transpose and self.kinds.get(name) != "mask":
                        values[name] = exif_transpose(value)
        return values

    def protected(self) -> list[Protected]:
        root = getattr(self.dataset, "root", None)
        if isinstance(root, (str, os.PathLike)) and str(root) and Path(root).exists():
            return [Protected(Path(root), "dataset root folder", inside_ok=True)]
        return []

    def load(self, index: int, read: ReadOptions | None = None) -> tuple[Image.Image, int]:
        read = read or ReadOptions()
        item = self.item(index)
        if not isinstance(item, (tuple, list)) or len(item) < 2:
            raise self._not_a_pair(index, f"a {type(item).__name__}")
        image, label = item[0], item[1]
        if hasattr(label, "item"):
            label = label.item()
        if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
            raise self._not_a_pair(index, f"an (image, {type(label).__name__}) pair")
        image = to_pil(image)
        check_pixels(image, read.max_pixels)
        return (exif_transpose(image) if read.exif_transpose else image), int(label)


    def _not_a_pair(self, index: int, found: str) -> FieldError:
        """A later item that is no ``(image, int)`` pair, where the first readable one was."""
        return FieldError(
            f"{self.sample_name(index)}: is {found}, but the first readable sample is an (image, int label) pair, so "
            "the samples were taken for (image, label) pairs. Give every sample the same fields: one without "
            "annotations still has every key (None, or an empty array, for an empty field).")


class ArraySource(DatasetSource):
    """A dataset with uint8 ``.data`` (N,H,W or N,H,W,3) and ``.targets``: MNIST family, CIFAR."""

    def __init__(self, dataset: Any, description: dict[str, Any] | None = None):
        super().__init__(dataset, description)
        data = dataset.data
        self.data = data.numpy() if hasattr(data, "numpy") else np.asarray(data)
        targets = dataset.targets
        self.labels = np.asarray(targets.numpy() if hasattr(targets, "numpy") else targets, dtype=np.int64)
        self.native_mode = "L" if self.data.ndim == 3 else "RGB"

    def header(self, index: int, read: ReadOptions | None = None) -> tuple[str, int, int]:
        return self.native_mode, self.data.shape[2], self.data.shape[1]

    @property
    def is_classic(self) -> bool:
        return True  # uint8 .data rows and integer .targets

    def fingerprint(self) -> dict[str, Any]:
        return fingerprint.of_arrays(self.data, self.labels)

    def load(self, index: int, read: ReadOptions | None = None) -> tuple[Image.Image, int]:
        return Image.fromarray(self.data[index]), int(self.labels[index])


class FastdataSource(DatasetSource):
    """A dataset written by ``fastdata convert``, read through its format's map-style reader as
    PIL images (so any format converts to any other), with its class names. A dataset with
    fields converts with the schema its manifest holds (every field as it was stored, variable
    and ragged shapes included) and its samples' structure; an encoded one keeps its images'
    stored bytes (JPEGs stay JPEGs, as an image folder's files do) where the conversion does not
    change them."""

    def __init__(self, path: Path, manifest: dict[str, Any], reader: Any):
        """``reader``: the dataset's map-style reader with ``image_format="pil"``."""
        from fastdata.manifest import manifest_checksum

        self.path = Path(path)
        self.manifest = manifest
        super().__init__(reader, {"type": "fastdata", "path": str(self.path.resolve())})
        if "fields" in manifest:  # checked with the manifest when the reader opened it
            self.schema = Schema.from_json(manifest["fields"])
            self.layout, self.structure = self.schema.layout, self.schema.structure
        # an encoded dataset whose reader gives its stored bytes (a format's optional _encoded hook)
        self.has_files = manifest["store"] == "encoded" and callable(getattr(reader, "_encoded", None))
        if self.has_files:
            self.labels = np.asarray(reader.labels, dtype=np.int64)
        self._manifest_digest = manifest.get("manifest_blake2b") or manifest_checksum(manifest)

    @property
    def is_classic(self) -> bool:
        return self.schema is None and self.record_schema() is None

    def load_record(self, index: int, read: ReadOptions | None = None) -> dict[str, Any]:
        if self.schema is None:
            return super().load_record(index, read)
        read = read or ReadOptions()
        values = flatten_as(self.dataset[index], self.schema.structure, self.sample_name(index))
        values = {name: values[name] for name in self.schema.names if name in values}
        for name, value in values.items():
            if isinstance(value, Image.Image):
                check_pixels(value, read.max_pixels)
                if read.exif_transpose and self.schema[name].kind == "image":
                    values[name] = exif_transpose(value)
        return values

    def file_bytes(self, index: int) -> bytes | None:
        """The image's bytes as the dataset stores them (encoded datasets)."""
        return self.dataset._encoded(np.asarray([index]))[0] if self.has_files else None

    def fingerprint(self) -> dict[str, Any]:
        return fingerprint.of_manifest(self.manifest, self._manifest_digest)

    def protected(self) -> list[Protected]:
        return [Protected(self.path, "source dataset")]


class WrappedDetectionSource(DatasetSource):
    """torchvision's ``wrap_dataset_for_transforms_v2(CocoDetection(...) | VOCDetection(...),
    target_keys=...)`` as a source: its items as the wrapper gives them (``(image, {"boxes":
    ..., "labels": ...})``), and an image without objects with every key asked for, empty
    (:func:`~fastdata.sources.torchvision_targets.wrapped_item`), where the wrapper leaves them
    out or fails: the samples of the CLI's ``torchvision:CocoDetection`` have them so too."""

    def __init__(self, dataset: Any, description: dict[str, Any] | None = None):
        super().__init__(dataset, description)
        if "masks" in wrapped_target_keys(dataset):  # (K, H, W): every dimension varies
            self.kinds.setdefault("masks", "array:ragged")

    def item(self, index: int) -> Any:
        return wrapped_item(self.dataset, index)


def _classic_pair(values: dict[str, Any], layout: str) -> bool:
    """Whether a flattened item is the classic ``(image, int label)``."""
    if layout != "tuple" or len(values) != 2:
        return False
    image, label = values.values()
    if hasattr(label, "item") and getattr(label, "ndim", 0) == 0 and type(label).__module__.startswith(("torch", "numpy")):
        label = label.item()
    if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
        return False
    if type(image).__module__.startswith("torchvision.tv_tensors") and type(image).__name__ != "Image":
        return False
    return isinstance(image, Image.Image) or hasattr(image, "shape")


def has_array_fast_path(dataset: Any) -> bool:
    data = getattr(dataset, "data", None)
    targets = getattr(dataset, "targets", None)
    if data is None or targets is None or getattr(dataset, "transform", None) is not None:
        return False
    if getattr(dataset, "target_transform", None) is not None:
        return False
    dtype = str(getattr(data, "dtype", ""))
    shape = tuple(getattr(data, "shape", ()))
    if dtype not in ("uint8", "torch.uint8") or not shape:
        return False
    fits = len(shape) == 3 or (len(shape) == 4 and shape[3] == 3)
    # one label per row: QMNIST's .targets is an (N, 8) table, of which its items give one column
    return fits and len(targets) == shape[0] and len(getattr(targets, "shape", (len(targets),))) == 1


def dataset_length(dataset: Any, name: str) -> int:
    """``len(dataset)``, or a clear error when it has none or an invalid one."""
    try:
        length = len(dataset)
    except Exception as exc:  # noqa: BLE001 - a user's __len__ may raise anything
        raise InvalidOptionError(
            f"{name} has no valid length ({type(exc).__name__}: {exc}). A source must be a map-style "
            "dataset with __len__ and __getitem__; check its options."
        ) from exc
    return length


def make_dataset_source(dataset: Any, description: dict[str, Any] | None = None) -> DatasetSource:
    if dataset_length(dataset, f"Dataset {type(dataset).__name__}") == 0:
        raise EmptySourceError(f"Dataset {type(dataset).__name__} is empty.")
    if has_array_fast_path(dataset):
        return ArraySource(dataset, description)
    if wrapped_detection(dataset) is not None:
        return WrappedDetectionSource(dataset, description)
    return DatasetSource(dataset, description)
