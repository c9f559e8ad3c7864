"""The ``folder`` baseline's reader: :class:`FolderDataset`, an image folder read like
torchvision's ``ImageFolder``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastdata.errors import CorruptDataError, InvalidOptionError
from fastdata.reader.decoding import Decoder
from fastdata.reader.mapstyle import MapDataset
from fastdata.reader.options import ReaderOptions
from fastdata.sources.imagefolder import scan_folder


@dataclass(frozen=True)
class FolderReaderOptions(ReaderOptions):
    """:class:`~fastdata.reader.ReaderOptions` and the mode images are converted to."""

    mode: str = "RGB"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in ("RGB", "L"):
            raise InvalidOptionError(f"Unknown mode {self.mode!r}. Allowed: 'RGB', 'L'.")


class FolderDataset(MapDataset):
    """An ImageFolder-layout folder, decoded with PIL on every access (the slow baseline).

    Sample order and labels equal ``torchvision.datasets.ImageFolder`` (hidden files left out).
    Images are converted to ``mode`` (``"RGB"`` like ImageFolder's loader, or ``"L"``);
    ``resize``, ``center_crop`` and ``decoder`` as for the readers of encoded datasets.
    """

    Options = FolderReaderOptions

    def __init__(self, root: str | os.PathLike, transform: Callable | None = None,
                 target_transform: Callable | None = None, **options: Any):
        super().__init__(transform, target_transform, **options)
        self.root = Path(root)
        self.mode = self.options.mode
        self.decoder = Decoder(self.mode, self.options.geometry, self.options.decoder == "fast").with_options(self.options)
        keys, labels, self.class_to_idx = scan_folder(self.root)
        self.classes = sorted(self.class_to_idx, key=self.class_to_idx.__getitem__)
        # numpy arrays, not lists of str: no copy-on-access growth in forked workers
        self.paths = np.array([os.fsencode(self.root / key) for key in keys])
        self.labels = np.asarray(labels, dtype=np.int64)

    def _read(self, indices: np.ndarray, allocate: Callable | None = None, *, pil: bool = False) -> Any:
        paths = [os.fsdecode(self.paths[index]) for index in indices.tolist()]
        return self.decoder.decode_all(_file_bytes(paths), lambda row: paths[row], self.root, pil=pil,
                                       allocate=allocate, indices=indices.tolist(), epoch=self.epoch_of(indices))


def _file_bytes(paths: list[str]):
    for path in paths:
        try:
            with open(path, "rb") as handle:
                yield handle.read()
        except OSError as exc:
            raise CorruptDataError(f"{path}: cannot read ({exc.strerror}).") from exc

