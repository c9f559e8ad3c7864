"""The ``hdf5`` checks of ``fastdata verify``: the whole-file checksum in the user block, root
attributes, links that lead elsewhere, every dataset's storage, shape and content checksum
(attribute and manifest), and objects the manifest does not list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np

from fastdata.errors import CorruptDataError, FastdataError
from fastdata.formats.hdf5.layout import (
    COPY_BYTES, FORMAT, H5_ERRORS, MANIFEST_ATTR, USERBLOCK_BYTES, USERBLOCK_MAGIC, hash_after_userblock, open_file, userblock,
)
from fastdata.formats.hdf5.storage import checked_dataset, read_attribute
from fastdata.formats.hdf5.writer import ContentHash
from fastdata.manifest import CHECKSUM_ALGORITHM


def verify_file(path: Path, manifest: dict[str, Any], *, deep: bool = False) -> list[str]:
    """The ``hdf5`` checks of ``fastdata verify``: the whole-file checksum in the user block,
    root attributes, every dataset's shape and content checksum (attribute and manifest), and
    objects the manifest does not list."""
    origin = repr(str(path))
    with open(path, "rb") as handle:
        recorded, digest = handle.read(USERBLOCK_BYTES), hash_after_userblock(handle)
    problems = []
    if recorded != userblock(digest):
        stored = recorded[len(USERBLOCK_MAGIC) :][:16].decode("ascii", "replace")
        problems.append(f"{origin}: the file's {CHECKSUM_ALGORITHM} {digest[:16]}... does not match the one in "
                        f"its user block ({stored}...): the file is damaged.")
    try:
        with open_file(path) as file:
            problems += _foreign_links(file, origin)
            problems += _check_attributes(file, manifest, origin)
            listed = manifest["files"]
            for name, entry in listed.items():
                problems += _check_dataset(file, name, entry, origin, path.stat().st_size)
            problems += _check_shapes(file, manifest, origin)
            extra: list[str] = []
            groups = {"fields"} if any(name.startswith("fields/") for name in listed) else set()
            file.visit(lambda name: extra.append(name) if name not in listed and name != MANIFEST_ATTR
                       and name not in groups else None)
            problems += [f"{origin}: object {name!r} is not listed in the manifest." for name in extra]
    except FastdataError as exc:
        problems.append(str(exc))
    except H5_ERRORS as exc:
        problems.append(f"{origin}: damaged HDF5 metadata ({type(exc).__name__}: {exc}).")
    return problems


def _check_attributes(file: h5py.File, manifest: dict[str, Any], origin: str) -> list[str]:
    problems = []
    try:
        classes = read_attribute(file, "classes", origin)
        if classes is not None and classes != manifest["classes"]:  # left out when too large for the header
            problems.append(f"{origin}: 'classes' attribute {classes!r} differs from the manifest's "
                            f"{manifest['classes']!r}.")
        found_values = {name: read_attribute(file, name, origin) for name in ("fastdata_format", "layout_version")}
    except CorruptDataError as exc:
        return [*problems, str(exc)]
    for name, expected in (("fastdata_format", FORMAT), ("layout_version", manifest["layout_version"])):
        found = found_values[name]
        if found != expected:
            problems.append(f"{origin}: attribute {name!r} is {found!r}, expected {expected!r}.")
    return problems


def _foreign_links(file: h5py.File, origin: str, limit: int = 10_000) -> list[str]:
    """Links that lead out of the file (external) or elsewhere in it (soft): fastdata writes
    neither. Walked without following them; at most ``limit`` entries (a crafted file may loop)."""
    problems, pending, seen = [], [(file, "")], 0
    while pending and seen < limit:
        group, prefix = pending.pop()
        for key in group:
            seen += 1
            link = group.get(key, getlink=True)
            if not isinstance(link, h5py.HardLink):
                target = getattr(link, "filename", None) or getattr(link, "path", "")
                problems.append(f"{origin}: {prefix + key!r} is a {type(link).__name__} (to {target!r}); fastdata "
                                "reads only data stored inside the file itself.")
                continue
            child = group.get(key)
            if isinstance(child, h5py.Group) and prefix.count("/") < 32:
                pending.append((child, f"{prefix}{key}/"))
    return problems


def _check_dataset(file: h5py.File, name: str, entry: dict[str, Any], origin: str, file_size: int) -> list[str]:
    if file.get(name, getlink=True) is None:
        return [f"{origin}: dataset {name!r} is listed in the manifest but missing."]
    try:
        stored = file[name] if name.startswith("fields/") else None  # extra fields keep their own dtypes
        dataset = checked_dataset(file, name, str(origin).strip("'"), file_size, shape=None,
                                  contiguous=name != "images", dtype=stored.dtype if stored is not None else None)
    except CorruptDataError as exc:
        return [str(exc)]
    try:
        attribute = read_attribute(dataset, CHECKSUM_ALGORITHM, origin)
    except CorruptDataError as exc:
        return [str(exc)]
    if attribute != entry[CHECKSUM_ALGORITHM]:
        return [f"{origin}: dataset {name!r} has {CHECKSUM_ALGORITHM} attribute {attribute!r}, the manifest says "
                f"{entry[CHECKSUM_ALGORITHM]!r}."]
    content = ContentHash()
    rows = max(1, COPY_BYTES // max(dataset.dtype.itemsize * int(np.prod(dataset.shape[1:])), 1))
    try:
        for start in range(0, dataset.shape[0] if dataset.shape else 0, rows):
            content.update(dataset[start : start + rows])
    except H5_ERRORS as exc:
        return [f"{origin}: dataset {name!r} cannot be read ({exc}); the file is truncated or damaged."]
    digest = content.hexdigest()
    if content.bytes != entry["bytes"] or digest != entry[CHECKSUM_ALGORITHM]:
        return [f"{origin}: dataset {name!r}: {CHECKSUM_ALGORITHM} {digest[:16]}... ({content.bytes} bytes) does "
                f"not match the manifest's {entry[CHECKSUM_ALGORITHM][:16]}... ({entry['bytes']} bytes): damaged."]
    return []


def _check_shapes(file: h5py.File, manifest: dict[str, Any], origin: str) -> list[str]:
    count = manifest["count"]
    expected = {"labels": ((count,), np.int64)}
    if manifest["store"] == "raw":
        expected["images"] = ((count, *manifest["image"]["shape"]), np.uint8)
    else:
        expected["offsets"] = ((count + 1,), np.int64)
    problems = []
    for name, (shape, dtype) in expected.items():
        dataset = file.get(name)
        if isinstance(dataset, h5py.Dataset) and (dataset.shape != shape or dataset.dtype != dtype):
            problems.append(f"{origin}: dataset {name!r} holds {dataset.dtype} {dataset.shape}, expected "
                            f"{np.dtype(dtype)} {shape}.")
    return problems
