"""``open_dataset``: open any converted dataset with the reader its manifest names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastdata.errors import CorruptManifestError, UnknownDatasetFormatError, UnknownFormatError
from fastdata.formats import get_format
from fastdata.formats.stored import require_manifest, single_file_problem
from fastdata.remote.dataset import RemoteOptions, locate, reusing_answers
from fastdata.urls import is_url


def open_dataset(path: str | os.PathLike, **kwargs: Any) -> Any:
    """Open a dataset written by ``fastdata convert``, at a local path or a URL (``s3://``,
    ``gs://``, ``https://``, ...: docs/remote.md); keyword arguments go to its reader
    (``transform``, ``target_transform``, ``image_format``, ``storage_options``, ``cache_dir``,
    ``cache_limit``, ...). A URL's manifest is fetched once: it picks the reader, which opens the
    dataset with it."""
    if is_url(path):
        with reusing_answers():
            return _open(path, kwargs)
    return _open(path, kwargs)


def _open(path: str | os.PathLike, kwargs: dict[str, Any]) -> Any:
    if is_url(path):
        remote = kwargs.get("remote") or RemoteOptions.from_keywords(kwargs)
        local, _ = locate(path, remote, fetch=(),  # the manifest names the reader; the reader fetches the rest
                          check_single=single_file_problem)
        manifest = require_manifest(local)
    else:
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
