"""The ``hdf5`` file's fixed parts: names, the user block with the whole-file checksum, and
opening a file read-only (see the package docstring for the layout)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import h5py

from fastdata.errors import CorruptDataError

FORMAT = "hdf5"
LAYOUT_VERSION = 2  # 1 kept the manifest in a variable-length string attribute (see storage.read_manifest)
MANIFEST_ATTR = "fastdata_manifest"  # layout 2: a contiguous uint8 dataset of UTF-8 JSON; layout 1: an attribute
MAX_MANIFEST_BYTES = 64 << 20  # a larger manifest is damaged or crafted
MAX_ATTRIBUTE_BYTES = 60_000  # fixed-length attributes stay in the object header (HDF5's limit is 64 KiB)
USERBLOCK_BYTES = 512  # before the HDF5 data: holds the checksum of everything after it
USERBLOCK_MAGIC = b"fastdata hdf5 blake2b "
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
COPY_BYTES = 16 << 20
# what h5py raises on damaged metadata, besides OSError (found by flipping every metadata byte)
H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError)


def field_datasets(field: Any) -> list[str]:
    """The datasets of one extra field (docs/fields.md): ``fields/<name>`` (N, *shape) for a
    fixed-shape field; ``fields/<name>.data`` (uint8 bytes) and ``fields/<name>.offsets`` (int64,
    N + 1) for a variable one."""
    if field.variable:
        return [f"fields/{field.name}.data", f"fields/{field.name}.offsets"]
    return [f"fields/{field.name}"]


def userblock(digest: str) -> bytes:
    """The user block: a magic line with the checksum of every byte after it, zero-padded."""
    return (USERBLOCK_MAGIC + digest.encode("ascii") + b"\n").ljust(USERBLOCK_BYTES, b"\x00")


def hash_after_userblock(handle) -> str:
    digest = hashlib.blake2b(digest_size=32)
    handle.seek(USERBLOCK_BYTES)
    for block in iter(lambda: handle.read(COPY_BYTES), b""):
        digest.update(block)
    handle.seek(0)
    return digest.hexdigest()


def open_file(path: Path, **kwargs: Any) -> h5py.File:
    """Open read-only with h5py's default locking (so plain h5py opens of the same file agree)."""
    try:
        return h5py.File(path, "r", **kwargs)
    except (OSError, ValueError) as exc:
        raise CorruptDataError(
            f"{str(path)!r}: cannot open as HDF5 ({exc}). The file is truncated or damaged; "
            "convert the source again."
        ) from exc
