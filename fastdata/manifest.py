"""The manifest: the JSON record every converted dataset carries about itself.

A manifest names the format and its integer layout version, the sample count, the storage
mode, image shape/mode or encoding, ``class_to_idx``, where the data came from, and a
checksum of every data file. Readers choose themselves from it and refuse layout versions
they do not know.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from fastdata.errors import ManifestError, VersionMismatchError

MANIFEST_NAME = "manifest.json"
CHECKSUM_ALGORITHM = "blake2b"
MANIFEST_CHECKSUM_KEY = "manifest_blake2b"  # of the manifest's own content, so verify finds an edit
_READ_BLOCK_BYTES = 8 * 1024 * 1024


def file_checksum(path: str | os.PathLike) -> str:
    """Return the hex blake2b digest of a file's contents."""
    digest = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_READ_BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def bytes_checksum(data: bytes | memoryview) -> str:
    """Return the hex blake2b digest of a bytes-like object."""
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def describe_file(path: Path) -> dict[str, Any]:
    """The manifest entry of one data file: its size and checksum."""
    return {"bytes": path.stat().st_size, CHECKSUM_ALGORITHM: file_checksum(path)}


def manifest_checksum(manifest: dict[str, Any]) -> str:
    """The checksum of a manifest's content (compact JSON, sorted keys), leaving out its own."""
    body = {key: value for key, value in manifest.items() if key != MANIFEST_CHECKSUM_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return bytes_checksum(text.encode("utf-8"))


def seal_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """Record the manifest's own checksum in it (the last step before it is written)."""
    manifest.pop(MANIFEST_CHECKSUM_KEY, None)
    manifest[MANIFEST_CHECKSUM_KEY] = manifest_checksum(manifest)
    return manifest


def disk_usage(path: Path) -> int:
    """Bytes on disk of a dataset: the file, or every file under the directory."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    """Write ``manifest.json`` into a dataset directory (data files first, manifest last)."""
    seal_manifest(manifest)
    target = directory / MANIFEST_NAME
    with open(target, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=False, ensure_ascii=False)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    return target


def parse_manifest(text: str, origin: str) -> dict[str, Any]:
    """Parse manifest JSON text; ``origin`` names where it came from in errors."""
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(
            f"{origin}: manifest is not valid JSON ({exc.msg} at line {exc.lineno}). "
            "The dataset is damaged or was not written by fastdata; convert it again."
        ) from exc
    if not isinstance(manifest, dict) or "format" not in manifest:
        raise ManifestError(
            f"{origin}: manifest has no 'format' field. "
            "The dataset was not written by fastdata; convert it again."
        )
    return manifest


def read_directory_manifest(path: Path, format_name: str) -> dict[str, Any] | None:
    """The manifest of a dataset directory of format ``format_name``, or None if it is not one."""
    candidate = path / MANIFEST_NAME
    if not path.is_dir() or not candidate.is_file():
        return None
    manifest = read_manifest_file(candidate)
    return manifest if manifest.get("format") == format_name else None


def read_manifest_file(path: Path) -> dict[str, Any]:
    """Read a ``manifest.json`` file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ManifestError(
            f"{str(path)!r}: no manifest found. Is this a dataset written by 'fastdata convert'?"
        ) from exc
    except UnicodeDecodeError as exc:
        raise ManifestError(
            f"{str(path)!r}: manifest is not valid UTF-8 (byte {exc.start}). "
            "The dataset is damaged or was not written by fastdata; convert it again."
        ) from exc
    return parse_manifest(text, str(path))


def check_layout_version(manifest: dict[str, Any], supported: int, origin: str) -> None:
    """Refuse a manifest whose layout version differs from the reader's."""
    found = manifest.get("layout_version")
    if found != supported:
        raise VersionMismatchError(
            f"{origin}: {manifest.get('format')!r} layout version {found!r} is not supported; "
            f"this fastdata reads layout version {supported}. "
            "Convert the source again with this fastdata, or install the fastdata that wrote it."
        )
