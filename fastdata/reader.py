"""The output contract shared by every reader, and the map-style reader base.

A reader returns ``(image, label)``: the image a uint8 CHW tensor by default (a view of HWC
storage, so its memory format is channels-last), an HWC ndarray with ``image_format="numpy"``
or a PIL image with ``"pil"``; the label an ``int``. Indexing with a list/array of indices
returns a collated batch from one vectorised read; ``__getitems__`` serves torch's standard
batched fetch. Files are opened lazily in each process, never inherited across fork.

:class:`OutputSpec` is that contract as one small immutable object: it turns pixels and labels
into samples or a collated batch, for map-style and iterable readers alike.
:class:`fastdata.decoding.Decoder` is the one decode path (encoded bytes -> pixels, or a
:class:`~fastdata.errors.CorruptDataError` naming the sample).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate

from fastdata.errors import CorruptManifestError, InvalidOptionError, ShapeMismatchError

IMAGE_FORMATS = ("tensor", "numpy", "pil")


@dataclass(frozen=True)
class OutputSpec:
    """What a reader hands out: the image format and the optional transforms.

    ``pixels`` given to :meth:`samples`/:meth:`batch` are uint8 HWC: one (B, H, W, C) array, or
    a list of (H, W, C) arrays when sizes may differ.

    ``batch_transform`` takes image tensors ``[B, C, H, W]`` (after ``transform``) and applies on
    every path, so a plain ``DataLoader`` gives what ``fastdata.loader`` gives: to each collated
    batch where the reader collates (``ds[indices]``, ``fastdata.loader``, ``TarDataset(...,
    batch_size=N)``), and to each image as a batch of one (``[1, C, H, W]``) where samples are
    served one by one (``ds[i]``, ``__getitems__``, i.e. ``DataLoader(ds, batch_size=N)``). A
    random transform therefore draws once per batch on the first and once per image on the
    second. It needs ``image_format="tensor"``.
    """

    transform: Callable | None = None
    target_transform: Callable | None = None
    image_format: str = "tensor"
    batch_transform: Callable | None = None

    def __post_init__(self) -> None:
        if self.image_format not in IMAGE_FORMATS:
            allowed = ", ".join(map(repr, IMAGE_FORMATS))
            raise InvalidOptionError(f"Unknown image_format {self.image_format!r}. Allowed: {allowed}.")
        if self.batch_transform is not None and self.image_format != "tensor":
            raise InvalidOptionError(
                f"batch_transform takes image tensors [B, C, H, W], but image_format={self.image_format!r} gives "
                f"{'ndarrays' if self.image_format == 'numpy' else 'PIL images'}. Use image_format='tensor' (the "
                "default), or apply the transform yourself."
            )

    @property
    def per_sample(self) -> bool:
        """Whether a batch must be built sample by sample (a transform, or PIL images)."""
        return self.transform is not None or self.target_transform is not None or self.image_format == "pil"

    def samples(self, pixels: np.ndarray | list[np.ndarray], labels: np.ndarray, *,
                collated_next: bool = False) -> list[tuple[Any, Any]]:
        """One ``(image, label)`` per row, transformed (``batch_transform`` as a batch of one,
        unless ``collated_next``: :meth:`batch` applies it to the whole batch)."""
        if self.image_format == "tensor":
            if isinstance(pixels, list):
                images = [torch.from_numpy(p).permute(2, 0, 1) for p in pixels]
            else:
                images = torch.from_numpy(pixels).permute(0, 3, 1, 2).unbind(0)
        elif self.image_format == "numpy":
            images = list(pixels)
        else:  # decoded images come as PIL images already (no array round trip); raw pixels do not
            images = [p if isinstance(p, Image.Image) else Image.fromarray(p[:, :, 0] if p.shape[2] == 1 else p)
                      for p in pixels]
        targets = labels.tolist()
        if self.transform is not None:
            images = [self.transform(image) for image in images]
        if self.target_transform is not None:
            targets = [self.target_transform(label) for label in targets]
        if self.batch_transform is not None and not collated_next:
            images = [self._batch_transformed(image, 3)[0] for image in images]
        return list(zip(images, targets))

    def _batch_transformed(self, images: Any, ndim: int) -> Any:
        """``batch_transform`` of an image tensor (``ndim`` 3: one image, as a batch of one)."""
        if not isinstance(images, torch.Tensor) or images.ndim != ndim:
            got = f"a tensor of shape {tuple(images.shape)}" if isinstance(images, torch.Tensor) else type(images).__name__
            raise TypeError(f"batch_transform takes image tensors [B, C, H, W]; the images here are {got} "
                            "(from transform). Make transform return a (C, H, W) tensor.")
        return self.batch_transform(images.unsqueeze(0) if ndim == 3 else images)

    def batch(self, pixels: np.ndarray | list[np.ndarray], labels: np.ndarray,
              allocate: Callable | None = None) -> tuple[Any, Any]:
        """A collated batch: ``(uint8 [B, C, H, W], int64 [B])`` from one stacked array, or, with
        transforms, the transformed samples collated like torch's ``default_collate`` (PIL images
        that stay PIL images come back as a list)."""
        if self.per_sample:
            samples = self.samples(pixels, labels, collated_next=True)
            if samples and all(isinstance(image, Image.Image) for image, _ in samples):
                return [image for image, _ in samples], default_collate([label for _, label in samples])
            collated = default_collate(samples)
            if self.batch_transform is None:
                return collated
            images, targets = collated
            return self._batch_transformed(images, 4), targets
        if isinstance(pixels, list):
            pixels = stack(pixels, allocate)
        targets = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
        if self.image_format == "numpy":
            return pixels, targets.numpy()
        images = torch.from_numpy(pixels).permute(0, 3, 1, 2)
        if self.batch_transform is not None:
            images = self.batch_transform(images)
        return images, targets


def stack(pixels: list[np.ndarray], allocate: Callable | None = None) -> np.ndarray:
    """HWC arrays of one shape as one (B, H, W, C) array (in ``allocate``'d memory when given:
    the process backend's shared-memory slot), or a clear error."""
    shapes = {p.shape for p in pixels}
    if len(shapes) > 1:
        raise ShapeMismatchError(
            f"Samples of this batch have different shapes {sorted(shapes)[:3]}; a collated batch "
            "needs one. Pass a transform that resizes (e.g. transforms.v2.Resize), or convert "
            "with --resize HxW."
        )
    if not pixels:
        return np.empty((0, 0, 0, 0), dtype=np.uint8)
    out = allocate((len(pixels), *pixels[0].shape), np.uint8) if allocate is not None else None
    return np.stack(pixels, out=out) if out is not None else np.stack(pixels)


def allocated(allocate: Callable | None, shape: tuple[int, ...]) -> np.ndarray:
    """A uint8 array of ``shape``: from ``allocate`` when given (and it has room), else new."""
    out = allocate(shape, np.uint8) if allocate is not None else None
    return out if out is not None else np.empty(shape, dtype=np.uint8)


class ReaderOutput:
    """What every reader stores of its output: ``transform``, ``target_transform``,
    ``image_format``, ``batch_transform`` (changeable after construction, like torchvision
    datasets' ``transform``), the classes, and the :class:`OutputSpec` they make."""

    classes: list[str] = []
    class_to_idx: dict[str, int] = {}

    def _init_output(self, transform: Callable | None, target_transform: Callable | None, image_format: str,
                     batch_transform: Callable | None) -> None:
        OutputSpec(transform, target_transform, image_format, batch_transform)  # validates
        self.transform = transform
        self.target_transform = target_transform
        self.image_format = image_format
        self.batch_transform = batch_transform

    @property
    def output(self) -> OutputSpec:
        """The output contract with this reader's current options (made again only when one of
        them was changed: every batch asks for it)."""
        spec = self.__dict__.get("_output_spec")
        if spec is None or spec.transform is not self.transform or spec.target_transform is not self.target_transform \
                or spec.image_format != self.image_format or spec.batch_transform is not self.batch_transform:
            spec = self._output_spec = OutputSpec(self.transform, self.target_transform, self.image_format,
                                                  self.batch_transform)
        return spec

    @property
    def targets(self) -> list[int]:
        """Every sample's label in index order, a list of ints like torchvision's
        ``ImageFolder.targets`` (``labels`` is the same as a numpy array)."""
        return self.labels.tolist()

    def __repr__(self) -> str:
        """Like a torchvision dataset's: name, count, location, what is stored, the transforms."""
        lines = [f"Dataset {type(self).__name__}", f"    Number of datapoints: {len(self.labels)}"]
        root = getattr(self, "path", None) or getattr(self, "root", None)
        if root is not None:
            lines.append(f"    Root location: {root}")
        manifest = getattr(self, "manifest", None)
        if manifest:
            image = manifest.get("image") or {}
            shape = image.get("shape")
            size = f"{shape[0]}x{shape[1]} " if isinstance(shape, list) and len(shape) == 3 else ""
            lines.append(f"    Stored: {manifest.get('format')} {manifest.get('store')}, {size}{image.get('mode', '')}")
        elif getattr(self, "mode", None):
            lines.append(f"    Mode: {self.mode}")
        lines.append(f"    Classes: {len(self.classes)}")
        lines.append(f"    Output: {self.image_format}")
        for name in ("transform", "target_transform", "batch_transform"):
            value = getattr(self, name, None)
            if value is not None:
                text = repr(value).replace("\n", "\n    ")
                lines.append(f"    {name}: {text}")
        return "\n".join(lines)

    def _set_classes(self, manifest: dict[str, Any]) -> None:
        """Class names (index = label) and their mapping, like torchvision's ImageFolder."""
        self.classes = list(manifest.get("classes") or [])
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}


