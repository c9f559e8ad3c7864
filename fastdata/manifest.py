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
import re
from pathlib import Path
from typing import Any

from fastdata.errors import (
    CorruptDataError, CorruptManifestError, ManifestError, VersionMismatchError,
)

MANIFEST_NAME = "manifest.json"
CHECKSUM_ALGORITHM = "blake2b"
MANIFEST_CHECKSUM_KEY = "manifest_blake2b"  # of the manifest's own content, so verify finds an edit
_READ_BLOCK_BYTES = 8 * 1024 * 1024
_MAX_COUNT = 2**40  # samples; anything larger is a damaged or crafted manifest
_MAX_SIDE = 2**20  # pixels per image side
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_MAX_DEPTH = 64  # of nested lists and objects in a manifest


class Manifest(dict):
    """A written dataset's manifest, the plain dict it always was (keys, ``json.dumps``, ``==``),
    shown short in a REPL: format, store, samples, image and classes, not its kilobytes of
    checksums and options (``dict(manifest)`` or ``fastdata info --json`` shows them all)."""

    def __repr__(self) -> str:
        if not isinstance(self.get("count"), int) or not isinstance(self.get("format"), str):
            return dict.__repr__(self)  # not a dataset's manifest (a --part record): as it is
        image = self.get("image") if isinstance(self.get("image"), dict) else {}
        shape = image.get("shape")
        pixels = ("x".join(map(str, shape)) + f" {image.get('dtype')}" if shape else
                  f"encoded ({image.get('encoding')})" if image.get("encoding") else None)
        classes = self.get("classes") or []
        parts = [f"{self['format']} {self.get('store')}", f"{self['count']:,} samples",
                 *([pixels] if pixels else []), f"{len(classes)} classes" if classes else "no classes"]
        return f"<fastdata manifest: {', '.join(parts)}; dict(manifest) for every key>"


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
        raise CorruptManifestError(
            f"{origin}: manifest is not valid JSON ({exc.msg} at line {exc.lineno}). "
            "The dataset is damaged or was not written by fastdata; convert it again."
        ) from exc
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits; arrays nested too deep
        what = "nests arrays or objects too deep" if isinstance(exc, RecursionError) else \
            f"holds a number Python refuses to read ({str(exc).split(':')[0]})"
        raise CorruptManifestError(
            f"{origin}: manifest {what}. The dataset is damaged or was not written by fastdata; convert it again."
        ) from None
    if not isinstance(manifest, dict) or "format" not in manifest:
        raise CorruptManifestError(
            f"{origin}: manifest has no 'format' field. "
            "The dataset was not written by fastdata; convert it again."
        )
    if _deeper_than(manifest, _MAX_DEPTH):
        raise CorruptManifestError(
            f"{origin}: manifest nests arrays or objects more than {_MAX_DEPTH} deep (fastdata writes fewer than 10). "
            "The dataset is damaged or was not written by fastdata; convert it again."
        )
    return manifest


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` nests lists or objects more than ``limit`` deep (walked without recursion)."""
    pending = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, (dict, list)):
            if depth > limit:
                return True
            pending += [(child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)]
    return False


def read_manifest_file(path: Path) -> dict[str, Any]:
    """Read a ``manifest.json`` file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ManifestError(
            f"{str(path)!r}: no manifest found. Is this a dataset written by 'fastdata convert'?"
        ) from exc
    except UnicodeDecodeError as exc:
        raise CorruptManifestError(
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


def is_plain_name(name: Any) -> bool:
    """A file name that stays inside its folder: no separator, not '.' or '..', printable."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\x00" not in name and len(name) <= 255)


def _is_count(value: Any, limit: int = _MAX_COUNT) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit


def field_problems(path: Path, manifest: dict[str, Any], *, format_name: str, layout_version: int,
                   stores: tuple[str, ...]) -> list[str]:
    """Every field the readers rely on, with its type, range and relations, for a manifest of
    format ``format_name`` (its layout version and stores given by the caller: this module
    knows no format). One message per problem; empty when the manifest is sound."""
    origin = repr(str(path / MANIFEST_NAME) if path.is_dir() else str(path))
    problems = []
    if manifest.get("layout_version") != layout_version:
        problems.append(f"{origin}: layout version {manifest.get('layout_version')!r} is not supported; this "
                        f"fastdata reads {format_name!r} layout version {layout_version}.")
    count = manifest.get("count")
    if not _is_count(count):
        problems.append(f"{origin}: 'count' is {count!r}; expected a sample count from 0 to {_MAX_COUNT}.")
    if manifest.get("store") not in stores:
        problems.append(f"{origin}: 'store' is {manifest.get('store')!r}; expected one of {list(stores)}.")
    problems += _image_problems(origin, manifest)
    problems += _class_problems(origin, manifest)
    problems += _files_problems(origin, manifest, directory=path.is_dir())
    problems += _section_problems(origin, manifest)
    return problems


# the other entries, by the type their users (fastdata info, the readers) take them as; absent is fine
_SECTIONS = {"fields": dict, "source": dict, "options": dict, "hdf5": dict, "tar": dict, "skipped": list,
             "created": str, "fastdata_version": str, "conversion_key": str, "source_fingerprint": dict}


def _section_problems(origin: str, manifest: dict[str, Any]) -> list[str]:
    problems = [f"{origin}: {key!r} is {str(manifest[key])[:40]!r}; expected {'an object' if kind is dict else kind.__name__}."
                for key, kind in _SECTIONS.items() if key in manifest and not isinstance(manifest[key], kind)]
    options, hdf5 = manifest.get("options"), manifest.get("hdf5")
    reencode = options.get("reencode") if isinstance(options, dict) else None
    if reencode is not None and not (isinstance(reencode, list) and len(reencode) == 2 and isinstance(reencode[0], str)):
        problems.append(f"{origin}: options 'reencode' is {str(reencode)[:40]!r}; expected [codec, quality].")
    if isinstance(hdf5, dict) and not isinstance(hdf5.get("compression"), (str, type(None))):
        problems.append(f"{origin}: hdf5 'compression' is {str(hdf5['compression'])[:40]!r}; expected a codec name.")
    return problems


def _image_problems(origin: str, manifest: dict[str, Any]) -> list[str]:
    image = manifest.get("image")
    if not isinstance(image, dict) or image.get("mode") not in ("RGB", "L"):
        return [f"{origin}: 'image' is {image!r}; expected a mapping with 'mode' 'RGB' or 'L'."]
    channels = 3 if image["mode"] == "RGB" else 1
    if image.get("channels") != channels or not isinstance(image.get("encoding"), str):
        return [f"{origin}: 'image' is {image!r}; expected 'channels' {channels} and an 'encoding' name."]
    if manifest.get("store") != "raw":
        if image.get("shape") is not None:
            return [f"{origin}: encoded images have no fixed shape, but 'image' says {image.get('shape')!r}."]
        return []
    shape = image.get("shape")
    if not (isinstance(shape, list) and len(shape) == 3 and shape[2] == channels
            and all(_is_count(v, _MAX_SIDE) and v > 0 for v in shape)):
        return [f"{origin}: raw image shape is {shape!r}; expected [height, width, {channels}] "
                f"with sides from 1 to {_MAX_SIDE}."]
    return []


def _class_problems(origin: str, manifest: dict[str, Any]) -> list[str]:
    """``classes`` lists each class as a name or a list of its names (a source may give one
    class several, or one name to several classes); ``class_to_idx`` maps names to indices, as
    the source had them (not necessarily the positions in ``classes``)."""
    classes = manifest.get("classes")
    class_to_idx = manifest.get("class_to_idx")
    if not isinstance(classes, list) or not isinstance(class_to_idx, dict) or \
            not all(isinstance(entry, str) or (isinstance(entry, list) and all(isinstance(name, str) for name in entry))
                    for entry in classes):
        return [f"{origin}: 'classes' {str(classes)[:80]!r} and 'class_to_idx' {str(class_to_idx)[:80]!r} must be a "
                "list of names (or lists of names) and a mapping."]
    bad = next((name for name, index in class_to_idx.items() if not _is_count(index)), None)
    if bad is not None:
        return [f"{origin}: 'class_to_idx' maps {bad!r} to {class_to_idx[bad]!r}; expected a class index from 0."]
    return []


def class_count(manifest: dict[str, Any]) -> int:
    """How many class indices a dataset's labels may hold: its ``classes``, or more where its
    ``class_to_idx`` numbers a class beyond them (a source's own numbering)."""
    indices = [index for index in (manifest.get("class_to_idx") or {}).values() if isinstance(index, int)]
    return max(len(manifest.get("classes") or ()), max(indices, default=-1) + 1)


def _files_problems(origin: str, manifest: dict[str, Any], *, directory: bool) -> list[str]:
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return [f"{origin}: 'files' is {files!r}; expected the checksum of every data file."]
    problems = []
    for name, entry in files.items():
        if not isinstance(entry, dict) or not isinstance(entry.get(CHECKSUM_ALGORITHM), str) \
                or not _HEX_DIGEST.fullmatch(entry[CHECKSUM_ALGORITHM]) or not _is_count(entry.get("bytes"), 2**62):
            problems.append(f"{origin}: files entry {name!r} is {entry!r}; expected 'bytes' and a "
                            f"{CHECKSUM_ALGORITHM!r} digest.")
        elif directory and not all(is_plain_name(part) for part in name.split("/")):
            problems.append(f"{origin}: files entry {name!r} points outside the dataset directory.")
    return problems


def check_file_sizes(directory: Path, manifest: dict[str, Any]) -> None:
    """Every data file of a directory dataset has the size its manifest records (a reader's
    check at open: a truncated memory-mapped file would otherwise crash the process with SIGBUS)."""
    for name, entry in manifest["files"].items():
        file = directory / name
        try:
            if file.is_symlink():
                raise CorruptDataError(
                    f"{str(file)!r} is a symbolic link (to {os.readlink(file)!r}); fastdata reads only files stored "
                    f"inside the dataset directory. Run 'fastdata verify {directory}'."
                )
            size = file.stat().st_size
        except OSError as exc:
            if isinstance(exc, CorruptDataError):
                raise
            raise CorruptDataError(
                f"{str(file)!r}: cannot read ({exc.strerror}). Run 'fastdata verify {directory}' or convert the "
                "source again."
            ) from exc
        if size != entry["bytes"]:
            state = "truncated" if size < entry["bytes"] else "damaged: data was appended"
            raise CorruptDataError(
                f"{str(file)!r} is {size} bytes but the manifest says {entry['bytes']} ({state}). "
                f"Run 'fastdata verify {directory}' or convert the source again."
            )


def load_small_array(file: Path, *, dtype: Any, length: int | None = None) -> Any:
    """A small .npy array (labels, offsets) read into memory, its declared shape checked against
    the file's size first (``np.load`` would try to allocate whatever a damaged header says)."""
    import numpy as np

    try:
        mapped = np.load(file, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise CorruptDataError(
            f"{str(file)!r}: cannot read ({exc}). Run 'fastdata verify {file.parent}' or convert the source again."
        ) from exc
    if mapped.ndim != 1 or mapped.dtype != np.dtype(dtype) or (length is not None and len(mapped) != length):
        expected = f"{np.dtype(dtype)} ({length if length is not None else 'N'},)"
        raise CorruptDataError(
            f"{str(file)!r} holds {mapped.dtype} {mapped.shape}, expected {expected}. "
            f"Run 'fastdata verify {file.parent}' or convert the source again."
        )
    return np.array(mapped)
