"""The shard index of a ``tar`` dataset (``index.json``), checked before anything is read.

The index records, per shard, its file name, sample count, size and checksum, and per sample
the label, the image member's extension and the data offset and size of both members
(``<key>.<ext>`` and ``<key>.cls``; samples without a label have no ``.cls`` member, and their
shards no ``cls_offset``/``cls_size`` columns) and of each field's member; where the samples' own keys
name the members (a WebDataset source's ``__key__``), a ``key`` column holds them. Readers read members at those offsets, so every value is
checked first: shard names must be plain file names in the dataset directory, every number must
be an integer that fits the shard size the index records, the members must lie inside the shard in tar layout, and each shard file's real size must equal
the recorded one when it is opened (so a damaged shard fails alone, with its name). A damaged or crafted index is a
:class:`~fastdata.errors.CorruptManifestError` naming the field, never another exception, a huge
allocation, or a read outside the dataset.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastdata.errors import CorruptDataError, CorruptManifestError
from fastdata.fields.codecs import MEMBER_NAME_BYTES
from fastdata.formats.tar.layout import BLOCK, INDEX_NAME, padded
from fastdata.manifest import is_plain_name

SAMPLE_COLUMNS = ("label", "image_offset", "image_size")
LABEL_COLUMNS = ("cls_offset", "cls_size")  # the .cls member's: only where samples have a label
FIELD_PREFIX = "field:"


def field_columns(names: tuple[str, ...] | list[str]) -> list[str]:
    """The index columns of extra fields' members (docs/fields.md): ``field:<name>:offset``
    and ``field:<name>:size`` per field, after the image and ``.cls`` members."""
    return [f"{FIELD_PREFIX}{name}:{part}" for name in names for part in ("offset", "size")]
_EXTENSION = re.compile(r"[A-Za-z0-9]{1,16}")
_INT64_MAX = np.iinfo(np.int64).max


@dataclass
class ShardIndex:
    """``index.json`` as numpy arrays (per shard, and per sample in global order)."""

    files: list[str]
    counts: np.ndarray  # (S,) samples per shard
    sizes: np.ndarray  # (S,) bytes per shard file
    labels: np.ndarray  # (N,) int64
    shard_of: np.ndarray  # (N,) int64
    image_offset: np.ndarray  # (N,) byte offset of the image member's data
    image_size: np.ndarray
    sample_end: np.ndarray  # (N,) byte offset just after the sample's last member
    extensions: np.ndarray  # (N,) the image member's extension, fixed-width str (no Python object per sample)
    key_width: int
    fields: dict[str, tuple[np.ndarray, np.ndarray]] = None  # extra field -> (N,) data offsets, sizes
    keys: np.ndarray | None = None  # (N,) ASCII bytes: the member keys where samples' own keys name them


    @property
    def starts(self) -> np.ndarray:
        """Global index of each shard's first sample."""
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)


class _Checker:
    """Builds :class:`CorruptManifestError` messages that name the index file and the field."""

    def __init__(self, file: Path):
        self.file = file

    def error(self, what: str) -> CorruptManifestError:
        return CorruptManifestError(
            f"{str(self.file)!r}: {what}. The shard index is damaged or was not written by fastdata; "
            f"run 'fastdata verify {self.file.parent}' or convert the source again."
        )

    def integer(self, value: Any, name: str, low: int = 0, high: int = _INT64_MAX) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.error(f"{name} is {value!r}; expected an integer from {low} to {high}")
        return value

    def column(self, shard: dict[str, Any], name: str, count: int, number: int) -> np.ndarray:
        values = shard.get(name)
        if not isinstance(values, list):
            raise self.error(f"shard {number} {name!r} is {str(values)[:40]!r}; expected a list of {count} integers")
        if len(values) != count:
            raise self.error(f"shard {number} has {len(values)} {name!r} values for {count} samples")
        if not values:
            return np.empty(0, dtype=np.int64)
        try:
            array = np.asarray(values)
        except (ValueError, OverflowError, TypeError):
            array = np.asarray([], dtype=object)
        if array.dtype.kind not in "iu" or array.ndim != 1 or (array.dtype.kind == "u" and array.max() > _INT64_MAX):
            bad = next((v for v in values if isinstance(v, bool) or not isinstance(v, int) or abs(v) > _INT64_MAX), values[0])
            raise self.error(f"shard {number} has {name!r} value {bad!r}; expected integers")
        return array.astype(np.int64)


