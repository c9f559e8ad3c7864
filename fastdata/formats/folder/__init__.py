"""The ``folder`` baseline: the original image folder, read like torchvision's ``ImageFolder``.

Read-only. It exists so the benchmark can compare every converted format against the files
they replace, with the same output contract as the other readers (:mod:`.reader`).
"""

from __future__ import annotations

from fastdata.formats.base import FormatSpec, lazy_exports
from fastdata.formats.registry import register

__all__ = ["FolderDataset", "FolderReaderOptions"]
__getattr__ = lazy_exports({"FolderDataset": "fastdata.formats.folder.reader",  # the reader imports torch
                            "FolderReaderOptions": "fastdata.formats.folder.reader"})

register(
    FormatSpec(
        name="folder",
        dataset="fastdata.formats.folder.reader:FolderDataset",
        writer=None,
        baseline=True,
        description="the source image folder, read like torchvision's ImageFolder (baseline)",
    )
)
