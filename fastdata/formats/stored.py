"""A dataset stored at a path: its manifest, found and checked through the registry.

:mod:`fastdata.manifest` reads, writes and checks manifests without knowing any format; what
needs the registry (which format a file holds, its layout version and stores) is here, above it.
A manifest is checked whole when it is found (:func:`find_manifest`, :func:`check_manifest`):
every value the readers, ``fastdata info`` and the converter use, so a damaged or crafted one is
one error naming what is wrong, never a traceback later.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastdata.errors import (
    CorruptManifestError, FastdataError, InvalidOptionError, ManifestError, SourceNotFoundError,
    UnknownDatasetFormatError, UnknownFormatError,
)
from fastdata.fields import Schema
from fastdata.formats.registry import all_formats, get_format
from fastdata.manifest import MANIFEST_NAME, check_layout_version, field_problems, read_manifest_file


def find_manifest(path: str | Path, *, checked: bool = True) -> dict[str, Any] | None:
    """The manifest of the converted dataset at ``path`` (read once), or None if it holds none:
    a directory's ``manifest.json``, or what a single-file format finds in a file. ``checked``
    (the default): refused unless every value is sound (:func:`check_manifest`);
    ``checked=False`` gives it as it is (``verify`` reports all of its problems, and
    ``--overwrite`` may replace a dataset whose manifest another fastdata wrote)."""
    path = Path(path)
    manifest = _read_manifest(path)
    if manifest is not None and checked:
        check_manifest(path, manifest)
    return manifest


def _read_manifest(path: Path) -> dict[str, Any] | None:
    if path.is_dir():
        candidate = path / MANIFEST_NAME
        return read_manifest_file(candidate) if candidate.is_file() else None
    for spec in all_formats():
        if spec.read_manifest is not None:
            manifest = spec.read_manifest(path)
            if manifest is not None:
                return manifest
    return None


def require_manifest(path: str | os.PathLike, *, checked: bool = True) -> dict[str, Any]:
    """The manifest of the dataset at ``path`` (``checked`` as :func:`find_manifest` says), or
    why there is none: the path does not exist, or holds no dataset written by ``fastdata convert``."""
    path = Path(path)
    if not path.exists():
        raise SourceNotFoundError(f"{str(path)!r} does not exist.")
    manifest = find_manifest(path, checked=checked)
    if manifest is None:
        raise ManifestError(
            f"{str(path)!r} is not a dataset written by 'fastdata convert' (no manifest found). "
            "Convert it first ('fastdata convert'); an image folder is read with fastdata.FolderDataset."
        )
    return manifest


def check_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Refuse a manifest that readers cannot trust: a format this fastdata does not know
    (:class:`~fastdata.errors.UnknownDatasetFormatError`), a layout version it does not read
    (:class:`~fastdata.errors.VersionMismatchError`), else the first of :func:`manifest_problems`
    (:class:`~fastdata.errors.CorruptManifestError`)."""
    name = manifest.get("format")
    if not isinstance(name, str):
        raise CorruptManifestError(f"{str(path)!r}: the manifest's 'format' is {str(name)[:40]!r}, not a format "
                                   f"name. Run 'fastdata verify {path}'.")
    try:
        spec = get_format(name)
    except UnknownFormatError as exc:
        raise UnknownDatasetFormatError(
            f"{exc} {str(path)!r} was written by a fastdata that knows it; install that one to read it."
        ) from None
    check_layout_version(manifest, spec.layout_version, str(path))
    problems = manifest_problems(path, manifest)
    if problems:
        raise CorruptManifestError(f"{problems[0]} Run 'fastdata verify {path}' or convert the source again.")


def manifest_problems(path: Path, manifest: dict[str, Any]) -> list[str]:
    """Every field the readers rely on (:func:`fastdata.manifest.field_problems`, checked against
    the format the manifest names, and the schema of a dataset with fields,
    :func:`schema_problems`); empty when the manifest is sound. ``fastdata verify`` reports them;
    readers refuse the dataset with the first one."""
    origin = repr(str(path / MANIFEST_NAME) if path.is_dir() else str(path))
    try:
        spec = get_format(str(manifest.get("format")))
    except FastdataError as exc:
        return [f"{origin}: {exc}"]
    return field_problems(path, manifest, format_name=spec.name, layout_version=spec.layout_version,
                          stores=spec.stores) + schema_problems(origin, manifest)


def schema_problems(origin: str, manifest: dict[str, Any]) -> list[str]:
    """The problem with the manifest's ``fields`` (a dataset with fields beyond ``(image,
    label)``: docs/fields.md), if any: every value checked as :meth:`Schema.from_json` checks it,
    and an image field to store in the format's images."""
    if "fields" not in manifest:
        return []
    try:
        schema = Schema.from_json(manifest["fields"])
    except InvalidOptionError as exc:
        return [f"{origin}: the manifest's 'fields' are damaged: {exc}."]
    if schema.image is None:
        return [f"{origin}: the manifest's 'fields' have no image field."]
    return []


def open_manifest(path: str | os.PathLike, format_name: str) -> dict[str, Any]:
    """The manifest of the ``format_name`` dataset at ``path``, checked before a reader uses any
    of its values (:func:`check_manifest`), and of that format."""
    path = Path(path)
    manifest = require_manifest(path)
    if manifest.get("format") != format_name:
        raise ManifestError(
            f"{str(path)!r} holds format {manifest.get('format')!r}, not {format_name!r}. "
            "Use fastdata.open_dataset(path) to pick the right reader."
        )
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
