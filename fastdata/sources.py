"""Sources: where samples come from before conversion.

* an image folder in torchvision ``ImageFolder`` layout (:class:`FolderSource`),
* a torchvision dataset by name, ``torchvision:CIFAR10`` (:func:`torchvision_dataset`),
* any map-style dataset returning ``(image, label)`` (:class:`DatasetSource`), with a
  vectorised path for datasets exposing ``.data``/``.targets`` arrays (:class:`ArraySource`).

A source is picklable and loads one sample at a time by index, so conversion workers can
run it in parallel.
"""

from __future__ import annotations

import difflib
import inspect
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fastdata import fingerprint
from fastdata.errors import EmptySourceError, FastdataError, InvalidOptionError, SourceNotFoundError
from fastdata.images import (
    DEFAULT_MAX_PIXELS, check_pixels, exif_transpose, guarded_open, open_checked, oriented_size, to_pil,
)
from fastdata.outputs import Protected

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
TORCHVISION_PREFIX = "torchvision:"


def is_image_file(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def find_classes(root: Path) -> list[str]:
    """Class names: sorted non-hidden sub-folders of ``root`` (symlinked folders count)."""
    with os.scandir(root) as entries:
        return sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))


def _walk_once(top: Path) -> list[tuple[str, list[str]]]:
    """(folder, file names) for every folder under ``top``, each real folder visited once.

    Follows symlinked folders like ``os.walk(followlinks=True)`` but never twice into the same
    folder, so symlink loops end. Hidden folders and files are left out.
    """
    seen: set[tuple[int, int]] = set()
    found: list[tuple[str, list[str]]] = []
    pending = [str(top)]
    while pending:
        folder = pending.pop()
        try:
            stat = os.stat(folder)
        except OSError:
            continue
        if (stat.st_dev, stat.st_ino) in seen:
            continue
        seen.add((stat.st_dev, stat.st_ino))
        files, subfolders = [], []
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                is_folder = entry.is_dir()
            except OSError:
                is_folder = False
            (subfolders if is_folder else files).append(entry.name)
        found.append((folder, files))
        pending.extend(os.path.join(folder, name) for name in sorted(subfolders, reverse=True))
    return found


def scan_folder(root: str | os.PathLike) -> tuple[list[str], list[int], dict[str, int]]:
    """List an image folder like torchvision's ``ImageFolder``.

    Returns (relative paths, labels, class_to_idx) in ImageFolder's sample order.
    """
    root = Path(root)
    if not root.exists():
        raise SourceNotFoundError(f"Source folder {str(root)!r} does not exist.")
    if not root.is_dir():
        raise SourceNotFoundError(
            f"Source {str(root)!r} is not a folder. Give an image folder (one sub-folder per "
            f"class) or a torchvision dataset such as 'torchvision:CIFAR10'."
        )
    classes = find_classes(root)
    if not classes:
        raise EmptySourceError(
            f"{str(root)!r} has no class folders. Put images in one sub-folder per class "
            f"(ImageFolder layout: {root.name}/cat/001.jpg, {root.name}/dog/002.png)."
        )
    paths: list[str] = []
    labels: list[int] = []
    empty: list[str] = []
    for label, name in enumerate(classes):
        before = len(paths)
        for folder, files in sorted(_walk_once(root / name)):
            relative = os.path.relpath(folder, root)
            paths.extend(
                os.path.join(relative, f).replace(os.sep, "/") for f in sorted(files) if is_image_file(f)
            )
        labels.extend([label] * (len(paths) - before))
        if len(paths) == before:
            empty.append(name)
    if not paths:
        raise EmptySourceError(
            f"{str(root)!r} has class folders but no images with extensions "
            f"{', '.join(IMG_EXTENSIONS)}."
        )
    if empty:
        warnings.warn(
            f"{str(root)!r}: class folder(s) {', '.join(map(repr, empty))} hold no images; "
            "their class indices are kept.",
            stacklevel=2,
        )
    return paths, labels, {name: i for i, name in enumerate(classes)}


@dataclass(frozen=True)
class ReadOptions:
    """How sources decode: the pixel limit (None: none) and whether EXIF orientation is applied."""

    max_pixels: int | None = DEFAULT_MAX_PIXELS
    exif_transpose: bool = False


