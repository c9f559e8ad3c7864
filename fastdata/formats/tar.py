"""The ``tar`` format: WebDataset-compatible shards plus a JSON shard index.

A directory holding ``shard-000000.tar``, ``shard-000001.tar``, ... (bounded by
``shard_samples`` and ``shard_bytes``), ``index.json`` and ``manifest.json``. Sample ``i`` is the
members ``<key>.<ext>`` (the image: original bytes ``.jpg``/``.png``/... for ``--store encoded``,
a uint8 HWC ``.npy`` for ``--store raw``) and ``<key>.cls`` (the label as decimal text), where
``key`` is ``i`` zero-padded to ``key_width`` digits. Every member is one 512-byte ustar header
(mode 0644, uid/gid 0, mtime 0) and its data padded to 512 bytes; a shard ends with two zero
blocks. The same input gives byte-identical shards and index. Stock ``webdataset.WebDataset``
and GNU tar read the shards; the index records, per sample, the data offset and size of both
members, which the readers (``tar_reader.py``) use to read without parsing tar streams.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.errors import InvalidOptionError
from fastdata.formats import FormatSpec, register
from fastdata.formats.tar_reader import (
    BLOCK,
    FORMAT,
    INDEX_NAME,
    LAYOUT_VERSION,
    ShardSplitWarning,
    TarDataset,
    TarIndexedDataset,
    padded,
    verify_shards,
)
from fastdata.images import sniff_extension
from fastdata.manifest import CHECKSUM_ALGORITHM, describe_file, write_manifest
from fastdata.plan import Batch, Plan, Writer

__all__ = ["TarDataset", "TarIndexedDataset", "TarOptions", "TarWriter", "ShardSplitWarning", "parse_bytes"]

SHARD_PATTERN = "shard-{:06d}.tar"
TRAILER = bytes(2 * BLOCK)
RECORD_SUFFIX = ".record.json"  # a finished shard's index record, until the index is written
_ZEROS = bytes(BLOCK)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: Any) -> int:
    """``"256MB"`` -> 256_000_000, ``"1GiB"`` -> 2**30, ``"4096"`` or 4096 -> 4096."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else None
        if unit not in _UNITS:
            raise InvalidOptionError(
                f"Invalid size {value!r}. Use bytes or a number with kB, MB, GB, KiB, MiB or GiB (e.g. '256MB')."
            )
        number = int(float(match.group(1)) * _UNITS[unit])
    if number <= 0:
        raise InvalidOptionError(f"Invalid size {value!r}. Use a positive size such as '256MB'.")
    return number


def parse_count(value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number <= 0 or isinstance(value, bool):
        raise InvalidOptionError(f"Invalid --shard-samples {value!r}. Use a positive integer.")
    return number


@dataclass(frozen=True)
class TarOptions:
    """Shard bounds: a shard closes before it would exceed either (a lone sample may exceed
    ``shard_bytes``, since samples are never split)."""

    shard_samples: int = field(
        default=1000, metadata={"help": "tar: most samples per shard (default 1000)", "parse": parse_count}
    )
    shard_bytes: int = field(
        default=256 * 10**6,
        metadata={"help": "tar: most bytes per shard file, e.g. 256MB, 1GiB (default 256MB)", "parse": parse_bytes},
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_samples", parse_count(self.shard_samples))
        object.__setattr__(self, "shard_bytes", parse_bytes(self.shard_bytes))


def _header_template() -> bytearray:
    block = bytearray(BLOCK)
    block[100:108] = b"0000644\x00"  # mode
    block[108:116] = b"0000000\x00"  # uid
    block[116:124] = b"0000000\x00"  # gid
    block[136:148] = b"00000000000\x00"  # mtime
    block[148:156] = b" " * 8  # checksum placeholder
    block[156:157] = b"0"  # regular file
    block[257:265] = b"ustar\x0000"
    return block


_TEMPLATE = bytes(_header_template())
_TEMPLATE_SUM = sum(_TEMPLATE)


def member_header(name: str, size: int) -> bytes:
    """The ustar header ``tarfile`` writes for a regular file with fixed metadata."""
    encoded = name.encode("ascii")
    if len(encoded) > 100 or size >= 8**11:
        raise InvalidOptionError(f"tar member {name!r} of {size} bytes does not fit a ustar header.")
    size_field = b"%011o\x00" % size
    checksum = _TEMPLATE_SUM + sum(encoded) + sum(size_field)
    return b"".join((
        encoded.ljust(100, b"\x00"), _TEMPLATE[100:124], size_field, _TEMPLATE[136:148],
        b"%06o\x00" % checksum, _TEMPLATE[155:],
    ))


def _npy_header(shape: tuple[int, ...]) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "|u1", "fortran_order": False, "shape": tuple(shape)})
    return buffer.getvalue()


