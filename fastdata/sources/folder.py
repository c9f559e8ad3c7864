"""An image folder in torchvision ``ImageFolder`` layout as a conversion source."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fastdata.sources import fingerprint
from fastdata.sources.imagefolder import printable, scan_folder
from fastdata.images import ReadOptions, exif_transpose, guarded_open, open_checked, oriented_size
from fastdata.sources.base import Protected
from fastdata.sources.base import Source


class FolderSource(Source):
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self._root = str(self.root)
        self.keys, labels, self.class_to_idx = scan_folder(self.root)
        self.labels = np.asarray(labels, dtype=np.int64)

    has_files = True

    def sample_name(self, index: int) -> str:
        return printable(os.path.join(self._root, self.keys[index]))

    def describe(self) -> dict[str, Any]:
        return {"type": "folder", "path": str(self.root.resolve())}

    def fingerprint(self) -> dict[str, Any]:
        return fingerprint.of_files(self._root, self.keys, self.class_to_idx)

    def protected(self) -> list[Protected]:
        return [Protected(self.root, "source folder")]

    def take(self, start: int, stop: int) -> "FolderSource":
        part = FolderSource.__new__(FolderSource)
        part.root, part._root, part.class_to_idx = self.root, self._root, self.class_to_idx
        part.keys, part.labels = self.keys[start:stop], self.labels[start:stop].copy()
        return part

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