class MapDataset(ReaderOutput, Dataset):
    """Base of map-style readers. Subclasses set ``labels`` and implement ``_open``/``_read``.

    ``_open()`` returns this process's handles (stored in ``self._handles``); ``_read(indices)``
    returns uint8 HWC pixels for sorted or unsorted ``indices``: one (B, H, W, C) array, or a
    list of (H, W, C) arrays when sizes may differ.
    """

    labels: np.ndarray

    def __init__(
        self,
        *,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        image_format: str = "tensor",
        batch_transform: Callable | None = None,
    ):
        self._init_output(transform, target_transform, image_format, batch_transform)
        self._handles: Any = None
        self._pid: int | None = None

    # --- per-process resources ---------------------------------------------------------

    def _open(self) -> Any:
        return None

    def _read(self, indices: np.ndarray, allocate: Callable | None = None, *, pil: bool = False) -> Any:
        """Pixels of ``indices``: one (B, H, W, C) array or a list of (H, W, C) arrays (with
        ``pil``, a reader of encoded images may return the decoded PIL images instead). Where a
        reader can, it writes the pixels into ``allocate(shape, dtype)`` (which may return None:
        no room) instead of new memory."""
        raise NotImplementedError

    def _pixels(self, indices: np.ndarray, allocate: Callable | None = None) -> Any:
        return self._read(indices, allocate, pil=self.image_format == "pil")

    @property
    def handles(self) -> Any:
        """This process's open files, opened on first use (and again after a fork)."""
        if self._pid != os.getpid():
            self._handles = self._open()
            self._pid = os.getpid()
        return self._handles

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = None
        state["_pid"] = None
        return state

    # --- indexing ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.labels)

    def _indices(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            return np.arange(*index.indices(len(self)))
        if isinstance(index, torch.Tensor):
            index = index.numpy()
        indices = index if isinstance(index, np.ndarray) else np.asarray(index)
        if indices.ndim != 1 or not (indices.dtype.kind in "iu" or indices.size == 0):
            raise TypeError(
                f"indices must be an int, a slice or a 1-D sequence of ints, got {type(index).__name__}"
            )
        if not indices.size:
            return indices.astype(np.int64)
        length = len(self.labels)
        low, high = indices.min(), indices.max()
        if low >= 0 and high < length:  # the common case: nothing to wrap or refuse
            return indices
        if low < -length or high >= length:
            bad = indices[(indices < -length) | (indices >= length)][0]
            raise IndexError(f"index {bad} is out of range for a dataset of {length} samples")
        return np.where(indices < 0, indices + length, indices)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)) or (isinstance(index, torch.Tensor) and index.ndim == 0):
            position = int(index)
            if not -len(self) <= position < len(self):
                raise IndexError(f"index {position} is out of range for a dataset of {len(self)} samples")
            indices = np.array([position % len(self)])
            return self.output.samples(self._pixels(indices), self.labels[indices])[0]
        return self.get_batch(self._indices(index))

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, Any]]:
        """torch's batched fetch: the samples of ``indices`` from one read, as views."""
        indices = self._indices(indices)
        return self.output.samples(self._pixels(indices), self.labels[indices])

    def get_batch(self, indices: np.ndarray, allocate: Callable | None = None) -> tuple[Any, Any]:
        """A collated batch ``(uint8 [B,C,H,W], int64 [B])`` from one vectorised read (into
        ``allocate``'d memory where given: the process backend's shared-memory slot)."""
        output = self.output
        if output.per_sample:
            allocate = None  # transformed samples are new objects anyway
        return output.batch(self._pixels(indices, allocate), self.labels[indices], allocate)