class Source:
    """Base of all sources. Subclasses set the attributes below and implement ``image``."""

    keys: list[str]
    labels: np.ndarray | None  # known up front, or None when only loading tells
    class_to_idx: dict[str, int]

    def __len__(self) -> int:
        return len(self.keys)

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError

    def fingerprint(self) -> dict[str, Any]:
        """What ``--resume`` compares to tell whether the source changed (:mod:`fastdata.fingerprint`)."""
        raise NotImplementedError

    def protected(self) -> list[Protected]:
        """Paths this source reads, which the output may not be, lie in, or contain."""
        return []

    def file_bytes(self, index: int) -> bytes | None:
        """The sample's original encoded bytes, or None when the source has no files."""
        return None

    def header(self, index: int, read: ReadOptions | None = None) -> tuple[str, int, int]:
        """(PIL mode, width, height) of a sample, as cheaply as the source allows."""
        image, _ = self.load(index, read)
        return image.mode, image.width, image.height

    def load(self, index: int, read: ReadOptions | None = None) -> tuple[Image.Image, int]:
        """The decoded PIL image (in its own mode) and label of one sample."""
        raise NotImplementedError


class FolderSource(Source):
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self._root = str(self.root)
        self.keys, labels, self.class_to_idx = scan_folder(self.root)
        self.labels = np.asarray(labels, dtype=np.int64)

    def describe(self) -> dict[str, Any]:
        return {"type": "folder", "path": str(self.root.resolve())}

    def fingerprint(self) -> dict[str, Any]:
        return fingerprint.of_files(self._root, self.keys, self.class_to_idx)

    def protected(self) -> list[Protected]:
        return [Protected(self.root, "source folder")]

    def file_bytes(self, index: int) -> bytes:
        return (self.root / self.keys[index]).read_bytes()

    def header(self, index: int, read: ReadOptions | None = None) -> tuple[str, int, int]:
        read = read or ReadOptions()
        with guarded_open(os.path.join(self._root, self.keys[index]), read.max_pixels) as image:
            width, height = oriented_size(image) if read.exif_transpose else image.size
            return image.mode, width, height

    def load(self, index: int, read: ReadOptions | None = None) -> tuple[Image.Image, int]:
        read = read or ReadOptions()
        image = open_checked(os.path.join(self._root, self.keys[index]), read.max_pixels)
        with image:
            image.load()  # decodes fully; leaving the block closes the file, even on failure
        if read.exif_transpose:
            image = exif_transpose(image)
        return image, int(self.labels[index])


class DatasetSource(Source):
    """Any map-style dataset whose items are ``(image, label)``."""

    def __init__(self, dataset: Any, description: dict[str, Any] | None = None):
        self.dataset = dataset
        self.keys = [str(i) for i in range(len(dataset))]
        self.labels = None
        self.class_to_idx = _class_to_idx(dataset)
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
            image, label = self.load(index)
        except Exception as exc:  # noqa: BLE001 - a bad item is part of what the source is
            return f"error {type(exc).__name__}: {exc}".encode()
        return f"{image.mode} {image.size} {label}\n".encode() + image.tobytes()

    def protected(self) -> list[Protected]:
        root = getattr(self.dataset, "root", None)
        if isinstance(root, (str, os.PathLike)) and str(root) and Path(root).exists():
            return [Protected(Path(root), "dataset root folder", inside_ok=True)]
        return []

    def load(self, index: int, read: ReadOptions | None = None) -> tuple[Image.Image, int]:
        read = read or ReadOptions()
        item = self.dataset[index]
        if not isinstance(item, (tuple, list)) or len(item) < 2:
            raise TypeError(f"expected an (image, label) pair, got {type(item).__name__}")
        image, label = item[0], item[1]
        if hasattr(label, "item"):
            label = label.item()
        if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
            raise TypeError(f"expected an integer label, got {type(label).__name__}")
        image = to_pil(image)
        check_pixels(image, read.max_pixels)
        return (exif_transpose(image) if read.exif_transpose else image), int(label)


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

    def fingerprint(self) -> dict[str, Any]:
        return fingerprint.of_arrays(self.data, self.labels)

    def load(self, index: int, read: ReadOptions | None = None) -> tuple[Image.Image, int]:
        return Image.fromarray(self.data[index]), int(self.labels[index])


class FastdataSource(DatasetSource):
    """A dataset written by ``fastdata convert``, read through its format's map-style reader as
    PIL images (so any format converts to any other), with its class names."""

    def __init__(self, path: Path, manifest: dict[str, Any]):
        from fastdata.formats import get_format
        from fastdata.manifest import manifest_checksum

        self.path = Path(path)
        self.manifest = manifest
        reader = get_format(manifest["format"]).map_dataset
        super().__init__(reader(self.path, image_format="pil"), {"type": "fastdata", "path": str(self.path.resolve())})
        self._manifest_digest = manifest.get("manifest_blake2b") or manifest_checksum(manifest)

    def fingerprint(self) -> dict[str, Any]:
        return fingerprint.of_manifest(self.manifest, self._manifest_digest)

    def protected(self) -> list[Protected]:
        return [Protected(self.path, "source dataset")]


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
    return fits and len(targets) == shape[0]


