"""The ``tar`` checks of ``fastdata verify``: the shard index agrees with the manifest, and every
shard holds exactly the members the index lists, at their offsets (an extra member, e.g.
``x.pyd`` or ``../evil.png``, is reported, never read)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fastdata.errors import FastdataError, ManifestError
from fastdata.fields import Schema
from fastdata.formats.tar.index import FIELD_PREFIX, load_index
from fastdata.fields.codecs import member_key_problem
from fastdata.formats.tar.layout import BLOCK, INDEX_NAME, padded
from fastdata.manifest import CHECKSUM_ALGORITHM

_SHOWN_PER_SHARD = 5


def verify_shards(path: Path, manifest: dict[str, Any], *, deep: bool = False) -> list[str]:
    """The ``tar`` checks of ``fastdata verify``: the shard index agrees with the manifest, and
    every shard holds exactly the members the index lists, at their offsets (an extra member,
    e.g. ``x.pyd`` or ``../evil.png``, is reported, never read). ``deep`` also compares each
    ``.cls`` member with the index's label."""
    try:
        index = load_index(path)
        document = json.loads((path / INDEX_NAME).read_text(encoding="utf-8"))
    except (ManifestError, OSError, ValueError) as exc:
        return [str(exc)]
    origin = repr(str(path / INDEX_NAME))
    problems = []
    if len(index.labels) != manifest["count"]:
        problems.append(f"{origin}: lists {len(index.labels)} samples but the manifest says {manifest['count']}.")
    listed = {name: entry for name, entry in manifest["files"].items() if name != INDEX_NAME}
    if list(listed) != index.files:
        problems.append(f"{origin}: lists shards {index.files} but the manifest lists {list(listed)}.")
    starts = index.starts
    for number, shard in enumerate(document["shards"]):
        entry = listed.get(shard["file"], {})
        if (entry.get("bytes"), entry.get(CHECKSUM_ALGORITHM)) != (shard["bytes"], shard.get(CHECKSUM_ALGORITHM)):
            problems.append(f"{origin}: size or checksum of {shard['file']!r} differs from the manifest's.")
        file = path / shard["file"]
        unsafe = [(row, problem) for row, key in enumerate(shard.get("key") or ())
                  if (problem := member_key_problem(key)) is not None]
        problems += [f"{origin}: shard {number} sample {row} has member key {shard['key'][row]!r}: {problem}."
                     for row, problem in unsafe[:_SHOWN_PER_SHARD]]
        if file.is_file() and file.stat().st_size == shard["bytes"]:
            expected = _expected_members(shard, int(starts[number]), document["key_width"], _suffixes(manifest))
            problems += _check_members(file, expected, deep=deep)[:_SHOWN_PER_SHARD]
    return problems


def _suffixes(manifest: dict[str, Any]) -> dict[str, str]:
    """Extra field -> its members' name after ``<key>.`` (docs/fields.md)."""
    if "fields" not in manifest:
        return {}
    try:
        schema = Schema.from_json(manifest["fields"])
    except (FastdataError, TypeError, ValueError):
        return {}
    return {f.name: f.member_suffix() for f in schema.extras}


def _expected_members(shard: dict[str, Any], first: int, key_width: int,
                      suffixes: dict[str, str] | None = None) -> dict[int, tuple[str, int, int | None]]:
    """Header offset -> (member name, data size, label for ``.cls`` members) the index implies."""
    expected: dict[int, tuple[str, int, int | None]] = {}
    keys = shard.get("key")  # the samples' own keys name the members (load_index checked the column)
    for row in range(shard["count"]):
        key = keys[row] if keys is not None else f"{first + row:0{key_width}d}"
        expected[shard["image_offset"][row] - BLOCK] = (f"{key}.{shard['extension'][row]}", shard["image_size"][row], None)
        if "cls_offset" in shard:  # samples without a label have no .cls member
            expected[shard["cls_offset"][row] - BLOCK] = (f"{key}.cls", shard["cls_size"][row], shard["label"][row])
        for name, suffix in (suffixes or {}).items():
            offsets, sizes = shard.get(f"{FIELD_PREFIX}{name}:offset"), shard.get(f"{FIELD_PREFIX}{name}:size")
            if offsets is not None and sizes is not None:
                expected[offsets[row] - BLOCK] = (f"{key}.{suffix}", sizes[row], None)
    expected[shard["bytes"] - 2 * BLOCK] = ("", 0, None)  # the end-of-archive blocks
    return expected


def _check_members(file: Path, expected: dict[int, tuple[str, int, int | None]], *, deep: bool) -> list[str]:
    """Walk the shard's ustar headers (names are compared as text, never used as paths)."""
    problems, offset, size = [], 0, file.stat().st_size
    descriptor = os.open(file, os.O_RDONLY)
    try:
        while offset < size:
            header = os.pread(descriptor, BLOCK, offset)
            name, length = _parse_header(header)
            want = expected.pop(offset, None)
            if name is None:
                member = f" (member {want[0]!r})" if want and want[0] else ""
                problems.append(f"{str(file)!r}: damaged tar header at byte {offset}{member}; the rest of the "
                                "shard was not walked.")
                return problems
            if not name and not length:  # end of archive
                if want is None or want[0] or header.count(0) != BLOCK:
                    problems.append(f"{str(file)!r}: archive ends at byte {offset}, not where the index says.")
                break
            if want is None or (name, length) != want[:2]:
                problems.append(f"{str(file)!r}: member {name!r} ({length} bytes) at byte {offset} is not in the index.")
            elif deep and want[2] is not None:
                text = os.pread(descriptor, length, offset + BLOCK)
                if text.strip() != str(want[2]).encode("ascii"):
                    problems.append(f"{str(file)!r}: member {name!r} holds label {text[:20]!r}, the index says {want[2]}.")
            offset += BLOCK + padded(length)
    finally:
        os.close(descriptor)
    for where, (name, _, _) in sorted(expected.items()):
        problems.append(f"{str(file)!r}: member {name or 'end of archive'!r} expected at byte {where} is missing.")
    return problems


def _parse_header(header: bytes) -> tuple[str | None, int]:
    """(name, size) of a ustar header; ("", 0) for a zero block; (None, 0) when it is damaged."""
    if len(header) < BLOCK:
        return None, 0
    if not any(header):
        return "", 0
    try:
        recorded = int(header[148:156].strip(b" \x00") or b"0", 8)
        size = int(header[124:136].strip(b" \x00") or b"0", 8)
    except ValueError:
        return None, 0
    if recorded != sum(header[:148]) + 8 * 32 + sum(header[156:]):
        return None, 0
    return header[:100].rstrip(b"\x00").decode("utf-8", "replace"), size