def load_index(directory: Path) -> ShardIndex:
    """Read and check ``index.json`` against the shard files beside it."""
    file = directory / INDEX_NAME
    check = _Checker(file)
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CorruptManifestError(f"{str(file)!r}: the shard index is missing. Convert the source again.") from exc
    except (OSError, ValueError) as exc:
        raise check.error(f"cannot read the shard index ({type(exc).__name__}: {exc})") from exc
    if not isinstance(document, dict) or not isinstance(document.get("shards"), list):
        raise check.error("it holds no list of 'shards'")
    key_width = check.integer(document.get("key_width"), "'key_width'", 1, 20)
    files, counts, sizes, columns, extensions = [], [], [], {name: [] for name in SAMPLE_COLUMNS}, []
    labelled = True
    field_keys: list[str] = []
    keys: list[str] | None = [] if document["shards"] and isinstance(document["shards"][0], dict) and \
        "key" in document["shards"][0] else None
    for number, shard in enumerate(document["shards"]):
        if not isinstance(shard, dict):
            raise check.error(f"shard {number} is {type(shard).__name__}, not a record")
        name = shard.get("file")
        if not is_plain_name(name):
            raise check.error(f"shard {number} names file {name!r}; a shard must be a plain file name inside "
                              "the dataset directory")
        # checked against the real file when the shard is opened (open_shard), before any read
        size = check.integer(shard.get("bytes"), f"shard {number} 'bytes'", 2 * BLOCK, 2**62)
        count = check.integer(shard.get("count"), f"shard {number} 'count'", 0, size // (2 * BLOCK))
        if number == 0:
            labelled = LABEL_COLUMNS[0] in shard
        elif (LABEL_COLUMNS[0] in shard) != labelled:
            raise check.error(f"shard {number} {'lacks' if labelled else 'has'} the .cls columns shard 0 "
                              f"{'has' if labelled else 'lacks'}")
        shard_columns = {column: check.column(shard, column, count, number)
                         for column in SAMPLE_COLUMNS + (LABEL_COLUMNS if labelled else ())}
        extra_names = sorted(key for key in shard if isinstance(key, str) and key.startswith(FIELD_PREFIX))
        if number == 0:
            field_keys = extra_names
        elif extra_names != field_keys:
            raise check.error(f"shard {number} lists field columns {extra_names}, shard 0 {field_keys}")
        for column in extra_names:
            shard_columns[column] = check.column(shard, column, count, number)
        if (keys is not None) != ("key" in shard):
            raise check.error(f"shard {number} {'lacks' if keys is not None else 'has'} the 'key' column shard 0 "
                              f"{'has' if keys is not None else 'lacks'}")
        if keys is not None:
            keys += _member_keys(check, shard["key"], count, number)
        exts = shard.get("extension")
        if not isinstance(exts, list) or len(exts) != count or not all(
                isinstance(e, str) and _EXTENSION.fullmatch(e) for e in exts):
            raise check.error(f"shard {number} has invalid 'extension' values (expected {count} short names)")
        _check_layout(check, shard_columns, size, number)
        files.append(name)
        counts.append(count)
        sizes.append(size)
        extensions += exts
        for column, values in shard_columns.items():
            columns.setdefault(column, []).append(values)
    if len(set(files)) != len(files):
        raise check.error("a shard file is listed twice")
    counts_array = np.asarray(counts, dtype=np.int64)
    merged = {name: np.concatenate(parts) if parts else np.empty(0, np.int64) for name, parts in columns.items()}
    if "count" in document and document["count"] != int(counts_array.sum()):
        raise check.error(f"'count' is {document['count']!r} but the shards hold {int(counts_array.sum())} samples")
    sample_end = merged["cls_offset"] + padded(merged["cls_size"]) if labelled else \
        merged["image_offset"] + padded(merged["image_size"])
    fields = {}
    for column in field_keys:
        name, _, part = column[len(FIELD_PREFIX):].rpartition(":")
        if part == "offset":
            offsets, sizes_ = merged[column], merged[f"{FIELD_PREFIX}{name}:size"]
            fields[name] = (offsets, sizes_)
            sample_end = np.maximum(sample_end, offsets + padded(sizes_))
    return ShardIndex(
        files=files,
        counts=counts_array,
        sizes=np.asarray(sizes, dtype=np.int64),
        labels=merged["label"],
        shard_of=np.repeat(np.arange(len(files), dtype=np.int64), counts_array),
        image_offset=merged["image_offset"],
        image_size=merged["image_size"],
        sample_end=sample_end,
        # one numpy array, not a list of N str: the reader is pickled into every worker, and a
        # Python object per sample there costs each worker memory in proportion to the samples
        extensions=np.asarray(extensions, dtype=f"<U{max(map(len, extensions), default=1)}"),
        key_width=key_width,
        fields=fields,
        keys=None if keys is None else np.asarray(keys, dtype=f"S{max(map(len, keys), default=1)}"),
    )


def _member_keys(check: _Checker, keys: Any, count: int, number: int) -> list[str]:
    """A shard's ``key`` column: ``count`` ASCII names (compared as text by ``verify``, never used as paths)."""
    if not isinstance(keys, list) or len(keys) != count or not all(
            isinstance(key, str) and key and key.isascii() and len(key) <= MEMBER_NAME_BYTES for key in keys):
        raise check.error(f"shard {number} has invalid 'key' values (expected {count} ASCII member keys)")
    return keys


def _check_layout(check: _Checker, columns: dict[str, np.ndarray], size: int, number: int) -> None:
    """Every listed member must lie inside the shard, after a header block, in order and without
    overlap: image then label (where samples have one), one sample after another, before the
    end-of-archive blocks. (Members the index does not list may sit between them; ``fastdata
    verify`` reports those.)"""
    members = [("image", columns["image_offset"], columns["image_size"])]
    if LABEL_COLUMNS[0] in columns:
        members.append(("cls", columns["cls_offset"], columns["cls_size"]))
    if not len(members[0][1]):
        return
    for name, offsets, sizes in members:
        for column, values in ((f"{name}_size", sizes), (f"{name}_offset", offsets)):
            bad = np.flatnonzero((values < 0) | (values > size))
            if len(bad):
                raise check.error(f"shard {number} sample {int(bad[0])}: {column!r} {int(values[bad[0]])} does not fit "
                                  f"a {size}-byte shard")
    _, last_offset, last_size = members[-1]
    sample_end = last_offset + padded(last_size)
    earliest = np.concatenate([[BLOCK], sample_end[:-1] + BLOCK])  # the image: after the sample before it
    for name, found, found_size in members:
        bad = np.flatnonzero((found < earliest) | (found % BLOCK != 0))
        if len(bad):
            raise check.error(f"shard {number} sample {int(bad[0])}: '{name}_offset' is {int(found[bad[0]])}, which "
                              f"overlaps the member before it or is not on a {BLOCK}-byte block (expected "
                              f"{int(earliest[bad[0]])} or later)")
        earliest = found + padded(found_size) + BLOCK
    for column in [c for c in columns if c.startswith(FIELD_PREFIX) and c.endswith(":offset")]:
        offsets, sizes = columns[column], columns[column[: -len("offset")] + "size"]
        bad = np.flatnonzero((offsets < last_offset + padded(last_size) + BLOCK) | (offsets % BLOCK != 0)
                             | (sizes < 0) | (offsets + padded(sizes) + 2 * BLOCK > size))
        if len(bad):
            raise check.error(f"shard {number} sample {int(bad[0])}: {column!r} {int(offsets[bad[0]])} is not a member "
                              f"after the sample's {members[-1][0]} member inside the {size}-byte shard")
        sample_end = np.maximum(sample_end, offsets + padded(sizes))
    if int(sample_end[-1]) + 2 * BLOCK > size:
        raise check.error(f"shard {number}: its last member ends at byte {int(sample_end[-1])}, past the end of "
                          f"the {size}-byte shard's archive")


def open_shard(path: Path, index: ShardIndex, shard: int) -> int:
    """Open one shard read-only, refusing a file whose size differs from the index."""
    file = path / index.files[shard]
    try:
        descriptor = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if file.is_symlink():
            raise CorruptDataError(f"{str(file)!r} is a symbolic link; fastdata reads only files stored inside the "
                                   "dataset directory.") from exc
        raise CorruptDataError(f"{str(file)!r}: cannot open shard ({exc.strerror}). Convert the source again.") from exc
    size = os.fstat(descriptor).st_size
    if size != index.sizes[shard]:
        os.close(descriptor)
        raise CorruptDataError(
            f"{str(file)!r}: shard is {size} bytes but the index says {int(index.sizes[shard])} "
            f"({'truncated' if size < index.sizes[shard] else 'damaged'}). "
            f"Run 'fastdata verify {path}' or convert the source again."
        )
    return descriptor


def read_exact(descriptor: int, size: int, offset: int, file: Path | Callable[[], Path]) -> bytes:
    """``size`` bytes at ``offset``; ``file`` (or a callable giving it, built only on failure) names
    the shard in the error."""
    data = os.pread(descriptor, size, offset)
    if len(data) != size:
        file = file() if callable(file) else file
        raise CorruptDataError(
            f"{str(file)!r}: shard ends at byte {offset + len(data)}, expected data up to {offset + size} "
            f"(truncated). Run 'fastdata verify {file.parent}' or convert the source again."
        )
    return data
