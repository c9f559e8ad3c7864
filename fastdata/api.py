"""``open_dataset``: open any converted dataset with the reader its manifest names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastdata.errors import CorruptManifestError, UnknownDatasetFormatError, UnknownFormatError
from fastdata.formats import get_format
from fastdata.formats.stored import require_manifest
from fastdata.urls import refuse_url


def open_dataset(path: str | os.PathLike, **kwargs: Any) -> Any:
    """Open a dataset written by ``fastdata convert``; keyword arguments go to its reader
    (``transform``, ``target_transform``, ``image_format``, ...)."""
    refuse_url(path, "path")
    path = Path(path)
    manifest = require_manifest(path)
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
