"""The output contract shared by every map-style reader.

A reader returns ``(image, label)``: the image a uint8 CHW tensor by default (a view of HWC
storage, so its memory format is channels-last), an HWC ndarray with ``image_format="numpy"``
or a PIL image with ``"pil"``; the label an ``int``. Indexing with a list/array of indices
returns a collated batch from one vectorised read; ``__getitems__`` serves torch's standard
batched fetch. Files are opened lazily in each process, never inherited across fork.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate

from fastdata.errors import InvalidOptionError, ShapeMismatchError

IMAGE_FORMATS = ("tensor", "numpy", "pil")


class MapDataset(Dataset):
    """Base of map-style readers. Subclasses set ``labels`` and implement ``_open``/``_read``.

    ``_open()`` returns this process's handles (stored in ``self._handles``); ``_read(indices)``
    returns uint8 HWC pixels for sorted or unsorted ``indices``: one (B, H, W, C) array, or a
    list of (H, W, C) arrays when sizes may differ.
    """

    labels: np.ndarray
    classes: list[str] = []
    class_to_idx: dict[str, int] = {}

    def __init__(
        self,
        *,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        image_format: str = "tensor",
        batch_transform: Callable | None = None,
    ):
        if image_format not in IMAGE_FORMATS:
            allowed = ", ".join(map(repr, IMAGE_FORMATS))
            raise InvalidOptionError(f"Unknown image_format {image_format!r}. Allowed: {allowed}.")
        self.transform = transform
        self.target_transform = target_transform
        self.image_format = image_format
        self.batch_transform = batch_transform
        self._handles: Any = None
        self._pid: int | None = None

    def _set_classes(self, manifest: dict[str, Any]) -> None:
        """Class names (index = label) and their mapping, like torchvision's ImageFolder."""
        self.classes = list(manifest.get("classes") or [])
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}

    # --- per-process resources ---------------------------------------------------------

    def _open(self) -> Any:
        return None

    def _read(self, indices: np.ndarray) -> np.ndarray | list[np.ndarray]:
        raise NotImplementedError

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
            return self._samples(np.array([position % len(self)]))[0]
        return self.get_batch(self._indices(index))

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, Any]]:
        """torch's batched fetch: the samples of ``indices`` from one read, as views."""
        return self._samples(self._indices(indices))

    def get_batch(self, indices: np.ndarray) -> tuple[Any, Any]:
        """A collated batch ``(uint8 [B,C,H,W], int64 [B])`` from one vectorised read."""
        if self.transform is not None or self.target_transform is not None or self.image_format == "pil":
            return default_collate(self._samples(indices)) if self.image_format != "pil" else self._pil_batch(indices)
        pixels = self._read(indices)
        if isinstance(pixels, list):
            pixels = _stack(pixels)
        labels = torch.from_numpy(self.labels[indices])
        if self.image_format == "numpy":
            return pixels, labels.numpy()
        images = torch.from_numpy(pixels).permute(0, 3, 1, 2)
        if self.batch_transform is not None:
            images = self.batch_transform(images)
        return images, labels

    def _pil_batch(self, indices: np.ndarray) -> tuple[list, torch.Tensor]:
        samples = self._samples(indices)
        return [image for image, _ in samples], default_collate([label for _, label in samples])

    def _samples(self, indices: np.ndarray) -> list[tuple[Any, Any]]:
        pixels = self._read(indices)
        if self.image_format == "tensor":
            if isinstance(pixels, list):
                images = [torch.from_numpy(p).permute(2, 0, 1) for p in pixels]
            else:
                images = torch.from_numpy(pixels).permute(0, 3, 1, 2).unbind(0)
        elif self.image_format == "numpy":
            images = list(pixels)
        else:
            images = [Image.fromarray(p[:, :, 0] if p.shape[2] == 1 else p) for p in pixels]
        labels = self.labels[indices].tolist()
        if self.transform is not None:
            images = [self.transform(image) for image in images]
        if self.target_transform is not None:
            labels = [self.target_transform(label) for label in labels]
        return list(zip(images, labels))


def _stack(pixels: list[np.ndarray]) -> np.ndarray:
    shapes = {p.shape for p in pixels}
    if len(shapes) > 1:
        raise ShapeMismatchError(
            f"Samples of this batch have different shapes {sorted(shapes)[:3]}; a collated batch "
            "needs one. Pass a transform that resizes (e.g. transforms.v2.Resize), or convert "
            "with --resize HxW."
        )
    return np.stack(pixels) if pixels else np.empty((0, 0, 0, 0), dtype=np.uint8)
