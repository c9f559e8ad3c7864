"""The ``npy`` checks of ``fastdata verify``: array headers and encoded offsets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fastdata.fields import Schema
from fastdata.formats.fieldfiles import field_files


def verify_files(path: Path, manifest: dict[str, Any], *, deep: bool = False) -> list[str]:
    """The ``npy`` checks of ``fastdata verify``: array headers and encoded offsets."""
    count, raw = manifest["count"], manifest["store"] == "raw"
    expected = {"labels.npy": ((count,), np.int64)}
    if raw:
        expected["images.npy"] = ((count, *manifest["image"]["shape"]), np.uint8)
    else:
        expected["offsets.npy"] = ((count + 1,), np.int64)
    problems, arrays = [], {}
    for name, (shape, dtype) in expected.items():
        try:
            arrays[name] = array = np.load(path / name, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            problems.append(f"{str(path / name)!r}: not a readable .npy array ({exc}).")
            continue
        if array.shape != shape or array.dtype != dtype:
            problems.append(f"{str(path / name)!r}: holds {array.dtype} {array.shape}, expected {np.dtype(dtype)} {shape}.")
    problems += _field_headers(path, manifest)
    offsets = arrays.get("offsets.npy")
    if offsets is not None and offsets.shape == (count + 1,):
        size = (path / "data.bin").stat().st_size if (path / "data.bin").is_file() else None
        if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or (size is not None and offsets[-1] != size):
            problems.append(
                f"{str(path / 'offsets.npy')!r}: offsets must rise from 0 to the size of data.bin ({size}); "
                f"they run from {int(offsets[0])} to {int(offsets[-1])}."
            )
    return problems


def _field_headers(path: Path, manifest: dict[str, Any]) -> list[str]:
    """Each fixed-shape field's ``fields/<name>.npy`` holds the dtype and (N, *shape) the manifest says."""
    problems = []
    extras = Schema.from_json(manifest["fields"]).extras if "fields" in manifest else []  # checked already
    for f in extras:
        if f.variable:
            continue
        file = path / field_files(f)[0]
        if not file.is_file():
            continue  # the file check names a missing file
        try:
            array = np.load(file, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            problems.append(f"{str(file)!r}: field {f.name!r}: not a readable .npy array ({exc}).")
            continue
        expected = (manifest["count"], *f.shape)
        if array.shape != expected or array.dtype != np.dtype(f.dtype):
            problems.append(f"{str(file)!r}: field {f.name!r} holds {array.dtype} {array.shape}, the manifest says "
                            f"{f.dtype} {expected}.")
    return problems