def _class_to_idx(dataset: Any) -> dict[str, int]:
    mapping = getattr(dataset, "class_to_idx", None)
    if isinstance(mapping, dict) and mapping:
        return {str(k): int(v) for k, v in mapping.items()}
    classes = getattr(dataset, "classes", None)
    if classes:
        return {str(name): i for i, name in enumerate(classes)}
    return {}


def torchvision_dataset(
    name: str,
    *,
    root: str | os.PathLike | None = None,
    split: str = "train",
    download: bool = False,
    options: dict[str, Any] | None = None,
) -> Any:
    """Instantiate ``torchvision.datasets.<name>``, mapping ``split`` to its own argument."""
    try:
        import torchvision.datasets as tv_datasets
    except ImportError as exc:
        from fastdata.errors import DependencyMissingError

        raise DependencyMissingError(
            "torchvision sources need torchvision. Install it with: pip install 'fastdata[torchvision]'"
        ) from exc
    cls = getattr(tv_datasets, name, None)
    if not inspect.isclass(cls):
        known = [n for n in dir(tv_datasets) if inspect.isclass(getattr(tv_datasets, n)) and n[0].isupper()]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise InvalidOptionError(f"Unknown torchvision dataset {name!r}.{hint}")
    if split not in ("train", "test"):
        raise InvalidOptionError(f"Unknown split {split!r}. Allowed: 'train', 'test'.")
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = sorted(set(options or {}) - set(params))
    if unknown and not takes_any:
        allowed = ", ".join(n for n in params if n not in ("self", "root", "train", "split", "download")) or "none"
        raise InvalidOptionError(
            f"torchvision:{name} does not take option {unknown[0]!r} (--source-option). Its options: {allowed}."
        )
    kwargs: dict[str, Any] = {}
    if "root" in params:
        if root is None:
            raise InvalidOptionError(f"torchvision:{name} needs --root (the folder holding its files).")
        kwargs["root"] = str(root)
    if "train" in params:
        kwargs["train"] = split == "train"
    elif "split" in params:
        kwargs["split"] = split
    if "download" in params:
        kwargs["download"] = download
    kwargs.update(options or {})
    try:
        dataset = cls(**kwargs)
    except RuntimeError as exc:
        if "not found" in str(exc).lower():
            raise SourceNotFoundError(
                f"torchvision:{name} not found under root {str(root)!r} ({exc}). "
                "Pass --download to fetch it, or point --root at the folder that holds it."
            ) from exc
        raise _rejected(name, options, exc) from exc
    except FastdataError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the dataset's constructor raises for bad options
        raise _rejected(name, options, exc) from exc
    dataset_length(dataset, f"torchvision:{name}")
    return dataset


def _rejected(name: str, options: dict[str, Any] | None, exc: Exception) -> InvalidOptionError:
    given = ", ".join(f"{k}={v!r}" for k, v in sorted((options or {}).items())) or "no options"
    return InvalidOptionError(
        f"torchvision:{name} cannot be created with {given} ({type(exc).__name__}: {exc}). "
        "Check the --source-option values against the dataset's documentation."
    )


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


def resolve_source(
    source: Any,
    *,
    root: str | os.PathLike | None = None,
    split: str = "train",
    download: bool = False,
    source_options: dict[str, Any] | None = None,
) -> Source:
    """Turn what the user gave (path, ``torchvision:NAME`` or dataset object) into a Source."""
    if isinstance(source, Source):
        return source
    if isinstance(source, str) and source.startswith(TORCHVISION_PREFIX):
        name = source[len(TORCHVISION_PREFIX):]
        dataset = torchvision_dataset(name, root=root, split=split, download=download, options=source_options)
        description = {"type": "torchvision", "name": name, "split": split, "root": str(root) if root else None}
        if source_options:
            description["options"] = {k: repr(v) for k, v in sorted(source_options.items())}
        return make_dataset_source(dataset, description)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        from fastdata.formats import find_manifest

        manifest = find_manifest(path) if path.exists() else None
        if manifest is not None:
            return FastdataSource(path, manifest)
        return FolderSource(path)
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        return make_dataset_source(source)
    raise InvalidOptionError(
        f"Cannot use {type(source).__name__} as a source. Give an image folder path, "
        "'torchvision:NAME', or a map-style dataset returning (image, label)."
    )


def make_dataset_source(dataset: Any, description: dict[str, Any] | None = None) -> DatasetSource:
    if dataset_length(dataset, f"Dataset {type(dataset).__name__}") == 0:
        raise EmptySourceError(f"Dataset {type(dataset).__name__} is empty.")
    if has_array_fast_path(dataset):
        return ArraySource(dataset, description)
    return DatasetSource(dataset, description)