class _ShardFile:
    """One shard being written under a temporary name; :meth:`finish` renames it into place."""

    def __init__(self, directory: Path, number: int, first: int):
        self.name = SHARD_PATTERN.format(number)
        self.final = directory / self.name
        self.temporary = directory / (self.name + ".partial")
        self.handle = open(self.temporary, "wb", buffering=1024 * 1024)
        self.digest = hashlib.blake2b(digest_size=32)
        self.first = first
        self.position = 0
        self.columns: dict[str, list] = {k: [] for k in ("label", "extension", "image_offset", "image_size", "cls_offset", "cls_size")}

    @property
    def count(self) -> int:
        return len(self.columns["label"])

    def _write(self, data: bytes | memoryview) -> None:
        self.handle.write(data)
        self.digest.update(data)
        self.position += len(data)

    def _member(self, name: str, parts: list[bytes | memoryview], out: list[bytes | memoryview]) -> tuple[int, int]:
        size = sum(len(part) for part in parts)
        out.append(member_header(name, size))
        offset = self.position + sum(len(chunk) for chunk in out)
        out.extend(parts)
        out.append(_ZEROS[: padded(size) - size])
        return offset, size

    def add(self, key: str, extension: str, parts: list[bytes | memoryview], label: int) -> None:
        out: list[bytes | memoryview] = []
        image_offset, image_size = self._member(f"{key}.{extension}", parts, out)
        cls_offset, cls_size = self._member(f"{key}.cls", [str(label).encode("ascii")], out)
        self._write(b"".join(out))
        for name, value in zip(self.columns, (label, extension, image_offset, image_size, cls_offset, cls_size)):
            self.columns[name].append(value)

    def finish(self) -> dict[str, Any]:
        self._write(TRAILER)
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        record = {"file": self.name, "count": self.count, "first": self.first, "bytes": self.position,
                  CHECKSUM_ALGORITHM: self.digest.hexdigest(), **self.columns}
        # the shard's index record, kept beside it until the index is written (for --resume)
        self.final.with_name(self.name + RECORD_SUFFIX).write_text(json.dumps(record))
        os.replace(self.temporary, self.final)
        return record

    def checkpoint(self) -> dict[str, Any]:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        return {"first": self.first, "position": self.position, "columns": self.columns}

    @classmethod
    def reopen(cls, directory: Path, number: int, state: dict[str, Any]) -> "_ShardFile":
        """Continue a shard at a checkpoint: cut what came after it, re-hash what came before."""
        shard = cls.__new__(cls)
        shard.name = SHARD_PATTERN.format(number)
        shard.final = directory / shard.name
        shard.temporary = directory / (shard.name + ".partial")
        if not shard.temporary.exists() and shard.final.exists():
            os.replace(shard.final, shard.temporary)  # it was finished after the checkpoint
        shard.handle = open(shard.temporary, "r+b", buffering=1024 * 1024)
        shard.handle.truncate(state["position"])
        shard.digest = hashlib.blake2b(digest_size=32)
        for block in iter(lambda: shard.handle.read(1024 * 1024), b""):
            shard.digest.update(block)
        shard.first, shard.position, shard.columns = state["first"], state["position"], state["columns"]
        return shard


