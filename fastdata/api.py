"""``open_dataset``: open any converted dataset with the reader its manifest names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastdata.errors import (
    CorruptManifestError, ManifestError, SourceNotFoundError, UnknownDatasetFormatError, UnknownFormatError,
)
from fastdata.formats import find_manifest, get_format


def open_dataset(path: str | os.PathLike, **kwargs: Any) -> Any:
    """Open a dataset written by ``fastdata convert``; keyword arguments go to its reader
    (``transform``, ``target_transform``, ``image_format``, ...)."""
    path = Path(path)
    if not path.exists():
        raise SourceNotFoundError(f"{str(path)!r} does not exist.")
    manifest = find_manifest(path)
    if manifest is None:
        raise ManifestError(
            f"{str(path)!r} is not a dataset written by 'fastdata convert' (no manifest found). "
            "Convert it first, or read an image folder with fastdata.FolderDataset."
        )
    name = manifest.get("format")
    if not isinstance(name, str):
        raise CorruptManifestError(
            f"{str(path)!r}: the manifest's 'format' is {name!r}, not a format name. Run 'fastdata verify {path}'."
        )
    try:
        spec = get_format(name)
    except UnknownFormatError as exc:
        raise UnknownDatasetFormatError(
            f"{exc} {str(path)!r} was written by a fastdata that knows it; install that one to read it."
        ) from None
    return spec.dataset(path, **kwargs)
