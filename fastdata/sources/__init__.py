"""Sources: where samples come from before conversion.

* an image folder in torchvision ``ImageFolder`` layout (:class:`FolderSource`),
* a torchvision dataset by name, ``torchvision:CIFAR10`` (:func:`torchvision_source`): classic
  ``(image, label)`` ones, and detection, segmentation and caption datasets as records of named
  fields (:mod:`fastdata.sources.torchvision_targets`),
* any map-style dataset returning ``(image, label)`` (:class:`DatasetSource`), with a
  vectorised path for datasets exposing ``.data``/``.targets`` arrays (:class:`ArraySource`),
* existing WebDataset shards that fastdata did not write (:class:`WebDatasetSource`),
* Parquet files, ``save_to_disk`` folders and ``datasets.Dataset`` objects, rows by row groups
  (:class:`~fastdata.sources.parquet.TableSource`; columns -> fields: :mod:`~fastdata.sources.columns`).

A dataset written by ``fastdata convert`` is a source too (:class:`FastdataSource`); deciding
that a path holds one is the caller's job (:func:`fastdata.conversion.open_source`), so sources never
depend on storage formats.

Conversion and the ``folder`` format share what lies here: an image folder listed like
torchvision's ``ImageFolder`` (:mod:`~fastdata.sources.imagefolder`), what ``--resume`` compares
(:mod:`~fastdata.sources.fingerprint`) and the paths a source reads, which no output may touch
(:class:`~fastdata.sources.base.Protected`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastdata.errors import InvalidOptionError
from fastdata.sources.imagefolder import IMG_EXTENSIONS, find_classes, is_image_file, scan_folder
from fastdata.images import ReadOptions
from fastdata.sources.base import Source
from fastdata.sources.datasets import (
    ArraySource, DatasetSource, FastdataSource, dataset_length, has_array_fast_path, make_dataset_source,
)
from fastdata.sources.folder import FolderSource
from fastdata.sources.torchvision import TORCHVISION_PREFIX, torchvision_dataset, torchvision_source
from fastdata.sources.webdataset import RepeatedKeysWarning, WebDatasetSource, is_shard_source

__all__ = [
    "IMG_EXTENSIONS", "TORCHVISION_PREFIX", "ArraySource", "DatasetSource", "FastdataSource", "FolderSource",
    "ReadOptions", "Source", "dataset_length", "find_classes", "has_array_fast_path", "is_image_file",
    "make_dataset_source", "resolve_source", "scan_folder", "torchvision_dataset", "torchvision_source",
    "RepeatedKeysWarning", "WebDatasetSource",
    "is_shard_source",
]


def resolve_source(
    source: Any,
    *,
    root: str | os.PathLike | None = None,
    split: str | None = None,
    download: bool = False,
    source_options: dict[str, Any] | None = None,
) -> Source:
    """Turn what the user gave (path, ``torchvision:NAME`` or dataset object) into a Source."""
    if isinstance(source, Source):
        return source
    if isinstance(source, str) and source.startswith(TORCHVISION_PREFIX):
        name = source[len(TORCHVISION_PREFIX):]
        return torchvision_source(name, root=root, split=split, download=download, options=source_options)
    if isinstance(source, (str, os.PathLike)):
        return FolderSource(Path(source))
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        return make_dataset_source(source)
    raise InvalidOptionError(
        f"Cannot use {type(source).__name__} as a source. Give an image folder path, "
        "'torchvision:NAME', or a map-style dataset returning (image, label)."
    )
