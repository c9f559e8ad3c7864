"""The ``folder`` baseline: the original image folder, read like torchvision's ``ImageFolder``.

Read-only. It exists so the benchmark can compare every converted format against the files
they replace, with the same output contract as the other readers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastdata.errors import CorruptDataError, InvalidOptionError
from fastdata.formats import FormatSpec, register
from fastdata.images import as_hwc, open_image, to_mode
from fastdata.reader import MapDataset
from fastdata.folders import scan_folder


class FolderDataset(MapDataset):
    """An ImageFolder-layout folder, decoded with PIL on every access (the slow baseline).

    Sample order and labels equal ``torchvision.datasets.ImageFolder`` (hidden files left out).
    Images are converted to ``mode`` (``"RGB"`` like ImageFolder's loader, or ``"L"``).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        *,
        mode: str = "RGB",
        **output: Any,
    ):
        """``output``: ``image_format`` and ``batch_transform``, as for every reader."""
        super().__init__(transform=transform, target_transform=target_transform, **output)
        if mode not in ("RGB", "L"):
            raise InvalidOptionError(f"Unknown mode {mode!r}. Allowed: 'RGB', 'L'.")
        self.root = Path(root)
        self.mode = mode
        keys, labels, self.class_to_idx = scan_folder(self.root)
        self.classes = sorted(self.class_to_idx, key=self.class_to_idx.__getitem__)
        # numpy arrays, not lists of str: no copy-on-access growth in forked workers
        self.paths = np.array([os.fsencode(self.root / key) for key in keys])
        self.labels = np.asarray(labels, dtype=np.int64)

    def _read(self, indices: np.ndarray, allocate: Callable | None = None, *, pil: bool = False) -> list[Any]:
        pixels = []
        for index in indices.tolist():
            path = os.fsdecode(self.paths[index])
            try:
                with open(path, "rb") as handle:
                    image = to_mode(open_image(handle.read()), self.mode)
            except Exception as exc:
                raise CorruptDataError(f"{path}: cannot decode image ({exc}).") from exc
            pixels.append(image if pil else as_hwc(image))
        return pixels


register(
    FormatSpec(
        name="folder",
        dataset=FolderDataset,
        writer=None,
        baseline=True,
        description="the source image folder, read like torchvision's ImageFolder (baseline)",
    )
)