def decoder_for(manifest: dict[str, Any], *, resize: Any, center_crop: Any, decoder: str) -> Any:
    """The read-time :class:`~fastdata.decoding.Decoder` of a converted dataset: resize,
    center_crop and decoder apply to encoded images; raw pixels were sized at conversion."""
    from fastdata.decoding import Decoder

    made = Decoder.make(manifest["image"]["mode"], resize=resize, center_crop=center_crop, decoder=decoder)
    if manifest["store"] == "raw" and (not made.geometry.is_identity or made.fast):
        raise InvalidOptionError(
            "resize, center_crop and decoder apply to datasets of encoded images; this one stores decoded "
            "pixels (--store raw). Convert with --resize/--center-crop instead, or transform the tensors."
        )
    return made


class StoredDataset(MapDataset):
    """Base of the readers of converted datasets: opens and checks the manifest
    (:func:`fastdata.manifest.open_manifest`), takes the classes from it, then calls the
    subclass's :meth:`_load` to check and load its own files."""

    format_name = ""
    required_files: dict[str, tuple[str, ...]] = {}  # store -> names the manifest's "files" must list

    def __init__(
        self,
        path: str | os.PathLike,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        *,
        image_format: str = "tensor",
        batch_transform: Callable | None = None,
        resize: Any = None,
        center_crop: Any = None,
        decoder: str = "pil",
    ):
        from fastdata.manifest import open_manifest

        super().__init__(transform=transform, target_transform=target_transform, image_format=image_format,
                         batch_transform=batch_transform)
        self.path = Path(path)
        self.manifest = open_manifest(self.path, self.format_name)
        self.store = self.manifest["store"]
        self.mode = self.manifest["image"]["mode"]
        self.decoder = decoder_for(self.manifest, resize=resize, center_crop=center_crop, decoder=decoder)
        missing = [name for name in self.required_files.get(self.store, ()) if name not in self.manifest["files"]]
        if missing:
            raise CorruptManifestError(
                f"{str(self.path)!r}: the manifest does not list {missing[0]!r}, which a {self.format_name} "
                f"{self.store} dataset needs. Run 'fastdata verify {self.path}' or convert the source again."
            )
        self._set_classes(self.manifest)
        self._load()

    def _load(self) -> None:
        """Check and load this format's own files (labels, offsets, ...)."""