class TarWriter(Writer):
    """Streams samples into size-bounded shards; a background thread finishes (fsyncs and
    renames) each full shard while the next one is written; the index is written last."""

    supports_resume = True

    def __init__(self, path: Path, plan: Plan, options: TarOptions | None, *, state: dict[str, Any] | None = None):
        super().__init__(path, plan, options or TarOptions())
        if state is None:
            path.mkdir(parents=True)
        self.key_width = max(9, len(str(max(plan.count - 1, 0))))
        self.npy_header = _npy_header(plan.shape) if plan.store == "raw" else b""
        self.written = state["written"] if state else 0
        self.shard: _ShardFile | None = None
        self.finished: list[Future] = []
        self.finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastdata-tar")
        if state:
            for number in range(state["shards"]):
                done: Future = Future()
                done.set_result(json.loads((path / (SHARD_PATTERN.format(number) + RECORD_SUFFIX)).read_text()))
                self.finished.append(done)
            if state["current"] is not None:
                self.shard = _ShardFile.reopen(path, state["shards"], state["current"])

    @classmethod
    def resume(cls, path: Path, plan: Plan, options: TarOptions | None, state: dict[str, Any]) -> "TarWriter":
        return cls(path, plan, options, state=state)

    def checkpoint(self) -> dict[str, Any]:
        """Finished shards are durable (their records lie beside them); the open one is fsynced."""
        for future in self.finished:
            future.result()
        current = self.shard.checkpoint() if self.shard is not None else None
        return {"written": self.written, "shards": len(self.finished), "current": current}

    def _sample_bytes(self, payload_size: int) -> int:
        return BLOCK + padded(payload_size) + 2 * BLOCK  # image member + .cls member

    def _shard_for(self, payload_size: int) -> _ShardFile:
        shard, options = self.shard, self.options
        if shard is not None and shard.count and (
            shard.count >= options.shard_samples
            or shard.position + self._sample_bytes(payload_size) + len(TRAILER) > options.shard_bytes
        ):
            self.finished.append(self.finisher.submit(shard.finish))
            shard = None
        if shard is None:
            shard = self.shard = _ShardFile(self.path, len(self.finished), self.written)
        return shard

    def write(self, batch: Batch) -> None:
        for row in range(len(batch)):
            if self.plan.store == "raw":
                image = np.ascontiguousarray(batch.images[row])
                parts, extension = [self.npy_header, memoryview(image).cast("B")], "npy"
            else:
                blob = batch.blobs[row]
                parts, extension = [blob], sniff_extension(blob)
            size = sum(len(part) for part in parts)
            key = f"{self.written:0{self.key_width}d}"
            self._shard_for(size).add(key, extension, parts, int(batch.labels[row]))
            self.written += 1

    def close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.shard is not None:
            self.finished.append(self.finisher.submit(self.shard.finish))
            self.shard = None
        shards = [future.result() for future in self.finished]
        self.finisher.shutdown()
        for shard in shards:
            (self.path / (shard["file"] + RECORD_SUFFIX)).unlink()
        index = {"format": "fastdata-tar-index", "layout_version": LAYOUT_VERSION, "count": self.written,
                 "key_width": self.key_width, "shards": shards}
        with open(self.path / INDEX_NAME, "w", encoding="utf-8") as handle:
            json.dump(index, handle, separators=(",", ":"))
            handle.flush()
            os.fsync(handle.fileno())
        files = {s["file"]: {"bytes": s["bytes"], CHECKSUM_ALGORITHM: s[CHECKSUM_ALGORITHM]} for s in shards}
        files[INDEX_NAME] = describe_file(self.path / INDEX_NAME)
        manifest["files"] = files
        manifest["tar"] = {"index": INDEX_NAME, "shards": len(shards), "key_width": self.key_width,
                           "counts": [s["count"] for s in shards]}
        write_manifest(self.path, manifest)
        return manifest

    def abort(self) -> None:
        if self.shard is not None:
            self.shard.handle.close()
        self.finisher.shutdown(wait=True, cancel_futures=True)


register(
    FormatSpec(
        name=FORMAT,
        dataset=TarDataset,
        writer=TarWriter,
        layout_version=LAYOUT_VERSION,
        options=TarOptions,
        verify=verify_shards,
        map_reader=TarIndexedDataset,
        description="WebDataset-compatible tar shards with a JSON shard index",
    )
)
