"""A dataset stored at a path: its manifest, found and checked through the registry.

:mod:`fastdata.manifest` reads, writes and checks manifests without knowing any format; what
needs the registry (which format a file holds, its layout version and stores) is here, above it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastdata.errors import CorruptManifestError, FastdataError, ManifestError, SourceNotFoundError
from fastdata.formats.registry import all_formats, get_format
from fastdata.manifest import MANIFEST_NAME, check_layout_version, field_problems, read_manifest_file


def find_manifest(path: str | Path) -> dict[str, Any] | None:
    """The manifest of the converted dataset at ``path`` (read once), or None if it holds none:
    a directory's ``manifest.json``, or what a single-file format finds in a file."""
    path = Path(path)
    if path.is_dir():
        candidate = path / MANIFEST_NAME
        return read_manifest_file(candidate) if candidate.is_file() else None
    for spec in all_formats():
        if spec.read_manifest is not None:
            manifest = spec.read_manifest(path)
            if manifest is not None:
                return manifest
    return None


def require_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of the dataset at ``path`` as it is, or why there is none: the path does not
    exist, or holds no dataset written by ``fastdata convert``."""
    path = Path(path)
    if not path.exists():
        raise SourceNotFoundError(f"{str(path)!r} does not exist.")
    manifest = find_manifest(path)
    if manifest is None:
        raise ManifestError(
            f"{str(path)!r} is not a dataset written by 'fastdata convert' (no manifest found). "
            "Convert it first ('fastdata convert'); an image folder is read with fastdata.FolderDataset."
        )
    return manifest


def manifest_problems(path: Path, manifest: dict[str, Any]) -> list[str]:
    """Every field the readers rely on (:func:`fastdata.manifest.field_problems`, checked against
    the format the manifest names); empty when the manifest is sound. ``fastdata verify``
    reports them; readers refuse the dataset with the first one."""
    try:
        spec = get_format(str(manifest.get("format")))
    except FastdataError as exc:
        origin = repr(str(path / MANIFEST_NAME) if path.is_dir() else str(path))
        return [f"{origin}: {exc}"]
    return field_problems(path, manifest, format_name=spec.name, layout_version=spec.layout_version,
                          stores=spec.stores)


def open_manifest(path: str | os.PathLike, format_name: str) -> dict[str, Any]:
    """The manifest of the ``format_name`` dataset at ``path``, checked before a reader uses any
    of its values: the format, the layout version, and every field (:func:`manifest_problems`)."""
    path = Path(path)
    manifest = require_manifest(path)
    if manifest.get("format") != format_name:
        raise ManifestError(
            f"{str(path)!r} holds format {manifest.get('format')!r}, not {format_name!r}. "
            "Use fastdata.open_dataset(path) to pick the right reader."
        )
    check_layout_version(manifest, get_format(format_name).layout_version, str(path))
    problems = manifest_problems(path, manifest)
    if problems:
        raise CorruptManifestError(f"{problems[0]} Run 'fastdata verify {path}' or convert the source again.")
    return manifest


def single_file_problem(file: Path, url: str) -> str | None:
    """What the format's own verify finds wrong with a single-file dataset downloaded from
    ``url`` (``.h5``, which carries its manifest inside), or None: the ``check_single`` that the
    readers and commands give :func:`fastdata.remote.dataset.locate` for a URL."""
    from fastdata.remote.filesystem import scrub  # only for a URL: the registry stays light

    manifest = find_manifest(file)
    if manifest is None:
        return f"{scrub(url)!r} is not a dataset written by 'fastdata convert' (no manifest found)"
    spec = get_format(str(manifest.get("format")))
    problems = spec.verify(file, manifest, deep=False) if spec.verify is not None else []
    return f"{scrub(url)!r}: {problems[0]}" if problems else None
